"""Status rewrites change exactly the runner's bytes: status values, checkpoints, the table."""

from __future__ import annotations

import io
import json
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ruamel.yaml import YAML

from runner.errors import PlanError
from runner.plan.load import STATUS_BEGIN, STATUS_END, load_plan, parse_plan
from runner.plan import rewrite
from runner.plan.rewrite import (
    KEEP,
    PhaseUpdate,
    check_rewritable,
    render_status_section,
    render_updates,
    write_plan_text,
)
from runner.plan.schema import PHASE_STATUSES, Checkpoint, Plan

from .plan_samples import MARKDOWN_PLAN, YAML_PLAN, write_plan

CHECKPOINT = Checkpoint(
    tag="demo/one",
    base="0123abc",
    fingerprint="sha256:ff00",
    time="2026-11-29T23:50:00Z",
    report="reports/demo/one/20261129T235000Z-abcd1234/report.md",
    metrics={"speedup": 1.7, "errors": 0},
)


def _doc(tmp_path: Path, text: str, name: str = "plan.md"):
    return load_plan(write_plan(tmp_path, text, name))


def _expected_plan(plan: Plan, updates: dict[str, PhaseUpdate]) -> Plan:
    """The old plan with only the updated fields changed, built without runner.plan.rewrite."""
    phases = []
    for phase in plan.phases:
        if phase.id in updates:
            update = updates[phase.id]
            changes: dict[str, object] = {"status": update.status}
            if update.checkpoint is not KEEP:
                changes["checkpoint"] = update.checkpoint
            phase = phase.model_copy(update=changes)
        phases.append(phase)
    return plan.model_copy(update={"phases": phases})


# --- examples -----------------------------------------------------------------------------


def test_status_change_keeps_comment_and_spacing(tmp_path: Path) -> None:
    doc = _doc(tmp_path, MARKDOWN_PLAN)
    text = render_updates(doc, {"one": PhaseUpdate("blocked")})
    before, after = MARKDOWN_PLAN.split(STATUS_BEGIN)
    new_before, new_after = text.split(STATUS_BEGIN)
    assert new_before == before.replace("status: pending   #", "status: blocked   #")
    assert new_after.split(STATUS_END)[1] == after.split(STATUS_END)[1]
    assert "| one | First phase | blocked |" in new_after


def test_missing_status_is_inserted_after_the_id_line(tmp_path: Path) -> None:
    doc = _doc(tmp_path, MARKDOWN_PLAN)
    text = render_updates(doc, {"two": PhaseUpdate("failed")})
    assert "  - id: two\n    status: failed\n    title: Second phase\n" in text
    assert load_plan(write_plan(tmp_path, text)).plan.phase("two").status == "failed"


def test_crlf_is_kept_everywhere(tmp_path: Path) -> None:
    crlf = MARKDOWN_PLAN.replace("\n", "\r\n")
    doc = _doc(tmp_path, crlf)
    text = render_updates(doc, {"one": PhaseUpdate("complete", CHECKPOINT), "two": PhaseUpdate("blocked")})
    assert "\n" not in text.replace("\r\n", "")
    assert "    status: complete   # written by the runner\r\n    checkpoint:\r\n      tag: demo/one\r\n" in text
    assert "  - id: two\r\n    status: blocked\r\n" in text


def test_checkpoint_is_inserted_after_the_status_line(tmp_path: Path) -> None:
    doc = _doc(tmp_path, MARKDOWN_PLAN)
    text = render_updates(doc, {"one": PhaseUpdate("complete", CHECKPOINT)})
    expected_block = (
        "    status: complete   # written by the runner\n"
        "    checkpoint:\n"
        "      tag: demo/one\n"
        '      base: "0123abc"\n'
        '      fingerprint: "sha256:ff00"\n'
        '      time: "2026-11-29T23:50:00Z"\n'
        "      report: reports/demo/one/20261129T235000Z-abcd1234/report.md\n"
        "      metrics:\n"
        "        speedup: 1.7\n"
        "        errors: 0\n"
        "    paths: [src/]\n"
    )
    assert expected_block in text
    assert load_plan(write_plan(tmp_path, text)).plan.phase("one").checkpoint == CHECKPOINT


HAND_WRITTEN = MARKDOWN_PLAN.replace(
    "    paths: [src/]\n",
    "    paths: [src/]\n"
    "    checkpoint:   # kept: comment on the key line\n"
    "      tag: old\n"
    "      base: 'abc'\n"
    "      fingerprint: x\n"
    "      time: 2026-01-01T00:00:00Z\n"
    "      report: r.md\n"
    "      metrics: {speedup: 1.2}   # replaced with the block\n"
    "    # a comment after the checkpoint stays\n",
)


def test_existing_checkpoint_is_replaced(tmp_path: Path) -> None:
    doc = _doc(tmp_path, HAND_WRITTEN)
    text = render_updates(doc, {"one": PhaseUpdate("complete", CHECKPOINT)})
    assert "    checkpoint:   # kept: comment on the key line\n      tag: demo/one\n" in text
    assert "        errors: 0\n    # a comment after the checkpoint stays\n    gates:\n" in text
    assert "old" not in text and "speedup: 1.2" not in text
    assert load_plan(write_plan(tmp_path, text)).plan.phase("one").checkpoint == CHECKPOINT


def test_existing_checkpoint_is_removed(tmp_path: Path) -> None:
    doc = _doc(tmp_path, HAND_WRITTEN)
    text = render_updates(doc, {"one": PhaseUpdate("pending", None)})
    assert text.split(STATUS_BEGIN)[0] == MARKDOWN_PLAN.replace(
        "    paths: [src/]\n", "    paths: [src/]\n    # a comment after the checkpoint stays\n"
    ).split(STATUS_BEGIN)[0]


def test_status_inserted_where_a_checkpoint_is_replaced_or_removed(tmp_path: Path) -> None:
    text = HAND_WRITTEN.replace("    status: pending   # written by the runner\n", "").replace(
        "  - id: one\n    title: First phase\n    paths: [src/]\n", "  - title: First phase\n    paths: [src/]\n    id: one\n"
    )
    doc = _doc(tmp_path, text)
    removed = render_updates(doc, {"one": PhaseUpdate("failed", None)})
    assert "    id: one\n    status: failed\n    # a comment after the checkpoint stays\n" in removed
    replaced = render_updates(doc, {"one": PhaseUpdate("complete", CHECKPOINT)})
    assert "    id: one\n    status: complete\n    checkpoint:   # kept: comment on the key line\n" in replaced


def test_flow_checkpoint_as_first_key_is_removed(tmp_path: Path) -> None:
    text = YAML_PLAN.replace("  - id: only\n", "  - checkpoint: {tag: t, base: b, fingerprint: f, time: t, report: r}\n    id: only\n")
    doc = _doc(tmp_path, text, "plan.yaml")
    assert render_updates(doc, {"only": PhaseUpdate("pending", None)}) == YAML_PLAN


def test_yaml_plan_without_final_newline(tmp_path: Path) -> None:
    text = "schema: 1\nid: demo\nphases:\n  - gates: [{name: unit, kind: verify, run: pytest}]\n    id: only"
    doc = _doc(tmp_path, text, "plan.yaml")
    new_text = render_updates(doc, {"only": PhaseUpdate("complete", CHECKPOINT)})
    assert new_text.startswith(text + "\n    status: complete\n    checkpoint:\n      tag: demo/one\n")
    assert new_text.endswith("\n        errors: 0")
    back = render_updates(load_plan(write_plan(tmp_path, new_text, "plan.yaml")), {"only": PhaseUpdate("pending", None)})
    assert back == text + "\n    status: pending"


def test_same_values_give_the_same_text(tmp_path: Path) -> None:
    doc = _doc(tmp_path, HAND_WRITTEN)
    same = {phase.id: PhaseUpdate(phase.status, phase.checkpoint) for phase in doc.plan.phases}
    assert render_updates(doc, same) == HAND_WRITTEN
    assert render_updates(doc, {}) == HAND_WRITTEN


def test_flow_style_phase_is_refused(tmp_path: Path) -> None:
    text = YAML_PLAN.replace(
        "  - id: only\n    gates:\n      - name: unit\n        kind: verify\n        run: pytest\n",
        "  - {id: only, gates: [{name: unit, kind: verify, run: pytest}]}\n",
    )
    doc = _doc(tmp_path, text, "plan.yaml")
    with pytest.raises(PlanError, match="flow style"):
        render_updates(doc, {"only": PhaseUpdate("complete")})


def test_unknown_phase_and_bad_status_are_refused(tmp_path: Path) -> None:
    doc = _doc(tmp_path, MARKDOWN_PLAN)
    with pytest.raises(PlanError, match="no phase 'three'"):
        render_updates(doc, {"three": PhaseUpdate("complete")})
    with pytest.raises(ValueError, match="done"):
        render_updates(doc, {"one": PhaseUpdate("done")})  # type: ignore[arg-type]


def test_a_rewrite_that_would_change_the_plan_is_refused(tmp_path: Path) -> None:
    # Phase "other" merges phase "only" (<<: *p), so editing the status bytes of "only"
    # would change "other" too; the re-parse check must notice and refuse.
    text = YAML_PLAN.replace("  - id: only\n", "  - &p\n    id: only\n    status: pending\n") + "  - <<: *p\n    id: other\n"
    doc = _doc(tmp_path, text, "plan.yaml")
    assert doc.plan.phase("other").status == "pending"
    with pytest.raises(PlanError, match="refusing to rewrite"):
        render_updates(doc, {"only": PhaseUpdate("complete")})


def test_check_rewritable_refuses_a_phase_whose_lines_other_lines_use(tmp_path: Path) -> None:
    """The check before the gates re-reads only the phase's lines, but not when another phase
    merges them (``<<: *p``): then it re-parses the whole plan and refuses as a write would."""
    text = YAML_PLAN.replace("  - id: only\n", "  - &p\n    id: only\n    status: pending\n") + "  - <<: *p\n    id: other\n"
    doc = _doc(tmp_path, text, "plan.yaml")
    with pytest.raises(PlanError, match="refusing to rewrite"):
        check_rewritable(doc, "only")


@pytest.mark.parametrize("text, name", [
    ("%YAML 1.2\n---\n" + YAML_PLAN, "plan.yaml"),  # a directive: lines may read otherwise alone
    (MARKDOWN_PLAN.replace("title: First phase", "title: 'has <!-- runner:status:end --> in it'"), "plan.md"),
])
def test_check_rewritable_reads_the_whole_plan_where_lines_alone_cannot_tell(tmp_path: Path, text, name) -> None:
    doc = _doc(tmp_path, text, name)
    phase_id = doc.plan.phases[0].id
    with mock.patch.object(rewrite, "_verify", wraps=rewrite._verify) as whole:
        try:
            check_rewritable(doc, phase_id)
        except PlanError:
            pass
    assert whole.call_count == 1


def test_status_section_table() -> None:
    plan = Plan.model_validate(
        {
            "schema": 1,
            "id": "demo",
            "phases": [
                {
                    "id": "one",
                    "title": "A | B",
                    "status": "complete",
                    "gates": [{"name": "g", "kind": "build", "run": "true"}],
                    "checkpoint": CHECKPOINT.model_dump(),
                },
                {"id": "two", "gates": [{"name": "g", "kind": "build", "run": "true"}]},
            ],
        }
    )
    assert render_status_section(plan) == (
        "| phase | title | status | checkpoint | time | headline metrics |\n"
        "|---|---|---|---|---|---|\n"
        "| one | A \\| B | complete | `demo/one` | 2026-11-29T23:50:00Z | speedup=1.7, errors=0 |\n"
        "| two |  | pending |  |  |  |\n"
    )


# --- write_plan_text -------------------------------------------------------------------------


def test_write_plan_text_keeps_mode_and_leaves_no_temp_files(tmp_path: Path) -> None:
    path = write_plan(tmp_path, "old\n")
    os.chmod(path, 0o640)
    write_plan_text(path, "new\r\nlines é\r\n")
    assert path.read_bytes() == "new\r\nlines é\r\n".encode()
    assert stat.S_IMODE(path.stat().st_mode) == 0o640
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.md"]


def test_write_plan_text_new_file_and_symlink(tmp_path: Path) -> None:
    write_plan_text(tmp_path / "fresh.md", "x")
    assert (tmp_path / "fresh.md").read_text() == "x"
    (tmp_path / "link.md").symlink_to(tmp_path / "fresh.md")
    write_plan_text(tmp_path / "link.md", "y")
    assert (tmp_path / "link.md").is_symlink() and (tmp_path / "fresh.md").read_text() == "y"


def test_write_plan_text_failure_is_a_plan_error(tmp_path: Path) -> None:
    with pytest.raises(PlanError, match="cannot write"):
        write_plan_text(tmp_path / "missing-dir" / "plan.md", "x")


# --- generated plans ----------------------------------------------------------------------

_COMMENT_TEXT = st.text(st.characters(categories=("L", "N", "P", "S", "Zs"), exclude_characters="\x85"), max_size=12)
_PROSE_TEXT = st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\r\n"), max_size=30).filter(
    lambda line: "runner:status" not in line
)
_ANY_TEXT = st.text(st.characters(exclude_categories=("Cs",)), max_size=12)


@dataclass
class _Generated:
    text: str
    name: str
    phase_indent: int


@st.composite
def _comment(draw: st.DrawFn) -> str:
    """Nothing, or a comment after a value with random spacing."""
    if not draw(st.booleans()):
        return ""
    return " " * draw(st.integers(1, 4)) + "#" + draw(_COMMENT_TEXT)


@st.composite
def _own_line_comments(draw: st.DrawFn) -> list[str]:
    lines = []
    for _ in range(draw(st.integers(0, 2))):
        lines.append("" if draw(st.booleans()) else " " * draw(st.integers(0, 8)) + "#" + draw(_COMMENT_TEXT))
    return lines


def _quoted(text: str, style: str) -> str:
    if style == "single":
        return "'" + text.replace("'", "''") + "'"
    if style == "double":
        return json.dumps(text)
    return text


@st.composite
def _title(draw: st.DrawFn) -> str:
    style = draw(st.sampled_from(["plain", "single", "double"]))
    if style == "plain":
        return draw(st.from_regex(r"T[a-z0-9]{0,6}( [a-z0-9]{1,6}){0,2}", fullmatch=True))
    return _quoted(draw(_COMMENT_TEXT), style)


@st.composite
def _gate_lines(draw: st.DrawFn, index: int, indent: int) -> list[str]:
    pad = " " * (indent + 2)
    lines = [" " * indent + f"- name: g{index}" + draw(_comment())]
    lines.append(pad + "kind: " + draw(st.sampled_from(["build", "verify", "benchmark"])) + draw(_comment()))
    if draw(st.booleans()):
        lines.append(pad + "run: " + draw(st.sampled_from(["make -j", '"pytest -q"', "'echo hi'"])) + draw(_comment()))
    else:
        lines.append(pad + "call: pkg.bench:run" + draw(_comment()))
    if draw(st.booleans()):
        lines.append(pad + "expect:" + draw(_comment()))
        for name in draw(st.lists(st.sampled_from(["speedup", "errors", "bw"]), min_size=1, max_size=3, unique=True)):
            threshold = draw(st.sampled_from([">= 1.5", "== 0", "< 1e-2", "!= -3"]))
            lines.append(pad + f"  {name}: {_quoted(threshold, draw(st.sampled_from(['single', 'double'])))}" + draw(_comment()))
    return lines


@st.composite
def _existing_checkpoint(draw: st.DrawFn, key_indent: int, phase_id: str) -> list[str]:
    pad = " " * (key_indent + 2)
    time = draw(st.sampled_from(["2026-01-01T00:00:00Z", '"2026-01-01T00:00:00Z"']))
    lines = [
        " " * key_indent + "checkpoint:" + draw(_comment()),
        pad + f"tag: demo/{phase_id}",
        pad + "base: " + draw(st.sampled_from(["abc123", "'0123abc'"])),
        pad + 'fingerprint: "sha256:00"',
        pad + f"time: {time}",
        pad + "report: reports/r.md" + draw(_comment()),
    ]
    if draw(st.booleans()):
        lines.append(pad + "metrics: {speedup: 1.25, errors: 0}" + draw(_comment()))
    else:
        lines += [pad + "metrics:", pad + "  speedup: 1.25" + draw(_comment())]
    return lines


@st.composite
def _phase_lines(draw: st.DrawFn, index: int, indent: int) -> list[str]:
    key_indent = indent + 2
    pad = " " * key_indent
    phase_id = f"p{index}"
    blocks: dict[str, list[str]] = {
        "id": [pad + "id: " + _quoted(phase_id, draw(st.sampled_from(["plain", "single", "double"]))) + draw(_comment())],
        "title": [pad + "title: " + draw(_title()) + draw(_comment())],
        "gates": [pad + "gates:" + draw(_comment())],
    }
    for gate_index in range(draw(st.integers(1, 2))):
        blocks["gates"] += draw(_gate_lines(gate_index, key_indent + 2))
    if draw(st.booleans()):
        status = draw(st.sampled_from(PHASE_STATUSES))
        style = draw(st.sampled_from(["plain", "single", "double"]))
        blocks["status"] = [pad + "status: " + _quoted(status, style) + draw(_comment())]
    if draw(st.booleans()):
        blocks["paths"] = [pad + "paths: [src/, docs/]" + draw(_comment())]
    if draw(st.booleans()):
        blocks["checkpoint"] = draw(_existing_checkpoint(key_indent, phase_id))
    # Any key may come first except the checkpoint, whose removal would reflow the "- " line.
    first = draw(st.sampled_from(sorted(set(blocks) - {"checkpoint"})))
    rest = draw(st.permutations(sorted(set(blocks) - {first})))
    lines: list[str] = []
    for position, key in enumerate([first, *rest]):
        block = list(blocks[key])
        if position == 0:
            block[0] = " " * indent + "- " + block[0][key_indent:]
        lines += block + draw(_own_line_comments())
    return lines


@st.composite
def _generated_plans(draw: st.DrawFn) -> _Generated:
    markdown = draw(st.booleans())
    newline = draw(st.sampled_from(["\n", "\r\n"]))
    indent = draw(st.sampled_from([0, 2]))
    lines: list[str] = []
    if not markdown:
        lines += ["#" + draw(_COMMENT_TEXT) for _ in range(draw(st.integers(0, 2)))]
        if draw(st.booleans()):
            lines.append("---")
    lines += draw(_own_line_comments())
    lines += ["schema: 1" + draw(_comment()), "id: demo" + draw(_comment())]
    if draw(st.booleans()):
        lines.append("title: " + draw(_title()) + draw(_comment()))
    lines += draw(_own_line_comments()) + ["phases:" + draw(_comment())]
    for index in range(draw(st.integers(1, 3))):
        lines += draw(_phase_lines(index, indent))
    if markdown:
        lines = ["---", *lines, "---"]
        prose = draw(st.lists(_PROSE_TEXT, max_size=4))
        if draw(st.booleans()):
            at = draw(st.integers(0, len(prose)))
            inside = draw(st.lists(_PROSE_TEXT, max_size=3))
            prose[at:at] = [STATUS_BEGIN, *inside, STATUS_END]
        lines += prose
    text = newline.join(lines)
    if draw(st.booleans()):
        text += newline
    return _Generated(text=text, name="plan.md" if markdown else "plan.yaml", phase_indent=indent)


@st.composite
def _checkpoints(draw: st.DrawFn) -> Checkpoint:
    metric = st.one_of(
        st.integers(-(10**12), 10**12),
        st.floats(allow_nan=False),
        st.booleans(),
        _ANY_TEXT,
    )
    return Checkpoint(
        tag=draw(st.one_of(st.just("demo/p0"), _ANY_TEXT)),
        base=draw(st.from_regex(r"[0-9a-f]{7,40}", fullmatch=True)),
        fingerprint="sha256:" + draw(st.from_regex(r"[0-9a-f]{0,16}", fullmatch=True)),
        time=draw(st.sampled_from(["2026-11-29T23:50:00Z", "yes", "", "12:30"])),
        report=draw(st.one_of(st.just("reports/demo/p0/r.md"), _ANY_TEXT)),
        metrics=draw(st.dictionaries(_ANY_TEXT, metric, max_size=3)),
    )


@st.composite
def _updates(draw: st.DrawFn, phase_ids: list[str]) -> dict[str, PhaseUpdate]:
    chosen = draw(st.lists(st.sampled_from(phase_ids), unique=True, min_size=1, max_size=len(phase_ids)))
    return {
        phase_id: PhaseUpdate(
            status=draw(st.sampled_from(PHASE_STATUSES)),
            checkpoint=draw(st.one_of(st.just(KEEP), st.none(), _checkpoints())),
        )
        for phase_id in chosen
    }


_STATUS_LINE = re.compile(
    r"^(?P<lead> *(?:- )?)status:(?P<gap> +)(?P<value>'[^']*'|\"[^\"]*\"|[a-z-]+)(?P<rest>.*?)(?P<end>\r?\n?)$", re.S
)
_CHECKPOINT_LINE = re.compile(r"^(?P<lead> *(?:- )?)checkpoint:")
_ID_LINE = re.compile(r"^ *(?:- )?id: ['\"]?(?P<id>p\d+)")


def _lines(text: str) -> list[str]:
    return re.split(r"(?<=\n)", text)


def _mask(text: str, *, markdown: bool, phase_indent: int, updated: set[str]) -> str:
    """The text with the runner-owned parts of ``updated`` phases and the table blanked.

    Written independently of runner.plan.rewrite, from the generator's layout: a status line
    without a comment is dropped, one with a comment keeps everything but its value; a
    checkpoint key line and the deeper-indented content lines after it are dropped (own-line
    comments are never generated inside a checkpoint, so they stay); the status
    section body becomes <SECTION>. Everything else must survive byte for byte.
    """
    lines = _lines(text)
    yaml_end = len(lines)
    if markdown:
        yaml_end = next(i for i in range(1, len(lines)) if lines[i].rstrip("\r\n") == "---")
    # Group the front-matter lines by phase item ("- " at the phase indentation).
    groups: list[list[str]] = [[]]
    in_phases = False
    for line in lines[:yaml_end]:
        in_phases = in_phases or line.startswith("phases:")
        if in_phases and line.startswith(" " * phase_indent + "- "):
            groups.append([])
        groups[-1].append(line)
    masked: list[str] = []
    for group in groups:
        ids = [m["id"] for m in map(_ID_LINE.match, group) if m]
        if not ids or ids[0] not in updated:
            masked += group
            continue
        skip_deeper_than = None
        for line in group:
            if skip_deeper_than is not None:
                stripped = line.lstrip(" ")
                is_content = stripped.strip() and not stripped.startswith("#")
                if is_content and len(line) - len(stripped) > skip_deeper_than:
                    continue
                skip_deeper_than = None
            if (match := _CHECKPOINT_LINE.match(line)) is not None:
                skip_deeper_than = len(match["lead"])
                continue
            if (match := _STATUS_LINE.match(line)) is not None:
                if match["rest"].strip():
                    masked.append(f"{match['lead']}status:{match['gap']}<V>{match['rest']}{match['end']}")
                continue
            masked.append(line)
    body = "".join(lines[yaml_end:])
    if markdown and STATUS_BEGIN in body:
        before, rest = body.split(STATUS_BEGIN)
        body = before + STATUS_BEGIN + "<SECTION>" + STATUS_END + rest.split(STATUS_END)[1]
    return "".join(masked) + body


def _status_quotes(text: str, phase_indent: int, phase_id: str) -> str | None:
    """The quote character of a phase's status value ('' for plain), None without status."""
    masked_group = []
    for group in re.split(rf"(?m)^(?={' ' * phase_indent}- )", text):
        if _ID_LINE.search(group) and re.search(rf"(?m)^ *(?:- )?id: ['\"]?{phase_id}\b", group):
            masked_group = _lines(group)
    for line in masked_group:
        if (match := _STATUS_LINE.match(line)) is not None:
            return match["value"][0] if match["value"][0] in "'\"" else ""
    return None


_GENERATED = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@_GENERATED
@given(generated=_generated_plans(), data=st.data())
def test_generated_plans_change_only_runner_bytes(generated: _Generated, data: st.DataObject) -> None:
    path = Path("/nonexistent") / generated.name
    markdown = generated.name.endswith(".md")
    doc = parse_plan(generated.text, path=path, format="markdown" if markdown else "yaml")
    phase_ids = [phase.id for phase in doc.plan.phases]
    updates = data.draw(_updates(phase_ids))

    new_text = render_updates(doc, updates)

    # (a) it re-parses and (b) only the requested fields changed.
    new_doc = parse_plan(new_text, path=path, format=doc.format)
    assert new_doc.plan == _expected_plan(doc.plan, updates)
    # (c) outside the runner's spans every byte is the same.
    mask = {"markdown": markdown, "phase_indent": generated.phase_indent, "updated": set(updates)}
    # (Text inserted at the very end adds a newline to the old last line; checked below.)
    new_masked, old_masked = _mask(new_text, **mask), _mask(generated.text, **mask)
    assert new_masked.rstrip("\r\n") == old_masked.rstrip("\r\n")
    # The final newline, or its absence, stays; except that removing a checkpoint that
    # ended the file after a blank line leaves that (empty) line last.
    if new_text.endswith("\n") != generated.text.endswith("\n"):
        nl = "\r\n" if new_text.endswith("\r\n") else "\n"  # that empty line in the file's own line ending
        assert not generated.text.endswith("\n") and old_masked.startswith(new_masked + nl)
    if "\r\n" in generated.text:
        assert "\n" not in new_text.replace("\r\n", "")
    for phase_id in updates:
        old_quote = _status_quotes(generated.text, generated.phase_indent, phase_id)
        new_quote = _status_quotes(new_text, generated.phase_indent, phase_id)
        if old_quote is not None and doc.plan.phase(phase_id).status != updates[phase_id].status:
            assert new_quote == old_quote

    # Setting every phase to what it now is changes nothing, and rendering is idempotent.
    same = {phase.id: PhaseUpdate(phase.status, phase.checkpoint) for phase in new_doc.plan.phases}
    assert render_updates(new_doc, same) == new_text
    assert render_updates(new_doc, updates) == new_text


@settings(_GENERATED, max_examples=40)
@given(generated=_generated_plans())
def test_generated_plans_round_trip_unchanged(generated: _Generated) -> None:
    markdown = generated.name.endswith(".md")
    doc = parse_plan(generated.text, path=Path(generated.name), format="markdown" if markdown else "yaml")
    same = {phase.id: PhaseUpdate(phase.status, phase.checkpoint) for phase in doc.plan.phases}
    assert render_updates(doc, same) == generated.text
    keep = {phase.id: PhaseUpdate(phase.status) for phase in doc.plan.phases}
    assert render_updates(doc, keep) == generated.text


def test_mask_catches_a_dropped_comment_and_a_redump() -> None:
    """The byte-identity check above must be able to fail."""
    text = YAML_PLAN.replace("  - id: only\n", "  - id: p0\n    status: 'pending'  # mine\n    # note\n")
    mask = {"markdown": False, "phase_indent": 2, "updated": {"p0"}}
    assert _mask(text.replace("'pending'", "'complete'"), **mask) == _mask(text, **mask)
    assert _mask(text.replace("'pending'  # mine", "complete"), **mask) != _mask(text, **mask)
    assert _mask(text.replace("    # note\n", ""), **mask) != _mask(text, **mask)
    assert _mask(text.replace('run: pytest', "run: 'pytest'"), **mask) != _mask(text, **mask)
    # A rewrite that loads and dumps the YAML (even ruamel's round trip) is caught too.
    yaml = YAML(typ="rt")
    data = yaml.load(text.replace("kind: verify", "kind:   verify"))
    data["phases"][0]["status"] = "complete"
    redumped = io.StringIO()
    yaml.dump(data, redumped)
    assert _mask(redumped.getvalue(), **mask) != _mask(text.replace("kind: verify", "kind:   verify"), **mask)


@settings(_GENERATED, max_examples=60)
@given(generated=_generated_plans())
def test_check_rewritable_reads_a_phases_lines_alone_and_agrees_with_the_whole(generated: _Generated) -> None:
    """On plans as people write them the check before the gates re-reads only the phase's
    lines (never the whole plan), and the text it checked reads back whole as intended."""
    markdown = generated.name.endswith(".md")
    doc = parse_plan(generated.text, path=Path(generated.name), format="markdown" if markdown else "yaml")
    nodes = rewrite._phase_nodes(doc)
    for phase in doc.plan.phases:
        update = {phase.id: PhaseUpdate("complete", CHECKPOINT)}
        with mock.patch.object(rewrite, "_verify", side_effect=AssertionError("read the whole plan")):
            checked = rewrite._render(doc, update, nodes, verify=True, alone=phase.id)
        assert parse_plan(checked, path=doc.path, format=doc.format).plan == _expected_plan(doc.plan, update)
        assert checked == render_updates(doc, update)
