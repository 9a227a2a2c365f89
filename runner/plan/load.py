"""Reading plan files: Markdown with YAML front matter, or plain YAML.

``load_plan`` turns any file into either a validated ``PlanDocument`` or a ``PlanError``
that names the file line, column and key path of the problem and, where it can, how to
fix it. ``find_plan`` decides which plan file a command works on.
"""

from __future__ import annotations

import datetime as dt
import difflib
import re
import tomllib
import types
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError
from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.error import MarkedYAMLError, YAMLError
from ruamel.yaml.scalarbool import ScalarBoolean

from runner.errors import PlanError, UsageError
from runner.formatting import one_line
from runner.plan.schema import ID_PATTERN, ID_RULE, Phase, Plan

PlanFormat = Literal["markdown", "yaml"]

STATUS_BEGIN = "<!-- runner:status:begin -->"
STATUS_END = "<!-- runner:status:end -->"

YAML_SUFFIXES = (".yaml", ".yml")
PLAN_SUFFIXES = (".md", *YAML_SUFFIXES)

_OPENING_LINE = re.compile(r"---[ \t]*(?:\r?\n|\Z)")
_CLOSING_LINE = re.compile(r"^---[ \t]*\r?$", re.MULTILINE)
_PHASES_KEY = re.compile(r"^phases[ \t]*:", re.MULTILINE)

# Guards against alias bombs and absurd nesting in hostile or broken input.
_MAX_NODES = 200_000
_MAX_DEPTH = 64


@dataclass(frozen=True)
class PlanDocument:
    """A plan file as read: its exact text, where the YAML sits in it, and the parsed plan.

    ``front_matter_start``/``front_matter_end`` delimit the YAML inside ``text`` (the
    whole text for a YAML plan); ``status_section`` is the span between the status
    markers, or ``None`` when the file has no markers. ``yaml_data`` is the round-trip
    YAML tree, which knows where every value sits (see ``position``); ``yaml_node`` the
    composed node tree it was built from, whose marks give each value's character span
    (``runner.plan.rewrite`` edits by them without composing the text again).
    """

    path: Path
    text: str
    format: PlanFormat
    plan: Plan
    front_matter_start: int
    front_matter_end: int
    status_section: tuple[int, int] | None = None
    yaml_data: Any = field(default=None, compare=False, repr=False)
    yaml_node: Any = field(default=None, compare=False, repr=False)

    @property
    def front_matter(self) -> str:
        """The YAML text of the plan."""
        return self.text[self.front_matter_start : self.front_matter_end]

    @property
    def line_offset(self) -> int:
        """Number of file lines before the YAML (0 for a YAML plan)."""
        return self.text.count("\n", 0, self.front_matter_start)

    def position(self, *loc: str | int) -> tuple[int, int] | None:
        """The 1-based (line, column) in the file of the value at ``loc``, a key path such as
        ``("phases", 0, "gates", 1, "call")``; ``None`` when the plan has no such value."""
        if self.yaml_data is None:
            return None
        found, (line, column), _ = _walk(self.yaml_data, tuple(loc))
        if found != tuple(loc):
            return None
        return line + self.line_offset + 1, column + 1


def plan_format(path: Path) -> PlanFormat:
    """``yaml`` for ``.yaml``/``.yml`` files, ``markdown`` for anything else."""
    return "yaml" if path.suffix.lower() in YAML_SUFFIXES else "markdown"


def load_plan(path: Path | str) -> PlanDocument:
    """Read, parse and validate the plan at ``path``; every problem is a ``PlanError``."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as error:
        raise PlanError(f"cannot read the plan: {error.strerror or error}", path=path) from None
    return parse_plan(decode_plan_bytes(data, path), path=path, format=plan_format(path))


def decode_plan_bytes(data: bytes, path: Path) -> str:
    """Decode UTF-8, naming the line and byte offset of the first invalid byte."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data.count(b"\n", 0, error.start) + 1
        column = error.start - (data.rfind(b"\n", 0, error.start) + 1) + 1
        raise PlanError(
            f"the file is not valid UTF-8 (byte offset {error.start}: {error.reason})",
            path=path,
            line=line,
            column=column,
            hint="save the plan as UTF-8",
        ) from None


def parse_plan(text: str, *, path: Path, format: PlanFormat) -> PlanDocument:
    """Parse and validate plan ``text`` as if read from ``path``."""
    try:
        return _parse_plan(text, path=path, format=format)
    except PlanError:
        raise
    except Exception as error:  # noqa: BLE001 - the contract: only PlanError leaves here
        raise PlanError(f"cannot parse the plan: {type(error).__name__}: {error}", path=path) from None


def _parse_plan(text: str, *, path: Path, format: PlanFormat) -> PlanDocument:
    if format == "yaml":
        start, end, body_start = 0, len(text), len(text)
    else:
        start, end, body_start = _split_front_matter(text, path)
    line_offset = text.count("\n", 0, start)
    data, node = _load_yaml(text[start:end], path=path, line_offset=line_offset)
    if not isinstance(data, dict):
        got = "nothing" if data is None else _type_name(data)
        raise PlanError(
            f"the plan must be a YAML mapping with keys schema, id and phases, got {got}",
            path=path,
            line=line_offset + 1,
            column=1,
        )
    try:
        plan = Plan.model_validate(_to_plain(data, path=path, line_offset=line_offset))
    except ValidationError as error:
        raise _plan_error_from_validation(error, data, path=path, line_offset=line_offset) from None
    section = _find_status_section(text, body_start, path) if format == "markdown" else None
    return PlanDocument(
        path=path,
        text=text,
        format=format,
        plan=plan,
        front_matter_start=start,
        front_matter_end=end,
        status_section=section,
        yaml_data=data,
        yaml_node=node,
    )


def parse_phase_lines(yaml_text: str, *, path: Path) -> Phase | None:
    """The one phase that ``yaml_text`` holds when read on its own (a phase's lines cut out of
    a plan: ``  - id: ...`` and the lines below it), read and validated as ``load_plan`` reads
    a phase; ``None`` when the text is not exactly one valid phase, or when it defines an
    anchor (which other lines of the plan could use: read alone it cannot tell)."""
    try:
        data, node = _load_yaml(yaml_text, path=path, line_offset=0)
        if node is None or _has_anchor(node):
            return None
        if isinstance(data, list) and len(data) == 1:
            data = data[0]
        if not isinstance(data, dict):
            return None
        return Phase.model_validate(_to_plain(data, path=path))
    except Exception:  # noqa: BLE001 - any text not read as one phase is answered None
        return None


def _has_anchor(node: Any) -> bool:
    pending, seen = [node], set()
    while pending:
        current = pending.pop()
        if id(current) in seen:
            return True  # reached twice: an alias
        seen.add(id(current))
        if getattr(current, "anchor", None) is not None:
            return True
        value = getattr(current, "value", None)
        if isinstance(value, list):
            for item in value:
                pending.extend(item if isinstance(item, tuple) else (item,))
    return False


def _split_front_matter(text: str, path: Path) -> tuple[int, int, int]:
    """Offsets of the front matter's start and end and of the body after the closing line."""
    begin = 1 if text.startswith("\ufeff") else 0
    opening = _OPENING_LINE.match(text, begin)
    if opening is None:
        raise PlanError(
            "missing front matter: the first line of a Markdown plan must be '---'",
            path=path,
            line=1,
            column=1,
            hint="start the file with '---', the plan's YAML, then another '---' line",
        )
    closing = _CLOSING_LINE.search(text, opening.end()) if opening.end() < len(text) else None
    if closing is None:
        raise PlanError(
            "the front matter is never closed",
            path=path,
            line=1,
            column=1,
            hint="end the plan's YAML with a line that is exactly '---'",
        )
    body_start = closing.end()
    if text.startswith("\n", body_start):
        body_start += 1
    if not text[opening.end() : closing.start()].strip():
        raise PlanError(
            "the front matter is empty",
            path=path,
            line=2,
            column=1,
            hint="put the plan's YAML (schema, id, phases) between the two '---' lines",
        )
    return opening.end(), closing.start(), body_start


def _find_status_section(text: str, body_start: int, path: Path) -> tuple[int, int] | None:
    """The span between the status markers in the body, checking they come as one pair."""
    begins = [m.start() for m in re.finditer(re.escape(STATUS_BEGIN), text[body_start:])]
    ends = [m.start() for m in re.finditer(re.escape(STATUS_END), text[body_start:])]
    if not begins and not ends:
        return None

    def line_of(relative: int) -> int:
        return text.count("\n", 0, body_start + relative) + 1

    def column_of(relative: int) -> int:
        offset = body_start + relative
        return offset - (text.rfind("\n", 0, offset) + 1) + 1

    hint = f"put one '{STATUS_BEGIN}' line and, below it, one '{STATUS_END}' line"
    if len(begins) != 1 or len(ends) != 1:
        marker, found = (STATUS_BEGIN, begins) if len(begins) != 1 else (STATUS_END, ends)
        count = "is missing" if not found else f"appears {len(found)} times"
        at = found[1] if found else (begins or ends)[0]
        raise PlanError(
            f"status marker {marker} {count}", path=path, line=line_of(at), column=column_of(at), hint=hint
        )
    if ends[0] < begins[0]:
        raise PlanError(
            f"status marker {STATUS_END} comes before {STATUS_BEGIN}",
            path=path,
            line=line_of(ends[0]),
            column=column_of(ends[0]),
            hint=hint,
        )
    return body_start + begins[0] + len(STATUS_BEGIN), body_start + ends[0]


def _load_yaml(yaml_text: str, *, path: Path, line_offset: int) -> tuple[Any, Any]:
    """Round-trip load, so every mapping and sequence knows the line/column of its items, as
    ``(data, node)``: the text is composed once and the data constructed from that node tree
    (what ``YAML.load`` does inside), which is kept for the rewrite."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # e.g. a reused anchor: legal YAML, not our concern
            yaml = YAML(typ="rt")
            node = yaml.compose(yaml_text)
            return (yaml.constructor.construct_document(node) if node is not None else None), node
    except MarkedYAMLError as error:
        mark = error.problem_mark or error.context_mark
        problem = " ".join(p for p in (error.context, error.problem) if p) or "invalid YAML"
        raise PlanError(
            f"YAML syntax error: {problem}",
            path=path,
            line=mark.line + line_offset + 1 if mark else None,
            column=mark.column + 1 if mark else None,
        ) from None
    except YAMLError as error:
        raise PlanError(f"YAML error: {error}", path=path, line=line_offset + 1) from None


def _to_plain(data: Any, *, path: Path, line_offset: int = 0) -> Any:
    """Copy ruamel's round-trip objects into plain dicts, lists and scalars for pydantic.

    A string holding a lone surrogate (``"\\ud800"``: a YAML escape that names no character)
    is refused at its position: no file, terminal or commit could take it later. A surrogate
    pair (``"\\ud83d\\ude00"``, as JSON writes one character) is read as that character.
    """
    budget = [_MAX_NODES]

    def convert(value: Any, loc: tuple[Any, ...]) -> Any:
        budget[0] -= 1
        if budget[0] < 0 or len(loc) > _MAX_DEPTH:
            raise PlanError("the plan is too large or nested too deeply (recursive alias?)", path=path)
        if isinstance(value, dict):
            return {_text(key, loc): convert(item, (*loc, key)) for key, item in value.items()}
        if isinstance(value, list):
            return [convert(item, (*loc, index)) for index, item in enumerate(value)]
        if isinstance(value, (bool, ScalarBoolean)):
            return bool(value)
        if isinstance(value, int):
            return int(value)
        if isinstance(value, float):
            return float(value)
        if isinstance(value, str):
            return _text(value, loc)
        return value

    def _text(value: Any, loc: tuple[Any, ...]) -> Any:
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                try:  # "\\ud83d\\ude00" (JSON's way to write one character): join the pair
                    return value.encode("utf-16", "surrogatepass").decode("utf-16")
                except UnicodeDecodeError:
                    pass
                _, (line, column), _ = _walk(data, loc)
                raise PlanError(
                    f"the text '{one_line(value)[:60]}' holds a lone surrogate "
                    "(an escape such as \\ud800 that names no character)",
                    path=path, line=line + line_offset + 1, column=column + 1, key=_key_path(loc) or None,
                    hint="write the character itself, or a \\U escape of a real code point",
                ) from None
            return str(value)
        return value

    return convert(data, ())


# --- pydantic errors -> PlanError ---------------------------------------------------------


def _plan_error_from_validation(
    error: ValidationError, data: Any, *, path: Path, line_offset: int
) -> PlanError:
    """The first problem in file order, located and explained.

    A missing key is reported last: its location (the enclosing mapping) is vague, and it
    is often just the other half of a misspelled key that is reported precisely.
    """
    details = error.errors()
    problems = [_describe(detail, data, path=path, line_offset=line_offset) for detail in details]
    order = sorted(
        range(len(problems)),
        key=lambda i: (details[i]["type"] == "missing", problems[i].line or 0, problems[i].column or 0),
    )
    return problems[order[0]]


def _describe(detail: Any, data: Any, *, path: Path, line_offset: int) -> PlanError:
    ctx = detail.get("ctx") or {}
    loc = tuple(detail["loc"]) + tuple(ctx.get("at", ()))
    kind = detail["type"]
    found, (line, column), key_pos = _walk(data, loc)
    message, hint = str(detail["msg"]), ctx.get("hint")
    message = message.removeprefix("Value error, ")
    if kind == "missing":
        missing_name = loc[len(found)]
        found = (*found, missing_name)
        message = f"missing required key '{missing_name}'"
    elif kind == "extra_forbidden":
        line, column = key_pos
        name = str(loc[-1])
        message = f"unknown key '{name}'"
        hint = hint or _closest_hint(name, _keys_of(_type_at(loc[:-1])), "valid keys")
    elif kind == "literal_error":
        choices = [str(choice) for choice in get_args(_type_at(loc))]
        message = f"{detail['input']!r} is not one of {', '.join(choices)}"
        hint = hint or _closest_hint(str(detail["input"]), choices, "choices")
    elif kind == "string_pattern_mismatch" and detail["ctx"].get("pattern") == ID_PATTERN:
        message = f"{detail['input']!r} is not a valid id: use {ID_RULE}"
    elif kind.endswith("_type") and len(found) == len(loc):
        message = f"{message[0].lower()}{message[1:]}, got {_type_name(detail['input'])}"
        if kind == "string_type" and not isinstance(detail["input"], (dict, list)):
            hint = hint or "quote the value"
    return PlanError(
        message,
        path=path,
        line=line + line_offset + 1,
        column=column + 1,
        key=_key_path(found) or None,
        hint=hint,
    )


def _walk(data: Any, loc: tuple[Any, ...]) -> tuple[tuple[Any, ...], tuple[int, int], tuple[int, int]]:
    """Follow ``loc`` into the round-trip data as far as it exists.

    Returns the part of ``loc`` that exists, the 0-based (line, column) of the deepest
    value reached and of its key (for mappings; the item for sequences).
    """
    node = data
    position = _own_position(data, default=(0, 0))
    key_position = position
    found: list[Any] = []
    for part in loc:
        if isinstance(node, CommentedMap) and _hashable(part) and part in node:
            try:
                key_position = tuple(node.lc.key(part))
                position = tuple(node.lc.value(part))
            except (KeyError, TypeError):  # a key that came in through a merge (<<: *alias)
                key_position = position
            node = node[part]
        elif isinstance(node, CommentedSeq) and isinstance(part, int) and 0 <= part < len(node):
            key_position = position = tuple(node.lc.item(part))
            node = node[part]
        else:
            break
        position = _own_position(node, default=position)
        found.append(part)
    return tuple(found), position, key_position  # type: ignore[return-value]


def _own_position(node: Any, *, default: tuple[int, int]) -> tuple[int, int]:
    """Where a mapping or sequence starts (ruamel records it); ``default`` for scalars."""
    if isinstance(node, (CommentedMap, CommentedSeq)) and node.lc.line is not None:
        return node.lc.line, node.lc.col
    return default


def _hashable(value: Any) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True


def _key_path(loc: tuple[Any, ...]) -> str:
    """``('phases', 1, 'gates', 0, 'kind')`` -> ``phases[1].gates[0].kind``."""
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def _type_at(loc: tuple[Any, ...]) -> Any:
    """The annotation the schema expects at ``loc`` (a model class, a Literal, ...)."""
    current: Any = Plan
    for part in loc:
        current = _unwrap(current)
        if isinstance(current, type) and issubclass(current, BaseModel):
            fields = {field.alias or name: field for name, field in current.model_fields.items()}
            if part not in fields:
                return None
            current = fields[part].annotation
        elif get_origin(current) is list and isinstance(part, int):
            current = get_args(current)[0]
        elif get_origin(current) is dict:
            current = get_args(current)[1]
        else:
            return None
    return _unwrap(current)


def _unwrap(annotation: Any) -> Any:
    """Strip ``Annotated`` and ``X | None`` down to the interesting type."""
    while True:
        if get_origin(annotation) is Annotated:
            annotation = get_args(annotation)[0]
            continue
        if get_origin(annotation) in (Union, types.UnionType):
            members = [arg for arg in get_args(annotation) if arg is not type(None)]
            if len(members) == 1:
                annotation = members[0]
                continue
        return annotation


def _keys_of(model: Any) -> list[str]:
    if isinstance(model, type) and issubclass(model, BaseModel):
        return [field.alias or name for name, field in model.model_fields.items()]
    return []


def _closest_hint(name: str, choices: list[str], label: str) -> str | None:
    if not choices:
        return None
    close = difflib.get_close_matches(name, choices, n=1, cutoff=0.75)
    if close:
        return f"did you mean '{close[0]}'?"
    return f"{label}: {', '.join(choices)}"


def _type_name(value: Any) -> str:
    """How YAML would describe a value's type."""
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return f"the integer {value}"
    if isinstance(value, float):
        return f"the number {value}"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, (dt.date, dt.datetime)):
        return f"a date/time ({value})"
    if value is None:
        return "nothing (null)"
    return type(value).__name__


# --- which plan ---------------------------------------------------------------------------


def find_plan(repo_root: Path, explicit: Path | None) -> Path:
    """The plan a command works on.

    In order: ``explicit`` (relative to the working directory, else to ``repo_root``;
    it must exist); ``[tool.runner] plan`` in ``pyproject.toml``; the only plan file in
    ``plans/``. Otherwise a ``UsageError`` listing the candidates.
    """
    if explicit is not None:
        for candidate in (explicit, repo_root / explicit):
            if candidate.is_file():
                return candidate.resolve()
        raise UsageError(f"plan file not found: {explicit}")
    configured = _configured_plan(repo_root)
    if configured is not None:
        return configured
    candidates = plan_candidates(repo_root / "plans")
    if len(candidates) == 1:
        return candidates[0].resolve()
    listing = ", ".join(str(path.relative_to(repo_root)) for path in candidates) or "none"
    raise UsageError(
        f"cannot tell which plan to use (plans found in plans/: {listing}); pass --plan PATH "
        "or set [tool.runner] plan = \"...\" in pyproject.toml"
    )


def plan_candidates(plans_dir: Path) -> list[Path]:
    """Files directly in ``plans_dir`` that look like plans (their YAML has ``phases``)."""
    if not plans_dir.is_dir():
        return []
    return [
        path
        for path in sorted(plans_dir.iterdir())
        if path.is_file() and path.suffix.lower() in PLAN_SUFFIXES and _looks_like_plan(path)
    ]


def _looks_like_plan(path: Path) -> bool:
    """A cheap test that does not need the file to be valid: a top-level ``phases:`` key."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False
    if plan_format(path) == "markdown":
        opening = _OPENING_LINE.match(text.removeprefix("\ufeff"))
        if opening is None:
            return False
        text = text.removeprefix("\ufeff")
        closing = _CLOSING_LINE.search(text, opening.end())
        text = text[opening.end() : closing.start() if closing else len(text)]
    return _PHASES_KEY.search(text) is not None


def _configured_plan(repo_root: Path) -> Path | None:
    """``[tool.runner] plan`` from ``pyproject.toml``, checked to exist; None if unset."""
    pyproject = repo_root / "pyproject.toml"
    if not pyproject.is_file():
        return None
    try:
        config = tomllib.loads(pyproject.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as error:
        raise UsageError(f"cannot read {pyproject}: {error}") from None
    value = config.get("tool", {}).get("runner", {}).get("plan")
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise UsageError(f"{pyproject}: [tool.runner] plan must be a path string, got {value!r}")
    plan = repo_root / value
    if not plan.is_file():
        raise UsageError(f"{pyproject}: [tool.runner] plan = {value!r} does not exist")
    return plan.resolve()
