"""Bad plans through the command line: exit code 2 and one line naming file:line:col and the
fix; ``call:`` targets that do not exist are caught before the phase runs; and no mutation of
a sample plan makes ``load_plan`` raise anything but ``PlanError``."""

from __future__ import annotations

import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runner.errors import PlanError
from runner.plan.load import STATUS_END, load_plan
from tests.runner.plan_samples import MARKDOWN_PLAN, YAML_PLAN
from tests.runner.repo_fixtures import (
    cli,
    default_phases,
    gate,
    make_repo,
    plan_text,
    snapshot,
    write,
)

GOOD = plan_text(default_phases())


def _breaks(old: str, new: str) -> bytes:
    assert GOOD.count(old) == 1, old
    return GOOD.replace(old, new).encode()


BAD_PLANS = {
    "yaml-syntax": (_breaks('title: "First phase"', 'title: "First phase'), "YAML syntax error"),
    "misspelled-key": (_breaks('paths: ["src/"]', 'pahts: ["src/"]'), "did you mean 'paths'?"),
    "wrong-type": (_breaks('paths: ["src/"]', "paths: 12"), "got the integer 12"),
    "duplicate-phase": (_breaks('- id: "beta"', '- id: "alpha"'), "alpha"),
    "duplicate-gate": (_breaks('name: "check"', 'name: "build"'), "build"),
    "unknown-kind": (_breaks('kind: "verify"\n        run: "printf', 'kind: "verfy"\n        run: "printf'),
                     "did you mean 'verify'?"),
    "bad-threshold": (_breaks('"speedup": ">= 1.5"', '"speedup": "at least 1.5"'), "speedup"),
    "no-front-matter": (b"# Demo plan\n\nJust prose.\n", "missing front matter"),
    "one-marker-missing": (GOOD.replace(STATUS_END, "").encode(), "is missing"),
    "not-utf8": (GOOD.encode().replace(b"Demo plan", b"Demo \xff plan", 1), "not valid UTF-8"),
}


@pytest.mark.parametrize("case", sorted(BAD_PLANS))
@pytest.mark.parametrize("command", [["advance"], ["advance", "--dry-run"], ["status"]])
def test_bad_plan_is_one_located_line_and_exit_2(tmp_path, runner_env, case, command):
    data, needle = BAD_PLANS[case]
    repo = make_repo(tmp_path / "repo")
    repo.plan.write_bytes(data)
    before = snapshot(repo.root)
    result = cli(runner_env, repo.root, *command, "--plan", "plans/demo.md")
    assert result.exit_code == 2, result.text
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and "Traceback" not in result.text, result.stderr
    location = re.escape(str(repo.plan.resolve())) + r":\d+:\d+: "
    assert re.match(r"runner: error: " + location, lines[0]), lines[0]
    assert needle in lines[0]
    assert snapshot(repo.root) == before


# --- call: targets ------------------------------------------------------------------------------


def call_repo(tmp_path, target: str, later: str = "nowhere.yet:run"):
    phases = default_phases()
    phases[0]["gates"] = [gate("build", "build"), {"name": "check", "kind": "verify", "call": target}]
    phases[1]["gates"] = [{"name": "later", "kind": "verify", "call": later}]
    repo = make_repo(tmp_path / "repo", phases)
    write(repo.root, "gates/__init__.py", "raise RuntimeError('package imports must not run in the check')\n")
    write(repo.root, "gates/verify.py", "import json\n\ndef run():\n    return {'ok': 1}\n")
    repo.git("add", "-A")
    repo.git("commit", "-q", "-m", "gates")
    return repo


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("gates.missing:run", "call 'gates.missing:run': no module named 'gates.missing'"),
        ("nopkg.verify:run", "call 'nopkg.verify:run': no module named 'nopkg'"),
        ("gates.verify:runn", "module 'gates.verify'"),
    ],
)
@pytest.mark.parametrize("dry_run", [False, True])
def test_call_that_does_not_resolve_is_a_plan_error_at_the_gate(tmp_path, runner_env, target, message, dry_run):
    repo = call_repo(tmp_path, target)
    before = snapshot(repo.root)
    result = cli(runner_env, repo.root, "advance", *(["--dry-run"] if dry_run else []))
    assert result.exit_code == 2, result.text
    [line] = result.stderr.splitlines()
    call_line = next(n for n, text in enumerate(repo.plan.read_text().splitlines(), 1) if target in text)
    column = repo.plan.read_text().splitlines()[call_line - 1].index(f'"{target}"') + 1
    assert line.startswith(f"runner: error: {repo.plan.resolve()}:{call_line}:{column}: phases[0].gates[1].call: ")
    assert message in line
    assert snapshot(repo.root) == before and repo.commit_count() == 2


def test_call_that_resolves_runs_and_later_phases_are_not_checked(tmp_path, runner_env):
    repo = call_repo(tmp_path, "gates.verify:run")
    dry = cli(runner_env, repo.root, "advance", "--dry-run")
    assert dry.exit_code == 0, dry.text
    result = cli(runner_env, repo.root, "advance")
    # the gate's own import runs the package __init__, which raises: the gate's problem, an ERROR
    assert result.exit_code == 1, result.text
    assert "check (verify): ERROR" in result.stderr


def test_calls_of_the_sample_plan_resolve_without_importing_them():
    import sys

    from runner.gates.preflight import check_calls
    from tests.runner.run_samples import SAMPLE_PLAN, SAMPLE_ROOT

    doc = load_plan(SAMPLE_PLAN)
    loaded = set(sys.modules)
    check_calls(doc, doc.plan.phases[0], SAMPLE_ROOT)  # importing them would raise
    assert {name for name in set(sys.modules) - loaded if name.startswith(("sample_gates", "torch"))} == set()


# --- fuzz -------------------------------------------------------------------------------------------

SAMPLES = [MARKDOWN_PLAN, YAML_PLAN, GOOD]
_TOKEN = re.compile(r"\s+|[:\-\[\]{},#&*!|>'\"?%@`]|[^\s:\-\[\]{},#&*!|>'\"?%@`]+")
_YAML_BITS = [
    ":", "- ", "-", "[", "]", "{", "}", ",", "#", "&a ", "*a", "<<: *a", "!!python/object:os.system ",
    "!!binary ", "|", ">-", "? ", "%YAML 1.2\n", "---\n", "...\n", "\t", '"', "'", "null", "~", ".nan",
    "1e999", "-.inf", "0x1F", "2026-11-29T23:50:00Z", "99999999999999999999999", "true", "\n", "\n  ",
    "\ufeff", "\x00", "\u2028", "phases", "gates", "call", "a.b:c", "expect", "status", "complete",
]


def _tokens(text: str) -> list[str]:
    return _TOKEN.findall(text)


@st.composite
def token_mutations(draw) -> tuple[str, str]:
    sample = draw(st.sampled_from(SAMPLES))
    tokens = _tokens(sample)
    for _ in range(draw(st.integers(1, 4))):
        if not tokens:
            break
        i = draw(st.integers(0, len(tokens) - 1))
        op = draw(st.sampled_from(["delete", "duplicate", "swap", "replace", "insert"]))
        if op == "delete":
            del tokens[i]
        elif op == "duplicate":
            tokens.insert(i, tokens[i])
        elif op == "swap":
            j = draw(st.integers(0, len(tokens) - 1))
            tokens[i], tokens[j] = tokens[j], tokens[i]
        else:
            bit = draw(st.sampled_from(_YAML_BITS) | st.sampled_from(tokens))
            if op == "replace":
                tokens[i] = bit
            else:
                tokens.insert(i, bit)
    name = "plan.yaml" if sample is YAML_PLAN else "plan.md"
    return name, "".join(tokens)


@st.composite
def byte_mutations(draw) -> tuple[str, bytes]:
    sample = draw(st.sampled_from(SAMPLES))
    data = bytearray(sample.encode())
    for _ in range(draw(st.integers(1, 4))):
        i = draw(st.integers(0, len(data)))
        op = draw(st.sampled_from(["flip", "delete", "insert", "truncate"]))
        if op == "flip" and i < len(data):
            data[i] ^= 1 << draw(st.integers(0, 7))
        elif op == "delete":
            del data[i : i + draw(st.integers(1, 16))]
        elif op == "insert":
            data[i:i] = draw(st.binary(min_size=1, max_size=6))
        else:
            del data[i:]
    name = "plan.yaml" if sample is YAML_PLAN else "plan.md"
    return name, bytes(data)


_FUZZ = settings(max_examples=800, deadline=None, database=None,
                 suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


def _only_plan_errors(path) -> None:
    try:
        load_plan(path)
    except PlanError as error:
        assert error.path == path and str(error).startswith(str(path))


@_FUZZ
@given(mutated=token_mutations())
def test_yaml_token_mutations_raise_only_plan_errors(tmp_path, mutated):
    name, text = mutated
    path = tmp_path / name
    path.write_bytes(text.encode("utf-8", errors="surrogatepass"))
    _only_plan_errors(path)


@_FUZZ
@given(mutated=byte_mutations())
def test_byte_mutations_raise_only_plan_errors(tmp_path, mutated):
    name, data = mutated
    path = tmp_path / name
    path.write_bytes(data)
    _only_plan_errors(path)
