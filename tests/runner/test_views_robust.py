"""The views read report folders they did not write and print output others parse: a folder
they cannot read is skipped with a warning, the JSON is JSON, the JUnit is XML, a gate's plot
label is text, and ``status`` reads no artifact."""

from __future__ import annotations

import json
import math
import os
import shutil
import sys
import xml.etree.ElementTree as ET

import pytest

from runner.views.junit import junit_xml
from tests.runner.repo_fixtures import METRICS_OK, cli, default_phases, gate, make_repo, write
from tests.runner.run_samples import check_run, gate_result, results

VIEWS = (["status"], ["status", "--json"], ["history"], ["history", "--json"], ["report"])


def _no_constants(name: str) -> float:
    raise ValueError(f"{name} is not JSON")


def strict_json(text: str) -> object:
    return json.loads(text, parse_constant=_no_constants)


def test_a_run_folder_whose_name_is_not_utf8_is_skipped(tmp_path, runner_env):
    repo = make_repo(tmp_path / "repo")
    good = check_run(repo.root, "20261201T000000Z-aaaaaaaa", "2026-12-01T00:00:00Z", 2.0)
    odd = os.fsencode(str(good.parent.parent)) + b"/run-\xff\xfe"
    shutil.copytree(good.parent, os.fsdecode(odd))
    for args in VIEWS:
        result = cli(runner_env, repo.root, *args)
        assert result.exit_code == 0, (args, result.text)
    assert "not printable UTF-8; skipped" in cli(runner_env, repo.root, "history").stdout
    assert "not printable UTF-8" in cli(runner_env, repo.root, "status").stderr


def test_a_run_copied_into_another_phase_is_skipped(tmp_path, runner_env):
    repo = make_repo(tmp_path / "repo")
    good = check_run(repo.root, "20261201T000000Z-aaaaaaaa", "2026-12-01T00:00:00Z", 2.0)
    shutil.copytree(good.parent, repo.root / "reports" / "demo" / "beta" / good.parent.name)
    for args in VIEWS:
        result = cli(runner_env, repo.root, *args)
        assert result.exit_code == 0, (args, result.text)
    assert "holds the results of phase alpha, not of beta" in cli(runner_env, repo.root, "history").stdout


def test_a_metric_name_with_a_control_character_gives_well_formed_junit():
    gates = [gate_result("check", metrics={"note\u0001": "x\u0002y", "ok": 1.0}, reason="bad \u0003 reason",
                         outcome="FAIL")]
    document = junit_xml(results(run_id="20261201T000000Z-00000001", created="2026-12-01T00:00:00Z", gates=gates))
    properties = {p.get("name"): p.get("value") for p in ET.fromstring(document).iter("property")}
    assert properties["note"] == "x\\x02y" and properties["ok"] == "1"  # stripped from names, escaped in values


def test_nan_and_infinite_metrics_give_json(tmp_path, runner_env):
    phases = default_phases()
    phases[0]["gates"] = [gate("check", "verify", """printf '{"speedup": NaN, "errors": Infinity}' > "$RUNNER_METRICS" """,
                               expect={"speedup": ">= 1.5", "errors": "== 0"})]
    repo = make_repo(tmp_path / "repo", phases)
    assert cli(runner_env, repo.root, "advance").exit_code == 1
    status = strict_json(cli(runner_env, repo.root, "status", "--json").stdout)
    assert status["phases"][0]["headline"] == {"speedup": "NaN", "errors": "Infinity"}
    history = strict_json(cli(runner_env, repo.root, "history", "--json").stdout)
    assert history["runs"][0]["headline"]["speedup"] == "NaN"


def test_a_plot_label_with_dollar_signs_is_drawn_as_text(tmp_path, runner_env):
    script = (
        "from runner import gatekit\n"
        "gatekit.write_metrics({'speedup': 2.0})\n"
        "gatekit.write_plot('p', [gatekit.Series('x $\\\\mus$ $', [(1, 2.0), (2, 3.0)])], title='t $\\\\alpha',"
        " x=gatekit.Axis('context ($\\\\mus$)'), y=gatekit.Axis('$y$', unit='$'))\n"
    )
    phases = default_phases()
    phases[0]["gates"] = [gate("check", "verify", f"{sys.executable} tools/plot.py", expect={"speedup": ">= 1.5"})]
    repo = make_repo(tmp_path / "repo", phases)
    write(repo.root, "tools/plot.py", script)
    repo.git("add", "-A")
    repo.git("commit", "-qm", "plot gate")
    assert cli(runner_env, repo.root, "advance").exit_code == 0
    result = cli(runner_env, repo.root, "report")
    assert result.exit_code == 0, result.text
    html = (repo.root / "reports" / "index.html").read_text()
    assert "context ($\\mus$)" in html and "could not be drawn" not in html


def test_status_reads_no_artifact(tmp_path, runner_env):
    """Each run keeps its artifacts in files of their own; status opens none of them (an audit
    hook sees every file the process opens)."""
    writes = "; ".join(f'head -c 4096 /dev/zero | tr "\\0" x > "$RUNNER_ARTIFACTS/a{i}.txt"' for i in range(5))
    phases = default_phases()
    phases[0]["gates"] = [gate("check", "verify", f"{METRICS_OK}; {writes}; exit 1")]
    repo = make_repo(tmp_path / "repo", phases)
    for _ in range(3):
        assert cli(runner_env, repo.root, "advance").exit_code == 1
    artifacts = list((repo.root / "reports").rglob("artifacts/check/a*.txt"))
    assert len(artifacts) == 15
    for results_file in (repo.root / "reports").rglob("results.json"):
        assert results_file.stat().st_size < 16384  # the artifacts' text is not repeated there
    opened: list[str] = []
    watching = [True]

    def audit(event, args):
        if watching[0] and event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
            opened.append(os.fsdecode(args[0]))

    sys.addaudithook(audit)
    try:
        result = cli(runner_env, repo.root, "status")
    finally:
        watching[0] = False
    assert result.exit_code == 0, result.text
    assert any(path.endswith("results.json") for path in opened)
    assert not [path for path in opened if "/artifacts/" in path]


@pytest.mark.parametrize("value", [math.nan, math.inf])
def test_diff_json_of_non_finite_values_is_json(tmp_path, runner_env, value):
    repo = make_repo(tmp_path / "repo")
    check_run(repo.root, "20261201T000000Z-aaaaaaaa", "2026-12-01T00:00:00Z", 2.0)
    check_run(repo.root, "20261202T000000Z-bbbbbbbb", "2026-12-02T00:00:00Z", value)
    result = cli(runner_env, repo.root, "diff", "20261201T000000Z-aaaaaaaa", "20261202T000000Z-bbbbbbbb", "--json")
    data = strict_json(result.stdout)
    [row] = [row for row in data["metrics"] if row["metric"] == "speedup"]
    assert row["new"] in ("NaN", "Infinity")
