"""Threshold parsing, checking and pydantic round-trip."""

from __future__ import annotations

import math

import pytest
from pydantic import BaseModel, ValidationError

from runner.plan.thresholds import Threshold


@pytest.mark.parametrize(
    ("text", "op", "value", "canonical"),
    [
        (">= 1.5", ">=", 1.5, ">= 1.5"),
        ("<=2", "<=", 2.0, "<= 2"),
        ("  >   -3 ", ">", -3.0, "> -3"),
        ("< 1e-2", "<", 0.01, "< 1e-2"),
        ("== 0", "==", 0.0, "== 0"),
        ("!= .5", "!=", 0.5, "!= .5"),
        ("== +2.5E3", "==", 2500.0, "== +2.5E3"),
    ],
)
def test_parse_reads_operator_and_number(text: str, op: str, value: float, canonical: str) -> None:
    threshold = Threshold.parse(text)
    assert (threshold.op, threshold.value, threshold.text) == (op, value, canonical)
    assert str(threshold) == canonical
    assert Threshold.parse(str(threshold)) == threshold


@pytest.mark.parametrize(
    "text",
    ["", "1.5", ">=", ">= inf", ">= nan", "=> 1", "= 1", ">= 1.5 x", ">= 1_000", ">= 0x10", "~ 3", ">= - 1"],
)
def test_parse_rejects_malformed_text(text: str) -> None:
    with pytest.raises(ValueError, match="threshold"):
        Threshold.parse(text)


@pytest.mark.parametrize("value", [5, 2.5])
def test_parse_rejects_bare_numbers_with_a_fix(value: object) -> None:
    with pytest.raises(ValueError, match=f'"== {value}"'):
        Threshold.parse(value)  # type: ignore[arg-type]


def test_parse_rejects_booleans() -> None:
    with pytest.raises(ValueError, match="boolean"):
        Threshold.parse(True)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("text", "value", "holds"),
    [
        (">= 1.5", 1.5, True),
        (">= 1.5", 1.49, False),
        ("> 1.5", 1.5, False),
        ("<= 0", -1, True),
        ("< 0", 0, False),
        ("== 0", 0, True),
        ("== 0", 0.0, True),
        ("!= 0", 1, True),
        ("!= 0", 0, False),
        (">= 1", math.inf, True),
        ("< 1", -math.inf, True),
        # NaN, booleans, strings and None never satisfy a threshold.
        (">= 0", math.nan, False),
        ("!= 0", math.nan, False),
        ("== 1", True, False),
        ("!= 5", False, False),
        (">= 0", "1", False),
        ("!= 0", None, False),
    ],
)
def test_check(text: str, value: object, holds: bool) -> None:
    assert Threshold.parse(text).check(value) is holds


class _Expect(BaseModel):
    expect: dict[str, Threshold]


def test_pydantic_validates_and_serializes_back_to_text() -> None:
    model = _Expect.model_validate({"expect": {"speedup": ">=1.5", "errors": "== 0"}})
    assert model.expect["speedup"] == Threshold.parse(">= 1.5")
    assert model.model_dump() == {"expect": {"speedup": ">= 1.5", "errors": "== 0"}}
    assert model.model_dump_json() == '{"expect":{"speedup":">= 1.5","errors":"== 0"}}'
    assert _Expect.model_validate(model.model_dump()) == model


@pytest.mark.parametrize(
    ("value", "fragment"), [(5, "bare value"), (True, "boolean"), ("about 5", "cannot read threshold")]
)
def test_pydantic_error_explains(value: object, fragment: str) -> None:
    with pytest.raises(ValidationError, match=fragment):
        _Expect.model_validate({"expect": {"x": value}})


@pytest.mark.parametrize("text, value, gap", [
    (">= 0.80", 0.63, 0.17), ("<= 0.05", 0.07, 0.02), ("== 0", 3, 3.0), (">= 5", 7.0, 0.0),
    ("!= 0", 0, None), (">= 1", float("nan"), None), (">= 1", "fast", None), (">= 1", True, None),
])
def test_gap_is_the_distance_to_the_threshold(text, value, gap):
    found = Threshold.parse(text).gap(value)
    assert found == pytest.approx(gap) if gap is not None else found is None


def test_reasons_show_four_digits_unless_rounding_would_lie():
    from runner.records.checks import check_thresholds

    [slow] = check_thresholds({"speedup": Threshold.parse(">= 5")}, {"speedup": 1.0570760648926747})
    assert slow.reason == "1.057 is not >= 5" and slow.gap == pytest.approx(3.9429239351)
    [close] = check_thresholds({"ratio": Threshold.parse(">= 1")}, {"ratio": 0.99996})
    assert close.reason == "0.99996 is not >= 1"  # "1 is not >= 1" would read as a contradiction
