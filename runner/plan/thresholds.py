"""Metric thresholds written in a plan as ``"<op> <number>"`` strings.

A gate's ``expect`` mapping holds thresholds such as ``speedup: ">= 1.5"`` (what a pass needs),
its ``targets`` mapping the same syntax (what the team aims at). This module parses them,
checks metric values against them, says how far a value is from one (``gap``) and lets pydantic
validate and serialize them as plain strings, so ``dict[str, Threshold]`` round-trips through
YAML. The number must be finite as written: ``1e309`` reads as infinity and is refused.
"""

from __future__ import annotations

import math
import numbers
import operator
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import GetCoreSchemaHandler, GetJsonSchemaHandler
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import PydanticCustomError, core_schema

_COMPARATORS: dict[str, Callable[[float, float], bool]] = {
    ">=": operator.ge,
    "<=": operator.le,
    ">": operator.gt,
    "<": operator.lt,
    "==": operator.eq,
    "!=": operator.ne,
}

# Two-character operators first, so ">=" is not read as ">" followed by "=1.5".
_OPERATOR = r"(?P<op>>=|<=|==|!=|>|<)"
# A finite decimal float literal: 1, -3, +2.5, .5, 5., 1e-2. No inf, nan, hex or underscores.
_NUMBER = r"(?P<number>[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)"
_THRESHOLD = re.compile(rf"\s*{_OPERATOR}\s*{_NUMBER}\s*")

_EXAMPLE = '">= 1.5" or "== 0"'


@dataclass(frozen=True)
class Threshold:
    """One comparison a metric must satisfy, e.g. ``>= 1.5``.

    ``op`` is one of ``>=``, ``<=``, ``>``, ``<``, ``==``, ``!=``; ``value`` the finite
    number to compare against; ``text`` the canonical form ``"<op> <number>"`` with the
    number as written (``"==5"`` becomes ``"== 5"``).
    """

    op: str
    value: float
    text: str

    @classmethod
    def parse(cls, text: str) -> Threshold:
        """Parse ``"<op> <number>"``; raise ``ValueError`` saying what is wrong and how to fix it."""
        if isinstance(text, bool):
            raise ValueError(f"a threshold must be a quoted string like {_EXAMPLE}, got the boolean {text}")
        if isinstance(text, numbers.Number):
            raise ValueError(
                f"a threshold must be a quoted string like {_EXAMPLE}, got the bare value "
                f"{text!r}; write it with an operator, e.g. \"== {text}\""
            )
        if not isinstance(text, str):
            raise ValueError(
                f"a threshold must be a string like {_EXAMPLE}, got {type(text).__name__}"
            )
        match = _THRESHOLD.fullmatch(text)
        if match is None:
            raise ValueError(
                f"cannot read threshold {text!r}: expected '<op> <number>' with op one of "
                f">=, <=, >, <, ==, != and a finite number, e.g. {_EXAMPLE}"
            )
        op, number = match["op"], match["number"]
        value = float(number)
        if not math.isfinite(value):
            raise ValueError(
                f"cannot read threshold {text!r}: {number} is beyond the range of a float and "
                "would read as infinite; thresholds are finite numbers"
            )
        return cls(op=op, value=value, text=f"{op} {number}")

    def check(self, value: object) -> bool:
        """Whether ``value`` satisfies this threshold.

        Only real numbers can pass: NaN, booleans, strings and ``None`` never do, so a
        missing or unmeasured metric is never mistaken for a passing one.
        """
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            return False
        number = float(value)
        if math.isnan(number):
            return False
        return _COMPARATORS[self.op](number, self.value)

    def gap(self, value: object) -> float | None:
        """How far ``value`` is from meeting this threshold: 0 when it does, the distance to
        the bound when it does not (``>= 0.8`` with 0.63: 0.17), ``None`` when no distance
        says it (not a finite number, or a missed ``!=``)."""
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(float(value)):
            return None
        if self.check(value):
            return 0.0
        if self.op == "!=":
            return None
        return abs(float(value) - self.value)

    def __str__(self) -> str:
        return self.text

    # pydantic integration: validate from a string, serialize back to the canonical string.
    @classmethod
    def __get_pydantic_core_schema__(
        cls, source_type: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        return core_schema.no_info_plain_validator_function(
            _validate_threshold,
            serialization=core_schema.plain_serializer_function_ser_schema(str),
        )

    @classmethod
    def __get_pydantic_json_schema__(
        cls, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        return {"type": "string", "pattern": _THRESHOLD.pattern, "examples": [">= 1.5", "== 0"]}


def _validate_threshold(value: object) -> Threshold:
    """Pydantic validator: accept a ``Threshold`` or its text; explain bare numbers."""
    if isinstance(value, Threshold):
        return value
    if isinstance(value, bool):
        raise PydanticCustomError(
            "threshold_bool",
            "a threshold must be a quoted string like {example}, got the boolean {value}",
            {"value": str(value), "example": _EXAMPLE},
        )
    if isinstance(value, numbers.Number):
        raise PydanticCustomError(
            "threshold_bare_number",
            "a threshold must be a quoted string with an operator, got the bare value {value}",
            {"value": repr(value), "hint": f'quote it with an operator, e.g. "== {value}"'},
        )
    try:
        return Threshold.parse(value)  # type: ignore[arg-type]
    except ValueError as error:
        raise PydanticCustomError("threshold", "{reason}", {"reason": str(error)}) from None
