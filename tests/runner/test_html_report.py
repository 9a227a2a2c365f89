"""``runner report``: the plan's HTML page, its plots, and every template rendered on the real
H200 kernel run of the sample project (``tests/runner/data/sample/``); the page is opened in
headless chromium."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from runner.records.results import ResultsFile
from runner.records.run_folder import ReportContext, render_report
from runner.views.html import render_html_report, write_html_report
from runner.workspace import open_workspace
from tests.runner.repo_fixtures import (
    cli,
    make_repo,
    snapshot,
)
from tests.runner.run_samples import REAL_RESULTS, REAL_RUN, check_run, sample_workspace

CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]


@pytest.fixture(scope="module")
def shipped_page(tmp_path_factory) -> tuple[Path, str]:
    """The sample plan's page, written outside the tree (links then climb back into it)."""
    out = tmp_path_factory.mktemp("page") / "index.html"
    write_html_report(sample_workspace(), out)
    return out, out.read_text()


def test_shipped_plan_page(shipped_page):
    out, html = shipped_page
    assert '<table id="phases"' in html
    for phase in ("kernel", "backend", "cudagraph", "defrag"):
        assert f'id="phase-{phase}"' in html
    assert "20261130T001525Z-a7576174" in html and "NVIDIA H200" in html
    assert "min_frac_memory_64k" in html and "&gt;= 0.80" in html
    assert html.count("<svg") >= 4  # four headline metrics across runs
    assert "<script" not in html and 'src="http' not in html and "<link" not in html
    links = re.findall(r'href="([^"#][^"]*)"', html)
    assert links and all(not link.startswith(("http:", "https:", "/")) for link in links)
    for link in links:
        assert (out.parent / link).resolve().is_file(), link
    assert any(link.endswith(f"{REAL_RUN.name}/report.md") for link in links)
    # the timeline shows the headline metrics status shows: from the run, as there is no checkpoint
    timeline_row = re.search(r'<tr class="next">.*?</tr>', html, re.S).group(0)
    assert "min_speedup_64k=6.85" in timeline_row


def test_history_across_runs_and_checkpoint_links(tmp_path, runner_env):
    repo = make_repo(tmp_path / "repo")
    assert cli(runner_env, repo.root, "advance").exit_code == 0  # checkpoint demo/alpha
    check_run(repo.root, "20991201T000000Z-cccccccc", "2099-12-01T00:00:00Z", 1.2)
    before = snapshot(repo.root)
    result = cli(runner_env, repo.root, "report", "--out", "site/index.html")
    assert result.exit_code == 0, result.text
    html = (repo.root / "site" / "index.html").read_text()
    assert set(snapshot(repo.root)) - set(before) == {"site/index.html"}
    assert "<code>demo/alpha</code>" in html and repo.head()[:12] in html
    report = re.search(r'<a href="([^"]+)">report</a>', html).group(1)
    assert report.startswith("../reports/demo/alpha/") and (repo.root / "site" / report).is_file()
    assert "Latest of 2 run(s)" in html and "20991201T000000Z-cccccccc" in html
    assert "speedup across 2 run(s)" in html and "errors across 2 run(s)" in html
    assert "No run of this phase" in html  # beta


def test_report_defaults_to_reports_index(tmp_path, runner_env):
    repo = make_repo(tmp_path / "repo", git_init=False)
    result = cli(runner_env, repo.root, "report")
    assert result.exit_code == 0, result.text
    assert (repo.root / "reports" / "index.html").is_file()
    html = render_html_report(open_workspace(None, cwd=repo.root), repo.root / "x.html")
    assert "no run yet" in html and "<svg" not in html


def test_report_refuses_a_link_in_reports_leading_outside_but_writes_a_path_named_elsewhere(tmp_path, runner_env):
    repo = make_repo(tmp_path / "repo", git_init=False)
    outside = tmp_path / "outside"
    outside.mkdir()
    (repo.root / "reports").symlink_to(outside)
    refused = cli(runner_env, repo.root, "report")  # the default, reports/index.html
    assert refused.exit_code == 2, refused.text
    assert "outside the repository" in refused.stderr and "Traceback" not in refused.text
    assert list(outside.iterdir()) == []

    (repo.root / "reports").unlink()
    (repo.root / "reports").mkdir()
    (repo.root / "reports" / "site").symlink_to(outside)
    refused = cli(runner_env, repo.root, "report", "--out", "reports/site/index.html")
    assert refused.exit_code == 2, refused.text
    assert list(outside.iterdir()) == []

    (repo.root / "reports" / "inside").symlink_to(repo.root / "docs")  # a link within the repository
    assert cli(runner_env, repo.root, "report", "--out", "reports/inside/index.html").exit_code == 0
    assert (repo.root / "docs" / "index.html").is_file()
    (repo.root / "elsewhere").symlink_to(outside)  # not under reports/: the user's choice
    written = cli(runner_env, repo.root, "report", "--out", "elsewhere/index.html")
    assert written.exit_code == 0, written.text
    assert (outside / "index.html").is_file()


def test_run_report_markdown_on_the_real_run():
    ws = sample_workspace()
    results = ResultsFile.load(REAL_RESULTS)
    phase = ws.plan.phase("kernel")
    text = render_report(results, ReportContext(plan=ws.plan, phase=phase, outcome="FAIL"), run_dir=REAL_RUN)
    assert text.startswith("# mla-verify / kernel: FAIL")
    assert "| build | build | **FAIL** |" in text and "| benchmark | benchmark | **FAIL** |" in text
    assert "| min_speedup_64k | `>= 5` | 6.85 | yes |" in text
    assert "| spills | `== 0` | 176 | no: 176 is not == 0 |" in text
    assert results.machine.fingerprint in text and results.fingerprint in text and "NVIDIA H200" in text
    assert "<summary>log tail</summary>" in text
    assert "| min_frac_memory_64k | 0.2538 |" in text  # headline metrics


def find_chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def test_page_renders_in_headless_chromium(shipped_page, tmp_path):
    exe = find_chromium()
    if exe is None:
        message = "chromium is not installed (.ci/run installs it: apt-get install chromium)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message)
        pytest.skip(message)
    out, _ = shipped_page
    proc = subprocess.run(
        [exe, *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom", out.as_uri()],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    dom = proc.stdout
    assert re.search(r'<table id="phases"[^>]*>', dom), dom[:500]
    assert "<svg" in dom and "</svg>" in dom
    assert "kernel" in dom and "20261130T001525Z-a7576174" in dom


def test_sampled_headline_metrics_are_drawn_by_their_median(tmp_path, runner_env):
    from tests.runner.run_samples import gate_result, results, write_run

    repo = make_repo(tmp_path / "repo", git_init=False)
    for day, samples in ((1, [2.0, 2.5, 3.0]), (2, [3.0, 3.5, 4.0])):
        gates = [gate_result("build", "build"), gate_result("check", metrics={"speedup": samples, "errors": 0})]
        write_run(repo.root, results(run_id=f"2026120{day}T000000Z-aaaaaaaa", created=f"2026-12-0{day}T00:00:00Z",
                                     gates=gates))
    html = render_html_report(open_workspace(None, cwd=repo.root), repo.root / "x.html")
    assert "speedup across 2 run(s)" in html
    assert "3.5 (median of 3; too few for a 95% interval)" in html
