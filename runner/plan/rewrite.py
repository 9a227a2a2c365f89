"""Rewriting a plan's status: edit a span, never re-dump the file.

The runner owns three things in a plan file: each phase's ``status`` value, each phase's
``checkpoint`` block and the generated table between the status markers. ``render_updates``
changes exactly those bytes (located through the YAML parser's character offsets), then
re-parses the result and refuses to return it unless the plan is the old one with only the
requested status and checkpoint changes. ``write_plan_text`` puts the text on disk (``runner.atomic``).
"""

from __future__ import annotations

import enum
import math
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Final, Literal, get_args

from ruamel.yaml import YAML
from ruamel.yaml.nodes import MappingNode, Node, ScalarNode

from runner.atomic import write_atomic
from runner.errors import PlanError
from runner.formatting import format_metric, table_cell
from runner.plan.load import STATUS_BEGIN, STATUS_END, PlanDocument, parse_phase_lines, parse_plan
from runner.plan.schema import Checkpoint, Phase, PhaseStatus, Plan


class _Keep(enum.Enum):
    KEEP = "keep"


KEEP: Final = _Keep.KEEP
"""``PhaseUpdate.checkpoint`` value meaning: leave the phase's checkpoint as it is."""


@dataclass
class PhaseUpdate:
    """The new status of one phase and what to do with its checkpoint.

    ``checkpoint``: a ``Checkpoint`` to write, ``None`` to remove it, ``KEEP`` to leave it.
    """

    status: PhaseStatus
    checkpoint: Checkpoint | None | Literal[_Keep.KEEP] = KEEP


@dataclass(frozen=True)
class _Edit:
    """Replace ``text[start:end]`` with ``replacement``; ``order`` sorts inserts at one spot."""

    start: int
    end: int
    order: int
    replacement: str


# --- the public API -----------------------------------------------------------------------


def render_updates(doc: PlanDocument, updates: dict[str, PhaseUpdate]) -> str:
    """The text of ``doc`` with the phases in ``updates`` set to their new status/checkpoint.

    Only changed values are touched; if nothing changes the original text comes back
    unchanged. Raises ``PlanError`` for an unknown phase id, a flow-style phase, or when
    the edited text would not re-parse to exactly the expected plan.
    """
    return _render(doc, updates, _phase_nodes(doc), verify=True)


def _render(doc: PlanDocument, updates: dict[str, PhaseUpdate], nodes: dict[str, MappingNode], *,
            verify: bool, alone: str | None = None) -> str:
    """``render_updates`` with the phases' YAML nodes already composed; ``verify``: re-parse
    the result (every text that is written is verified), only the lines of phase ``alone``
    (the one phase updated) where they read alone as in the plan (``_verified_alone``)."""
    _check_updates(doc.plan, updates)
    expected = _updated_plan(doc.plan, updates)
    if all(_plain(expected.phase(phase_id)) == _plain(doc.plan.phase(phase_id)) for phase_id in updates):
        return doc.text  # no other phase is touched (_updated_plan)
    edits = _phase_edits(doc, expected, nodes)
    table = None
    changes = list(edits)
    if doc.status_section is not None:
        start, end = doc.status_section
        newline = _newline_at(doc.text, start)
        table = render_status_section(expected).replace("\n", newline)
        changes.append(_Edit(start, end, 0, newline + table))
    new_text = _apply(doc.text, changes)
    if verify and not (alone is not None and list(updates) == [alone] and _verified_alone(
            doc, nodes[alone], edits, table, doc.plan.phase(alone), expected.phase(alone))):
        _verify(doc, new_text, expected)
    return new_text


_ITEM_PREFIX = re.compile(r" *(?:- +)?")
_DIRECTIVE = re.compile(r"^%", re.MULTILINE)


def _verified_alone(doc: PlanDocument, node: MappingNode, edits: list[_Edit], table: str | None,
                    old: Phase, new: Phase) -> bool:
    """Whether the ``edits`` of one phase (whose mapping is ``node``) give ``new``, read from
    the phase's own lines alone: true only when those lines, read alone, also give ``old`` (the
    lines around them are left as they were, and so is every other phase), nothing in them
    could be used elsewhere (an anchor) or read otherwise there (a YAML directive), and the
    status table adds no marker. False means: re-parse the whole text."""
    if doc.format == "yaml" and _DIRECTIVE.search(doc.front_matter):
        return False
    if table is not None and (STATUS_BEGIN in table or STATUS_END in table):
        return False
    text, base = doc.text, doc.front_matter_start
    first = base + node.start_mark.index
    start = max(text.rfind("\n", 0, first) + 1, base)
    if not _ITEM_PREFIX.fullmatch(text, start, first):
        return False
    end = _span_end(text, base + _content_end(node, after=node))
    if not edits or any(edit.start < start or edit.end > end for edit in edits):
        return False
    old_lines = text[start:end]
    new_lines = _apply(old_lines, [replace(edit, start=edit.start - start, end=edit.end - start) for edit in edits])
    for lines, phase in ((old_lines, old), (new_lines, new)):
        read = parse_phase_lines(lines, path=doc.path)
        if read is None or _plain(read) != _plain(phase):
            return False
    return True


_SAMPLE_CHECKPOINT = Checkpoint(
    tag="plan/phase", base="0" * 40, fingerprint="sha256:" + "0" * 64, time="2000-01-01T00:00:00Z",
    report="reports/plan/phase/run/report.md", metrics={"metric": 1.0},
)


def check_rewritable(doc: PlanDocument, phase_id: str) -> None:
    """``PlanError`` now, before any gate runs, when the runner could not record an outcome of
    ``phase_id`` in the plan's bytes (a phase written as a flow mapping ``{id: ..., ...}``, a
    status that is not a one-line scalar, YAML whose edit would move more than the status):
    every update a run may make is rendered and dropped.

    The front matter is composed once for all of them, and only the update that edits the
    most (``complete`` with a checkpoint) is re-parsed: ``failed`` and ``blocked`` edit the
    same status scalar to another plain word and leave the checkpoint alone. On a plan of
    thousands of gates each YAML pass takes seconds; this check once took six of them, and
    now re-reads only the phase's own lines where they read alone as in the plan (see the
    module's decisions). A text that is written is always verified in full (``render_updates``).
    """
    nodes = _phase_nodes(doc)
    for update in (PhaseUpdate("failed"), PhaseUpdate("blocked")):
        _render(doc, {phase_id: update}, nodes, verify=False)
    _render(doc, {phase_id: PhaseUpdate("complete", _SAMPLE_CHECKPOINT)}, nodes, verify=True, alone=phase_id)


def render_status_section(plan: Plan) -> str:
    """A Markdown table of every phase (``\\n`` line endings, ends with a newline)."""
    rows = ["| phase | title | status | checkpoint | time | headline metrics |", "|---|---|---|---|---|---|"]
    for phase in plan.phases:
        checkpoint = phase.checkpoint
        cells = [phase.id, phase.title, phase.status, "", "", ""]
        if checkpoint is not None:
            metrics = ", ".join(f"{name}={format_metric(value)}" for name, value in checkpoint.metrics.items())
            cells[3:] = [f"`{checkpoint.tag}`", checkpoint.time, metrics]
        rows.append("| " + " | ".join(table_cell(cell) for cell in cells) + " |")
    return "\n".join(rows) + "\n"


def write_plan_text(path: Path | str, text: str) -> None:
    """Write the plan's new text atomically (``runner.atomic``); ``PlanError`` when it cannot."""
    try:
        write_atomic(path, text)
    except OSError as error:
        raise PlanError(f"cannot write the plan: {error.strerror or error}", path=Path(path)) from None


# --- deciding what changes ----------------------------------------------------------------


def _check_updates(plan: Plan, updates: dict[str, PhaseUpdate]) -> None:
    known = {phase.id for phase in plan.phases}
    for phase_id, update in updates.items():
        if phase_id not in known:
            raise PlanError(
                f"refusing to rewrite: no phase {phase_id!r} in plan {plan.id!r}",
                hint=f"phases: {', '.join(sorted(known))}",
            )
        if update.status not in get_args(PhaseStatus):
            raise ValueError(f"status {update.status!r} is not one of {get_args(PhaseStatus)}")
        if update.checkpoint is not KEEP and not isinstance(update.checkpoint, (Checkpoint, type(None))):
            raise ValueError(f"checkpoint must be a Checkpoint, None or KEEP, got {update.checkpoint!r}")


def _updated_plan(plan: Plan, updates: dict[str, PhaseUpdate]) -> Plan:
    phases = []
    for phase in plan.phases:
        update = updates.get(phase.id)
        if update is not None:
            changes: dict[str, Any] = {"status": update.status}
            if update.checkpoint is not KEEP:
                changes["checkpoint"] = update.checkpoint
            phase = phase.model_copy(update=changes)
        phases.append(phase)
    return plan.model_copy(update={"phases": phases})


# --- locating and editing the YAML --------------------------------------------------------


def _phase_edits(doc: PlanDocument, expected: Plan, nodes: dict[str, MappingNode]) -> list[_Edit]:
    """Edits for every phase whose status or checkpoint differs from the document."""
    edits: list[_Edit] = []
    for old, new in zip(doc.plan.phases, expected.phases, strict=True):
        status_changed = old.status != new.status
        checkpoint_changed = _plain(old.checkpoint) != _plain(new.checkpoint)
        if status_changed or checkpoint_changed:
            edits += _edits_for_phase(doc, nodes[old.id], new, status_changed, checkpoint_changed)
    return edits


def _phase_nodes(doc: PlanDocument) -> dict[str, MappingNode]:
    """The mapping node of each phase, by id, from the node tree the plan was loaded from (a
    fresh compose of the front matter for a document made without one)."""
    root = doc.yaml_node if doc.yaml_node is not None else YAML(typ="rt").compose(doc.front_matter)
    phases = _value_of(root, "phases") if isinstance(root, MappingNode) else None
    found: dict[str, MappingNode] = {}
    for item in getattr(phases, "value", None) or []:
        id_node = _value_of(item, "id") if isinstance(item, MappingNode) else None
        if isinstance(id_node, ScalarNode):
            if item.flow_style:
                raise PlanError(
                    f"refusing to rewrite: phase {id_node.value!r} is written in flow style {{...}}",
                    path=doc.path,
                    line=item.start_mark.line + doc.line_offset + 1,
                    hint="write the phase as a block mapping, one key per line",
                )
            found[id_node.value] = item
    missing = [phase.id for phase in doc.plan.phases if phase.id not in found]
    if missing:
        raise PlanError(f"refusing to rewrite: cannot locate phase(s) {', '.join(missing)} in the YAML", path=doc.path)
    return found


def _edits_for_phase(
    doc: PlanDocument, node: MappingNode, phase: Phase, status_changed: bool, checkpoint_changed: bool
) -> list[_Edit]:
    text, base = doc.text, doc.front_matter_start
    id_key, id_value = _pair(node, "id")  # type: ignore[misc]
    status = _pair(node, "status")
    edits: list[_Edit] = []
    if status is not None:
        status_key, status_value = status
        indent = status_key.start_mark.column
        after_status = _line_end(text, base + status_value.end_mark.index)
        if status_changed:
            edits.append(_status_value_edit(doc, status_value, phase.status))
    else:
        indent = id_key.start_mark.column
        after_status = _line_end(text, base + id_value.end_mark.index)
        if status_changed:
            edits.append(_insert_lines(text, after_status, 1, [" " * indent + f"status: {phase.status}"]))
    if not checkpoint_changed:
        return edits
    existing = _pair(node, "checkpoint")
    if existing is None:
        if phase.checkpoint is not None:
            lines = _checkpoint_lines(phase.checkpoint, indent)
            edits.append(_insert_lines(text, after_status, 2, lines))
        return edits
    edits.append(_checkpoint_edit(text, base, *existing, phase.checkpoint))
    return edits


def _status_value_edit(doc: PlanDocument, value: Node, status: str) -> _Edit:
    """Replace the status scalar's characters, keeping its quote style."""
    if not isinstance(value, ScalarNode) or value.style not in (None, "'", '"') or (
        value.start_mark.line != value.end_mark.line
    ):
        raise PlanError(
            "refusing to rewrite: the status value must be a one-line plain or quoted scalar",
            path=doc.path,
            line=value.start_mark.line + doc.line_offset + 1,
            key="status",
        )
    quote = value.style or ""
    start = doc.front_matter_start + value.start_mark.index
    end = doc.front_matter_start + value.end_mark.index
    return _Edit(start, end, 0, f"{quote}{status}{quote}")


def _checkpoint_edit(text: str, base: int, key: Node, value: Node, checkpoint: Checkpoint | None) -> _Edit:
    """Replace or remove an existing checkpoint, from its key to the end of its last line."""
    key_start = base + key.start_mark.index
    span_end = _span_end(text, base + _content_end(value, after=key))
    line_start = text.rfind("\n", 0, key_start) + 1
    key_first_on_line = not text[line_start:key_start].strip()
    newline = _newline_at(text, key_start)
    at_eof_without_newline = span_end == len(text) and not text.endswith("\n")
    if checkpoint is None:
        if key_first_on_line:
            start = line_start
            if at_eof_without_newline and line_start > 0:  # keep "no newline at end of file"
                start = line_start - (2 if text[line_start - 2 : line_start] == "\r\n" else 1)
            return _Edit(start, span_end, 0, "")
        # "- checkpoint: ..." as a sequence item's first key: the next key moves up after "- ".
        end = span_end
        while end < len(text) and text[end] == " ":
            end += 1
        return _Edit(key_start, end, 0, "")
    block_below_key = isinstance(value, MappingNode) and not value.flow_style
    if block_below_key and value.start_mark.line > key.start_mark.line:
        # Keep the "checkpoint:" line (and any comment on it); replace the body lines.
        body_start = text.rfind("\n", 0, base + value.start_mark.index) + 1
        lines = _mapping_lines(_checkpoint_data(checkpoint), value.start_mark.column)
        replacement = newline.join(lines) + ("" if at_eof_without_newline else newline)
        return _Edit(body_start, span_end, 0, replacement)
    lines = _checkpoint_lines(checkpoint, key.start_mark.column)
    lines[0] = lines[0].lstrip(" ")
    replacement = newline.join(lines) + ("" if at_eof_without_newline else newline)
    return _Edit(key_start, span_end, 0, replacement)


def _insert_lines(text: str, position: int, order: int, lines: list[str]) -> _Edit:
    """Insert whole lines at a line start, keeping a missing final newline missing."""
    newline = _newline_at(text, max(position - 1, 0))
    if position == len(text) and not text.endswith("\n"):
        return _Edit(position, position, order, newline + newline.join(lines))
    return _Edit(position, position, order, newline.join(lines) + newline)


def _apply(text: str, edits: list[_Edit]) -> str:
    pieces, cursor = [], 0
    # At one offset, insertions go before a replacement that starts there (a status line
    # inserted after the id line comes before the checkpoint block that follows it).
    for edit in sorted(edits, key=lambda e: (e.start, e.end > e.start, e.order)):
        if edit.start < cursor:
            raise PlanError("refusing to rewrite: internal error, overlapping edits")
        pieces += [text[cursor : edit.start], edit.replacement]
        cursor = edit.end
    pieces.append(text[cursor:])
    return "".join(pieces)


def _verify(doc: PlanDocument, new_text: str, expected: Plan) -> None:
    """Re-parse the edited text; refuse unless only the requested fields moved."""
    try:
        new_doc = parse_plan(new_text, path=doc.path, format=doc.format)
    except PlanError as error:
        raise PlanError(f"refusing to rewrite: the edited plan would not load: {error}", path=doc.path) from None
    if _plain(new_doc.plan) != _plain(expected):
        raise PlanError(
            "refusing to rewrite: the edited plan differs from the intended one beyond status and checkpoint",
            path=doc.path,
        )
    if _outside_yaml_and_table(new_doc) != _outside_yaml_and_table(doc):
        raise PlanError("refusing to rewrite: the edit would change text outside the plan's YAML", path=doc.path)


def _outside_yaml_and_table(doc: PlanDocument) -> tuple[str, ...]:
    """The text before and after the YAML, without the status table (markers kept)."""
    head, tail = doc.text[: doc.front_matter_start], doc.text[doc.front_matter_end :]
    if doc.status_section is None:
        return head, tail
    start, end = (offset - doc.front_matter_end for offset in doc.status_section)
    return head, tail[:start], tail[end:]


# --- YAML node helpers --------------------------------------------------------------------


def _pair(node: MappingNode, key: str) -> tuple[Node, Node] | None:
    for key_node, value_node in node.value:
        if isinstance(key_node, ScalarNode) and key_node.value == key:
            return key_node, value_node
    return None


def _value_of(node: MappingNode, key: str) -> Node | None:
    pair = _pair(node, key)
    return pair[1] if pair else None


def _is_empty_scalar(node: Node) -> bool:
    return isinstance(node, ScalarNode) and node.value == "" and node.style is None


def _content_end(node: Node, *, after: Node) -> int:
    """Offset just past a value's last character (block collections end at their last
    child, not at the next token; an empty value ends with its key ``after``)."""
    if _is_empty_scalar(node):
        return after.end_mark.index
    if isinstance(node, ScalarNode) or node.flow_style:
        return node.end_mark.index
    if isinstance(node, MappingNode):
        ends = [max(_content_end(k, after=k), _content_end(v, after=k)) for k, v in node.value]
    else:
        ends = [_content_end(item, after=item) for item in node.value]
    return max(ends, default=node.end_mark.index)


def _span_end(text: str, content_end: int) -> int:
    """The end of the line holding ``content_end`` (block scalars already end a line)."""
    if content_end > 0 and text[content_end - 1] == "\n":
        return content_end
    return _line_end(text, content_end)


def _line_end(text: str, position: int) -> int:
    """The offset just past the newline of the line holding ``position`` (or the text end)."""
    newline = text.find("\n", position)
    return len(text) if newline < 0 else newline + 1


def _newline_at(text: str, position: int) -> str:
    """The line ending used by the line holding ``position`` (the file's, on the last line)."""
    newline = text.find("\n", position)
    if newline < 0:
        return "\r\n" if "\r\n" in text else "\n"
    return "\r\n" if newline > 0 and text[newline - 1] == "\r" else "\n"


# --- rendering ----------------------------------------------------------------------------

_PLAIN_SAFE = re.compile(r"[A-Za-z_/][A-Za-z0-9_./-]*")
_YAML_WORDS = {"true", "false", "null", "yes", "no", "on", "off", "y", "n", "nan", "inf"}


def _checkpoint_data(checkpoint: Checkpoint) -> dict[str, Any]:
    """The record as written in the plan; ``open_targets`` only when a target was left open,
    so a plan without targets keeps the record it always had."""
    data = checkpoint.model_dump(mode="python")
    if not data["open_targets"]:
        del data["open_targets"]
    else:
        data["open_targets"] = {name: target.record() for name, target in checkpoint.open_targets.items()}
    return data


def _checkpoint_lines(checkpoint: Checkpoint, indent: int) -> list[str]:
    return [" " * indent + "checkpoint:", *_mapping_lines(_checkpoint_data(checkpoint), indent + 2)]


def _mapping_lines(mapping: dict[str, Any], indent: int) -> list[str]:
    """Block YAML for a mapping of scalars and nested mappings, keys in the given order."""
    lines = []
    for key, value in mapping.items():
        prefix = " " * indent + f"{_yaml_scalar(key)}:"
        if isinstance(value, dict) and value:
            lines += [prefix, *_mapping_lines(value, indent + 2)]
        else:
            lines.append(f"{prefix} {_yaml_scalar(value)}")
    return lines


def _yaml_scalar(value: Any) -> str:
    """One scalar as YAML that reads back as the same type and value."""
    if isinstance(value, dict) and not value:
        return "{}"
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return ".nan"
        if math.isinf(value):
            return ".inf" if value > 0 else "-.inf"
        return repr(value)
    text = str(value)
    if _PLAIN_SAFE.fullmatch(text) and text.lower() not in _YAML_WORDS:
        return text
    return '"' + "".join(_escape(char) for char in text) + '"'


def _escape(char: str) -> str:
    """One character inside a YAML double-quoted scalar, anything beyond printable ASCII escaped."""
    if char in '"\\':
        return "\\" + char
    code = ord(char)
    if 0x20 <= code < 0x7F:
        return char
    if code <= 0xFF:
        return f"\\x{code:02x}"
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"  # not a surrogate pair: YAML reads \U as one code point


# --- small utilities ----------------------------------------------------------------------


_NAN = object()  # stands for every NaN, so NaN metrics compare equal to themselves


def _plain(value: Any) -> Any:
    """A comparable form of models: dumped, with NaN made equal to NaN."""
    if hasattr(value, "model_dump"):
        value = value.model_dump(mode="python")
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_plain(item) for item in value]
    if isinstance(value, float) and math.isnan(value):
        return _NAN
    return value
