"""Loading plan files: valid plans, located errors, and which plan is found."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runner.errors import PlanError, UsageError
from runner.plan.load import STATUS_BEGIN, STATUS_END, find_plan, load_plan
from runner.plan.thresholds import Threshold

from .plan_samples import MARKDOWN_PLAN, YAML_PLAN, write_plan


def test_markdown_plan_loads(tmp_path: Path) -> None:
    doc = load_plan(write_plan(tmp_path, MARKDOWN_PLAN))
    plan = doc.plan
    assert (doc.format, plan.id, plan.title) == ("markdown", "demo", "Demo plan")
    assert [phase.id for phase in plan.phases] == ["one", "two"]
    speed = plan.phase("one").gate("speed")
    assert (speed.call, speed.args, speed.env, speed.requires, speed.timeout) == (
        "mypkg.bench:run",
        {"quick": True},
        {"FOO": "1"},
        ["cuda"],
        900,
    )
    assert speed.expect == {"speedup": Threshold.parse(">= 1.5"), "errors": Threshold.parse("== 0")}
    assert plan.phase("two").status == "pending"
    assert doc.text == MARKDOWN_PLAN
    assert doc.front_matter.startswith("schema: 1\n") and doc.front_matter.endswith("run: pytest -q\n")
    assert doc.status_section is not None
    assert doc.text[doc.status_section[0] : doc.status_section[1]] == "\n(generated)\n"


def test_yaml_plan_loads(tmp_path: Path) -> None:
    doc = load_plan(write_plan(tmp_path, YAML_PLAN, "plan.yaml"))
    assert (doc.format, doc.plan.id, doc.front_matter) == ("yaml", "demo-yaml", YAML_PLAN)
    assert doc.status_section is None


def test_crlf_plan_loads(tmp_path: Path) -> None:
    doc = load_plan(write_plan(tmp_path, MARKDOWN_PLAN.replace("\n", "\r\n")))
    assert doc.plan == load_plan(write_plan(tmp_path, MARKDOWN_PLAN, "lf.md")).plan


def _error_for(tmp_path: Path, text: str, name: str = "plan.md") -> PlanError:
    with pytest.raises(PlanError) as caught:
        load_plan(write_plan(tmp_path, text, name))
    return caught.value


# (old text, new text, file line, text on that line the column points at, key, hint fragment)
LOCATED_ERRORS = [
    ("timeout: 900", "timout: 900", 20, "timout", "phases[0].gates[1].timout", "did you mean 'timeout'?"),
    ("kind: benchmark", "kind: benchmrk", 15, "benchmrk", "phases[0].gates[1].kind", "did you mean 'benchmark'?"),
    ('errors: "== 0"', "errors: 0", 23, "0", "phases[0].gates[1].expect.errors", '"== 0"'),
    ('speedup: ">= 1.5"', 'speedup: ">= fast"', 22, '">= fast"', "phases[0].gates[1].expect.speedup", None),
    ("timeout: 900", "timeout: soon", 20, "soon", "phases[0].gates[1].timeout", None),
    ("title: First phase", "title: 12", 7, "12", "phases[0].title", "quote"),
    ('env: {FOO: "1"}', "env: {FOO: 1}", 18, "1}", "phases[0].gates[1].env.FOO", "quote"),
    ("- id: two", "- id: one", 24, "one", "phases[1].id", None),
    ("- name: speed", "- name: build", 14, "build", "phases[0].gates[1].name", None),
    ("status: pending", "status: complet", 8, "complet", "phases[0].status", "did you mean 'complete'?"),
    ("status: pending", "status: done", 8, "done", "phases[0].status", "choices: pending, complete"),
    ("schema: 1", "schema: 2", 2, "2", "schema", None),
    ("id: demo ", 'id: "-demo"', 3, '"-demo"', "id", None),
    ("call: mypkg.bench:run", "call: mypkg.bench.run", 16, "mypkg", "phases[0].gates[1].call", None),
    ("call: mypkg.bench:run", "call: mypkg.bench:run\n        run: make", 16, "mypkg", "phases[0].gates[1].call", None),
    ("    gates:\n      - name: check\n        kind: verify\n        run: pytest -q\n", "", 24, "id", "phases[1].gates", None),
    ("    paths: [src/]", "    paths: [src/]\n    colour: red", 10, "colour", "phases[0].colour", "valid keys"),
    ("phases:", "phase:", 5, "phase", "phase", "did you mean 'phases'?"),
    ("    gates:\n      - name: check", "    gate:\n      - name: check", 26, "gate", "phases[1].gate", "did you mean 'gates'?"),
]


@pytest.mark.parametrize(("old", "new", "line", "at", "key", "hint"), LOCATED_ERRORS)
def test_errors_name_line_column_key_and_hint(
    tmp_path: Path, old: str, new: str, line: int, at: str, key: str, hint: str | None
) -> None:
    assert MARKDOWN_PLAN.count(old) == 1
    text = MARKDOWN_PLAN.replace(old, new)
    error = _error_for(tmp_path, text)
    line_text = text.splitlines()[line - 1]
    assert (error.line, error.column, error.key) == (line, line_text.index(at) + 1, key), str(error)
    if hint is not None:
        assert error.hint is not None and hint in error.hint
    assert str(error).startswith(f"{tmp_path / 'plan.md'}:{line}:{error.column}: {key}: ")


def test_yaml_plan_errors_use_file_lines(tmp_path: Path) -> None:
    error = _error_for(tmp_path, YAML_PLAN.replace("kind: verify", "kind: check"), "plan.yml")
    assert (error.line, error.column, error.key) == (7, 15, "phases[0].gates[0].kind")


@pytest.mark.parametrize(
    ("old", "new", "line", "column", "fragment"),
    [
        ("title: First phase", "title: First: phase", 7, 17, "YAML syntax error"),
        ("    title: First phase\n", "    title: First phase\n    title: Again\n", 8, 5, "duplicate key"),
        ("paths: [src/]", "paths: [src/", None, None, "YAML syntax error"),
        ("schema: 1", "schema: 1\n\tid: x", 3, None, "YAML syntax error"),
    ],
)
def test_yaml_syntax_errors_use_file_lines(
    tmp_path: Path, old: str, new: str, line: int | None, column: int | None, fragment: str
) -> None:
    error = _error_for(tmp_path, MARKDOWN_PLAN.replace(old, new))
    assert fragment in error.message
    if line is not None:
        assert error.line == line
    if column is not None:
        assert error.column == column
    assert error.line is not None and 2 <= error.line <= 30


@pytest.mark.parametrize(
    ("text", "line", "fragment"),
    [
        ("# Plan\n\nNo front matter.\n", 1, "missing front matter"),
        ("", 1, "missing front matter"),
        ("---\nschema: 1\n", 1, "never closed"),
        ("---\n---\nprose\n", 2, "empty"),
        ("---\n- a\n- b\n---\n", 2, "must be a YAML mapping"),
        (MARKDOWN_PLAN.replace(STATUS_END, "end"), 35, "is missing"),
        (MARKDOWN_PLAN.replace(STATUS_BEGIN, "begin"), 37, "is missing"),
        (MARKDOWN_PLAN.replace(f"{STATUS_BEGIN}\n(generated)\n{STATUS_END}", f"{STATUS_END}\n{STATUS_BEGIN}"), 35, "comes before"),
        (MARKDOWN_PLAN + STATUS_BEGIN + "\n", 40, "appears 2 times"),
    ],
)
def test_document_level_errors(tmp_path: Path, text: str, line: int, fragment: str) -> None:
    error = _error_for(tmp_path, text)
    assert fragment in error.message
    assert error.line == line


def test_markers_in_front_matter_comments_do_not_count(tmp_path: Path) -> None:
    text = MARKDOWN_PLAN.replace("# plan id,", f"# {STATUS_END} plan id,")
    assert load_plan(write_plan(tmp_path, text)).status_section is not None


def test_non_utf8_names_line_and_offset(tmp_path: Path) -> None:
    data = MARKDOWN_PLAN.encode().replace(b"Demo plan", b"Demo \xff plan", 1)
    path = tmp_path / "plan.md"
    path.write_bytes(data)
    with pytest.raises(PlanError) as caught:
        load_plan(path)
    assert caught.value.line == 4
    offset = data.index(b"\xff")
    assert f"byte offset {offset}" in caught.value.message


def test_unreadable_file_is_a_plan_error(tmp_path: Path) -> None:
    with pytest.raises(PlanError, match="cannot read"):
        load_plan(tmp_path / "missing.md")
    with pytest.raises(PlanError, match="cannot read"):
        load_plan(tmp_path)


def test_recursive_alias_is_a_plan_error(tmp_path: Path) -> None:
    with pytest.raises(PlanError):
        load_plan(write_plan(tmp_path, "schema: 1\nid: x\nphases: &a [*a]\n", "plan.yaml"))


_SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@_SETTINGS
@given(data=st.binary(max_size=400), markdown=st.booleans())
def test_only_plan_errors_escape_for_any_bytes(tmp_path: Path, data: bytes, markdown: bool) -> None:
    path = tmp_path / ("plan.md" if markdown else "plan.yaml")
    path.write_bytes(b"---\n" + data if markdown else data)
    try:
        load_plan(path)
    except PlanError:
        pass


@_SETTINGS
@given(cut=st.integers(0, len(MARKDOWN_PLAN)), span=st.integers(0, 40), insert=st.text(max_size=8))
def test_only_plan_errors_escape_for_damaged_plans(tmp_path: Path, cut: int, span: int, insert: str) -> None:
    text = MARKDOWN_PLAN[:cut] + insert + MARKDOWN_PLAN[cut + span :]
    try:
        load_plan(write_plan(tmp_path, text))
    except PlanError as error:
        assert error.path == tmp_path / "plan.md"


# --- find_plan ----------------------------------------------------------------------------


def _repo(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    return tmp_path


def test_find_plan_explicit(tmp_path: Path) -> None:
    root = _repo(tmp_path, {"elsewhere/p.md": MARKDOWN_PLAN})
    assert find_plan(root, Path("elsewhere/p.md")) == (root / "elsewhere/p.md").resolve()
    assert find_plan(root, root / "elsewhere/p.md") == (root / "elsewhere/p.md").resolve()
    with pytest.raises(UsageError, match="not found"):
        find_plan(root, Path("nope.md"))


def test_find_plan_single_plan_in_plans_dir(tmp_path: Path) -> None:
    root = _repo(tmp_path, {"plans/README.md": "# Plans\n", "plans/0001.md": MARKDOWN_PLAN, "plans/notes.txt": "x"})
    assert find_plan(root, None) == (root / "plans/0001.md").resolve()


def test_find_plan_counts_yaml_and_broken_plans(tmp_path: Path) -> None:
    root = _repo(tmp_path, {"plans/a.yaml": YAML_PLAN, "plans/b.md": "---\nphases: [oops\n"})
    with pytest.raises(UsageError, match=r"plans/a\.yaml, plans/b\.md.*--plan"):
        find_plan(root, None)


def test_find_plan_uses_pyproject_setting(tmp_path: Path) -> None:
    root = _repo(
        tmp_path,
        {
            "plans/a.md": MARKDOWN_PLAN,
            "plans/b.md": MARKDOWN_PLAN,
            "pyproject.toml": '[tool.runner]\nplan = "plans/b.md"\n',
        },
    )
    assert find_plan(root, None) == (root / "plans/b.md").resolve()
    (root / "pyproject.toml").write_text('[tool.runner]\nplan = "plans/c.md"\n')
    with pytest.raises(UsageError, match="does not exist"):
        find_plan(root, None)


def test_find_plan_without_candidates(tmp_path: Path) -> None:
    root = _repo(tmp_path, {"plans/README.md": "# nothing\n", "pyproject.toml": "[project]\nname = 'x'\n"})
    with pytest.raises(UsageError, match=r"none.*--plan"):
        find_plan(root, None)
