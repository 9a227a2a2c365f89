"""The plan schema, version 1: ``Plan`` > ``Phase`` > ``Gate``, plus the ``Checkpoint`` record.

Every model forbids unknown keys and validates strictly (no silent ``"900"`` -> ``900``),
so a typo in a plan is an error with a location, not a setting that is quietly ignored.
Models are frozen: status changes go through ``runner.plan.rewrite``, never by mutation.
"""

from __future__ import annotations

import datetime as dt
import math
import re
from typing import Annotated, Any, Literal, get_args

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StringConstraints,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from runner.errors import UsageError
from runner.plan.samples import DEFAULT_CONFIDENCE, representative
from runner.plan.thresholds import Threshold

SCHEMA_VERSION = 1

GateKind = Literal["build", "verify", "benchmark"]
PhaseStatus = Literal["pending", "complete", "failed", "blocked"]

GATE_KINDS: tuple[GateKind, ...] = get_args(GateKind)
PHASE_STATUSES: tuple[PhaseStatus, ...] = get_args(PhaseStatus)

# Letters, digits, "_", "." and "-", neither first nor last a "." or "-": an id is its own folder
# name under reports/ (``safe_name(id) == id``) and part of a git tag name.
ID_PATTERN = r"^[A-Za-z0-9](?:[A-Za-z0-9_.-]*[A-Za-z0-9_])?$"
ID_RULE = "letters, digits, '_', '.' and '-', starting with a letter or digit and not ending in '.' or '-'"
CALL_PATTERN = r"^[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*:[A-Za-z_]\w*$"
MODULE_PREFIX = "module:"
"""A ``requires:`` entry ``module:NAME`` needs the Python module NAME (``Gate.required_modules``)."""
MODULE_PATTERN = r"^[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*$"

Identifier = Annotated[str, StringConstraints(pattern=ID_PATTERN)]
MetricValue = bool | int | float | str

MAX_REPEAT = 1000
"""The most times one gate may be repeated (``repeat:``)."""

MAX_PLAN_STRING = 200
"""The most characters of a string metric the runner writes into a plan (a checkpoint's
``metrics`` and ``open_targets``, and so the status table and the commit message): a longer
one is cut to its first ``MAX_PLAN_STRING - 1`` characters and ``…``. The run's report and
``results.json`` keep the whole value."""


def plan_value(value: object) -> MetricValue | None:
    """``value`` as the runner writes it into a plan: a string cut to ``MAX_PLAN_STRING``
    characters (see there), a list of samples as its median; anything else unchanged."""
    if isinstance(value, str) and len(value) > MAX_PLAN_STRING:
        return value[: MAX_PLAN_STRING - 1] + "\u2026"
    if isinstance(value, list):
        return representative(value)
    return value  # type: ignore[return-value]


def _parse_tolerance(value: object) -> object:
    """A relative tolerance: a number such as ``0.05``, or a percentage string ``"5%"``."""
    if isinstance(value, bool):
        raise PydanticCustomError(
            "tolerance_bool", "a tolerance is a number like 0.05 or a string like \"5%\", got {value}",
            {"value": str(value)},
        )
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        text = value.strip()
        try:
            return float(text[:-1]) / 100 if text.endswith("%") else float(text)
        except ValueError:
            pass
        raise PydanticCustomError(
            "tolerance",
            "cannot read tolerance '{value}': write a relative tolerance like 0.05 or \"5%\"",
            {"value": value},
        )
    return value


def _check_confidence(value: object) -> object:
    """A confidence is a fraction strictly between 0 and 1 (``0.95``), never a percentage."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1:
        raise PydanticCustomError(
            "confidence",
            "a confidence is a fraction between 0 and 1 such as 0.95 (for 95%), got {value}",
            {"value": repr(value)},
        )
    return float(value)


def _check_repeat(value: object) -> object:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_REPEAT:
        raise PydanticCustomError(
            "repeat",
            "repeat is how many times the gate runs, a whole number from 1 to {most}, got {value}",
            {"value": repr(value), "most": MAX_REPEAT},
        )
    return value


Confidence = Annotated[float, BeforeValidator(_check_confidence)]
Repeat = Annotated[int, BeforeValidator(_check_repeat)]

Tolerance = Annotated[float, BeforeValidator(_parse_tolerance), Field(ge=0, allow_inf_nan=False)]
"""How much worse than its baseline a metric may get before a diff calls it a regression."""

DEFAULT_TOLERANCE = 0.10
"""The tolerance of a metric with a threshold or a target and no ``tolerance:`` (asv's default
factor of 1.1): a change for the worse beyond it is a regression, and the verdict says the
default was used."""


def _timestamp_to_text(value: object) -> object:
    """YAML reads an unquoted ``2026-11-29T23:50:00Z`` as a datetime; keep it as text."""
    if isinstance(value, dt.datetime):
        if value.tzinfo is not None and value.utcoffset() == dt.timedelta(0):
            return value.replace(tzinfo=None).isoformat() + "Z"
        return value.isoformat()
    return value


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, populate_by_name=True)


class Gate(_Model):
    """One check of a phase: a shell command (``run``) or a Python callable (``call``).

    ``expect`` maps metrics to the thresholds a pass needs; ``targets`` maps metrics to what
    the team aims at, in the same syntax: a missed target is shown with its gap and never
    changes a verdict. ``tolerance`` maps metrics to the relative change for the worse
    (``0.05`` or ``"5%"``) that ``runner diff`` and ``runner gate --baseline`` accept before they
    call a run a regression against a baseline from the same machine (for samples, the change
    of the median, and only when a rank test at ``confidence`` finds it significant:
    ``runner.views.significance``); a metric with a threshold or a target that it leaves out
    is judged with ``DEFAULT_TOLERANCE``.

    ``repeat`` runs the gate that many times (each with its own ``timeout``) and collects each
    number it reports into samples; a gate may also report a list of numbers itself. A
    threshold on samples is judged on the ``confidence`` interval of their median
    (``runner.plan.samples``); a single number is judged as it is.

    ``requires`` names what the gate needs to run here: devices (``cuda``: the machine has
    one) and ``module:NAME`` entries (the gate's interpreter finds the Python module NAME,
    ``runner.gates.requirements``). A gate that lacks either is BLOCKED, never run.
    """

    name: Identifier
    kind: GateKind
    run: str | None = None
    call: Annotated[str, StringConstraints(pattern=CALL_PATTERN)] | None = None
    args: dict[str, Any] = Field(default_factory=dict)
    env: dict[str, str] = Field(default_factory=dict)
    requires: list[str] = Field(default_factory=list)
    timeout: float = Field(default=3600.0, gt=0)
    expect: dict[str, Threshold] = Field(default_factory=dict)
    targets: dict[str, Threshold] = Field(default_factory=dict)
    tolerance: dict[str, Tolerance] = Field(default_factory=dict)
    repeat: Repeat = 1
    confidence: Confidence = DEFAULT_CONFIDENCE

    @field_validator("requires")
    @classmethod
    def _module_names(cls, requires: list[str]) -> list[str]:
        for index, entry in enumerate(requires):
            name = entry[len(MODULE_PREFIX):] if entry.startswith(MODULE_PREFIX) else None
            if name is not None and not re.match(MODULE_PATTERN, name):
                raise PydanticCustomError(
                    "requires_module",
                    "'{entry}' names no Python module: write module:NAME with NAME a dotted module name "
                    "such as module:flash_mla",
                    {"entry": entry, "at": (index,)},
                )
        return requires

    def required_devices(self) -> list[str]:
        """The ``requires`` entries that name a device (``cuda``): every entry but ``module:NAME``."""
        return [entry for entry in self.requires if not entry.startswith(MODULE_PREFIX)]

    def required_modules(self) -> list[str]:
        """The Python modules named by ``module:NAME`` entries of ``requires``, in order."""
        return [entry[len(MODULE_PREFIX):] for entry in self.requires if entry.startswith(MODULE_PREFIX)]

    @model_validator(mode="after")
    def _one_command(self) -> Gate:
        if (self.run is None) == (self.call is None):
            both = self.run is not None
            raise PydanticCustomError(
                "gate_command",
                "a gate needs exactly one of 'run' (shell command) or 'call' "
                "(module:function), got {got}",
                {"got": "both" if both else "neither", "at": ("call",) if both else ()},
            )
        if self.args and self.call is None:
            raise PydanticCustomError(
                "gate_args",
                "'args' only applies to a 'call' gate; pass arguments in the 'run' command",
                {"at": ("args",)},
            )
        if self.run is not None and not self.run.strip():
            raise PydanticCustomError("gate_run", "'run' is an empty command", {"at": ("run",)})
        return self


class OpenTarget(_Model):
    """A target a checkpoint left open: the target and the value the run reached (``None``
    when the gate did not report the metric). For a metric reported as samples, ``value`` is
    their median and ``low``/``high`` the interval of the median at ``confidence`` over
    ``samples`` samples: the target was judged on that interval, so a median that meets it
    still left it open, and a view re-judges it on the interval, never on the median."""

    target: Threshold
    value: MetricValue | None = None
    low: float | None = None
    high: float | None = None
    samples: int | None = Field(default=None, ge=1)
    confidence: float | None = Field(default=None, gt=0, lt=1)

    @model_validator(mode="after")
    def _interval_whole(self) -> "OpenTarget":
        given = [self.low is not None, self.high is not None, self.samples is not None, self.confidence is not None]
        if any(given) and not all(given):
            raise PydanticCustomError(
                "open_target_interval",
                "an open target's interval needs 'low', 'high', 'samples' and 'confidence' together",
                {},
            )
        if all(given) and not (math.isfinite(self.low) and math.isfinite(self.high) and self.low <= self.high):
            raise PydanticCustomError(
                "open_target_interval",
                "an open target's interval needs finite 'low' <= 'high', got [{low}, {high}]",
                {"low": str(self.low), "high": str(self.high)},
            )
        return self

    def record(self) -> dict[str, Any]:
        """The target as the plan writes it: the interval's keys only for a sampled metric."""
        data = self.model_dump(mode="json")
        if self.samples is None:
            for key in ("low", "high", "samples", "confidence"):
                del data[key]
        return data


class Checkpoint(_Model):
    """What the runner records in a phase when it checkpoints it (see ARCHITECTURE.md);
    ``open_targets`` names the targets of the phase's gates that the checkpointed run missed."""

    tag: str
    base: str
    fingerprint: str
    time: Annotated[str, BeforeValidator(_timestamp_to_text)]
    report: str
    metrics: dict[str, MetricValue] = Field(default_factory=dict)
    open_targets: dict[str, OpenTarget] = Field(default_factory=dict)


class Phase(_Model):
    """A step of the plan: its gates, its status and, once complete, its checkpoint."""

    id: Identifier
    title: str = ""
    status: PhaseStatus = "pending"
    paths: list[str] = Field(default_factory=list)
    headline: list[str] | None = None
    gates: list[Gate] = Field(min_length=1)
    checkpoint: Checkpoint | None = None

    @field_validator("gates")
    @classmethod
    def _unique_gate_names(cls, gates: list[Gate]) -> list[Gate]:
        _reject_duplicates([gate.name for gate in gates], what="gate name", field="name")
        return gates

    def headline_metrics(self) -> list[str]:
        """Metric names copied into the checkpoint: ``headline`` if given, else every
        metric named in an ``expect``, in order of first appearance."""
        if self.headline is not None:
            return list(self.headline)
        names: dict[str, None] = {}
        for gate in self.gates:
            names.update(dict.fromkeys(gate.expect))
        return list(names)

    def gate(self, name: str) -> Gate:
        """The gate called ``name``; ``UsageError`` naming the known gates otherwise."""
        for gate in self.gates:
            if gate.name == name:
                return gate
        known = ", ".join(gate.name for gate in self.gates)
        raise UsageError(f"phase {self.id!r} has no gate {name!r} (gates: {known})")


class Plan(_Model):
    """A whole plan: an id, a title and the phases in the order they run."""

    schema_version: Literal[1] = Field(alias="schema")
    id: Identifier
    title: str = ""
    phases: list[Phase] = Field(min_length=1)

    @field_validator("phases")
    @classmethod
    def _unique_phase_ids(cls, phases: list[Phase]) -> list[Phase]:
        _reject_duplicates([phase.id for phase in phases], what="phase id", field="id")
        return phases

    def phase(self, phase_id: str) -> Phase:
        """The phase with id ``phase_id``; ``UsageError`` naming the known phases otherwise."""
        for phase in self.phases:
            if phase.id == phase_id:
                return phase
        known = ", ".join(phase.id for phase in self.phases)
        raise UsageError(f"plan {self.id!r} has no phase {phase_id!r} (phases: {known})")


def _reject_duplicates(names: list[str], *, what: str, field: str) -> None:
    """Raise for the first repeated name; ``at`` points the error at the repeat itself."""
    first_index: dict[str, int] = {}
    for index, name in enumerate(names):
        if name in first_index:
            raise PydanticCustomError(
                "duplicate_id",
                "{what} '{name}' is used twice (items {first} and {index}); ids must be unique",
                {
                    "what": what,
                    "name": name,
                    "first": first_index[name],
                    "index": index,
                    "at": (index, field),
                },
            )
        first_index[name] = index
