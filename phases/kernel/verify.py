"""Verify gate: the kernel against the float64 reference over a profile of seeded cases.

Per case: build inputs, poison a preallocated ``out`` (and a guard region after it) with NaN,
call the kernel with ``out=``, require that it returned ``out``, wrote every element, wrote
nothing past it, matches the float64 reference per request (relative Frobenius error) and
gives bitwise the same result on a second call. A case that raises is a failed case; the
gate goes on with the next one.

The error is also judged against what the input precision allows (flash-attention's rule):
the same reference computed in the input dtype (bf16/fp16 scores, softmax and products) has
its own error against float64, and the kernel's error may be at most ``max_err_ratio`` (2)
times that, plus a tiny absolute floor (``ERR_FLOOR``) for cases both get exactly right.

Both kernel paths: on the GPU every case runs through the Triton path (``backend="triton"``) and,
where the Hopper path serves it (an sm_90 device with Gluon; bf16, D=576/DV=512, int32 indices),
through the Hopper path too (``backend="hopper"``), each run checked on its own against the same
references. ``cases`` counts every checked run, ``cases_hopper`` / ``cases_triton`` those of
each path. The interpret profile runs the Triton path only (Gluon does not run in the interpreter).

Gate: ``call: phases.kernel.verify:run`` with ``args: {profile: full}`` (CUDA) or
``{profile: interpret}`` (CPU, with ``TRITON_INTERPRET=1`` in the gate's env).
Standalone: ``python -m phases.kernel.verify --profile interpret [--limit N] [--json]``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import partial

import torch

from kernel.reference import mla_verify_reference
from phases.kernel.bench.cases import (
    PROFILES,
    Case,
    build_inputs,
    fast_path_args,
    max_request_rel_err,
)
from runner import gatekit

GUARD_ELEMENTS = 4096  # NaN-poisoned elements after `out` that the kernel must leave alone
ERR_FLOOR = 1e-5  # relative error below which a same-precision reference counts as exact
MAX_ERR_RATIO = 2.0
ERROR_TEXT_LIMIT = 2000


@dataclass
class CaseResult:
    """Outcome of one case; ``max_rel_err`` is None when it could not be measured."""

    index: int
    case: str
    ok: bool
    path: str = "triton"  # the kernel path checked: "triton", "hopper" (or "custom" for a given function)
    max_rel_err: float | None = None
    ref_rel_err: float | None = None  # the input-dtype reference's error vs float64
    err_ratio: float | None = None  # max_rel_err / (ref_rel_err + ERR_FLOOR)
    non_finite: bool = False
    deterministic: bool | None = None
    returned_out: bool | None = None
    overrun: bool = False
    error: str | None = None
    seconds: float = 0.0


def run(
    profile: str = "full",
    seed: int = 0,
    limit: int | None = None,
    tol: float = 1e-2,
    attention_fn: Callable[..., torch.Tensor] | None = None,
    max_err_ratio: float = MAX_ERR_RATIO,
) -> dict:
    """Run the verify profile and return the gate's metrics.

    Args:
        profile: ``"full"`` (CUDA, ``full_cases``) or ``"interpret"`` (CPU, ``interpret_cases``).
        seed: case generator seed.
        limit: run only the first ``limit`` cases (None: all).
        tol: per-case bound on the largest per-request relative error.
        attention_fn: the function under test, with the signature of
            ``kernel.mla_verify_attention`` (None: that function, once per kernel path:
            ``backend="triton"`` for every case and ``backend="hopper"`` for the cases it serves).
        max_err_ratio: per-case bound on the kernel's error over the input-dtype reference's.
    Returns:
        ``{"cases", "cases_failed", "max_rel_err", "max_err_ratio", "nan_cases", "nondeterministic",
        "overrun_cases", "not_out_cases", "errors", "elapsed_s", "profile", "cases_hopper",
        "cases_triton", "cases_failed_hopper", "cases_failed_triton"}``: ``cases`` and every other
        count over all checked runs (one per case and path); ``max_rel_err`` and ``max_err_ratio``
        are NaN when no case could be measured.
    """
    if profile not in PROFILES:
        raise ValueError(f"Expected profile in {sorted(PROFILES)}, got {profile!r}")
    device = _device_for(profile)
    if attention_fn is None and profile == "interpret" and os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError(
            "Profile 'interpret' runs the kernel on CPU tensors and needs TRITON_INTERPRET=1 set before "
            "the kernel is imported (the plan's gate sets it in env:)"
        )
    paths = kernel_paths(device) if attention_fn is None else {"custom": attention_fn}
    cases = PROFILES[profile](seed)
    if limit is not None:
        cases = cases[:limit]

    started = time.perf_counter()
    results: list[CaseResult] = []
    for index, case in enumerate(cases):
        fns = {path: fn for path, fn in paths.items() if path != "hopper" or hopper_serves(case)}
        results.extend(check_case(index, case, device, fns, tol, max_err_ratio))
        gatekit.progress(index + 1, len(cases))
    metrics = summarize(results, profile=profile, elapsed_s=time.perf_counter() - started)
    write_artifacts(profile, results, metrics)
    return metrics


def kernel_paths(device: torch.device) -> dict[str, Callable[..., torch.Tensor]]:
    """The kernel paths to check on ``device``: the Triton path always, the Hopper path where it
    can run (an sm_90 device with Gluon, outside Triton's interpreter)."""
    # Imported here, not at the top: the kernel reads TRITON_INTERPRET when it is imported.
    from kernel import mla_verify_attention
    from kernel.bench_api import hopper

    paths = {"triton": partial(mla_verify_attention, backend="triton")}
    if hopper.available(device):
        paths["hopper"] = partial(mla_verify_attention, backend="hopper")
    return paths


def hopper_serves(case: Case) -> bool:
    """Whether the Hopper path takes ``case``'s inputs (``kernel.hopper.supported``): bf16,
    D=576 / DV=512, int32 indices (either KV layout, either mask type)."""
    return case.dtype == "bf16" and (case.head_dim, case.v_head_dim) == (576, 512) and case.index_dtype == "int32"


def check_case(
    index: int,
    case: Case,
    device: torch.device,
    attention_fns: dict[str, Callable[..., torch.Tensor]],
    tol: float,
    max_err_ratio: float = MAX_ERR_RATIO,
) -> list[CaseResult]:
    """Run one case through every check, once per path in ``attention_fns`` (the inputs and the
    references are built once); never raises (an exception becomes that run's ``error``)."""
    results = []
    shared: dict = {}
    for path, attention_fn in attention_fns.items():
        results.append(_check_path(index, case, device, path, attention_fn, tol, max_err_ratio, shared))
    return results


def _check_path(
    index: int,
    case: Case,
    device: torch.device,
    path: str,
    attention_fn: Callable[..., torch.Tensor],
    tol: float,
    max_err_ratio: float,
    shared: dict,
) -> CaseResult:
    """One path's run of one case. ``shared`` caches the inputs and references across paths."""
    started = time.perf_counter()
    result = CaseResult(index=index, case=case.describe(), ok=False, path=path)
    try:
        if "inputs" not in shared:
            shared["inputs"] = build_inputs(case, device)
        inputs = shared["inputs"]
        if case.fast_path and path != "custom":  # the kernel paths are told each request's contiguous run
            attention_fn = partial(attention_fn, **fast_path_args(inputs))
        first = _call_poisoned(attention_fn, inputs, case, result)
        result.non_finite = not bool(torch.isfinite(first).all())
        if "reference" not in shared:
            shared["reference"] = mla_verify_reference(**inputs, compute_dtype=torch.float64, out_dtype=torch.float64)
        reference = shared["reference"]
        if "ref_rel_err" not in shared:
            same_precision = mla_verify_reference(**inputs, compute_dtype=inputs["q"].dtype)
            shared["ref_rel_err"] = max_request_rel_err(same_precision, reference, inputs["qo_indptr"])
        result.ref_rel_err = shared["ref_rel_err"]
        if not result.non_finite:
            result.max_rel_err = max_request_rel_err(first, reference, inputs["qo_indptr"])
            result.err_ratio = result.max_rel_err / (result.ref_rel_err + ERR_FLOOR)
        second = _call_poisoned(attention_fn, inputs, case, result)
        result.deterministic = torch.equal(_bits(first), _bits(second))
        result.ok = (
            result.returned_out is True
            and not result.non_finite
            and not result.overrun
            and result.deterministic
            and result.max_rel_err is not None
            and result.max_rel_err <= tol
            and result.err_ratio <= max_err_ratio
        )
    except Exception as exc:  # a raising case is a failed case; keep going
        result.error = f"{type(exc).__name__}: {exc}"[:ERROR_TEXT_LIMIT]
        if isinstance(exc, torch.cuda.OutOfMemoryError):
            torch.cuda.empty_cache()
    result.seconds = round(time.perf_counter() - started, 4)
    return result


def summarize(results: list[CaseResult], *, profile: str, elapsed_s: float) -> dict:
    """The gate's metrics from the per-case results."""
    measured = [r.max_rel_err for r in results if r.max_rel_err is not None]
    ratios = [r.err_ratio for r in results if r.err_ratio is not None]
    return {
        "profile": profile,
        "cases": len(results),
        "cases_failed": sum(not r.ok for r in results),
        "max_rel_err": max(measured) if measured else math.nan,
        "max_err_ratio": max(ratios) if ratios else math.nan,
        "nan_cases": sum(r.non_finite for r in results),
        "nondeterministic": sum(r.deterministic is False for r in results),
        "overrun_cases": sum(r.overrun for r in results),
        "not_out_cases": sum(r.returned_out is False for r in results),
        "errors": sum(r.error is not None for r in results),
        "elapsed_s": round(elapsed_s, 3),
        "cases_hopper": sum(r.path == "hopper" for r in results),
        "cases_triton": sum(r.path == "triton" for r in results),
        "cases_failed_hopper": sum(r.path == "hopper" and not r.ok for r in results),
        "cases_failed_triton": sum(r.path == "triton" and not r.ok for r in results),
    }


def write_artifacts(profile: str, results: list[CaseResult], metrics: dict) -> None:
    """``verify-<profile>.json`` (per-case results) and ``verify-<profile>.md`` (summary), as
    runner artifacts (nothing outside the runner)."""
    gatekit.write_artifact(f"verify-{profile}.json", json.dumps([asdict(r) for r in results], indent=1))
    gatekit.write_artifact(f"verify-{profile}.md", summary_markdown(profile, results, metrics))


def summary_markdown(profile: str, results: list[CaseResult], metrics: dict) -> str:
    """A short Markdown report: the metrics, then every failed case."""
    lines = [f"# Verify ({profile})", "", "| metric | value |", "|---|---|"]
    lines += [f"| {name} | {value} |" for name, value in metrics.items()]
    failed = [r for r in results if not r.ok]
    lines += ["", f"## Failed cases ({len(failed)})", ""]
    if not failed:
        lines.append("None.")
    for r in failed[:100]:
        reason = r.error or _failure_reason(r)
        lines.append(f"- #{r.index} [{r.path}] `{r.case}`: {reason}")
    if len(failed) > 100:
        lines.append(f"- ... and {len(failed) - 100} more (see the JSON)")
    return "\n".join(lines) + "\n"


def _failure_reason(result: CaseResult) -> str:
    reasons = []
    if result.returned_out is False:
        reasons.append("did not return `out`")
    if result.non_finite:
        reasons.append("NaN/inf left in the output (elements not written)")
    if result.overrun:
        reasons.append("wrote past the end of `out`")
    if result.deterministic is False:
        reasons.append("second call differs bitwise")
    if result.max_rel_err is not None:
        reasons.append(f"max rel err {result.max_rel_err:.3e}")
    if result.err_ratio is not None:
        reasons.append(f"{result.err_ratio:.2f}x the input-dtype reference's error ({result.ref_rel_err:.3e})")
    return "; ".join(reasons)


def _call_poisoned(
    attention_fn: Callable[..., torch.Tensor], inputs: dict, case: Case, result: CaseResult
) -> torch.Tensor:
    """Call the kernel into a NaN-poisoned ``out`` followed by a NaN guard region.

    Records in ``result`` whether the call returned ``out`` and whether it touched the guard.
    Returns a copy of ``out``: ``q.dtype`` ``[N, H, DV]``.
    """
    q = inputs["q"]
    num_tokens, num_heads, _ = q.shape
    out_elements = num_tokens * num_heads * case.v_head_dim
    buffer = torch.full((out_elements + GUARD_ELEMENTS,), math.nan, dtype=q.dtype, device=q.device)
    out = buffer[:out_elements].view(num_tokens, num_heads, case.v_head_dim)
    returned = attention_fn(**inputs, out=out)
    returned_out = returned is out or (
        isinstance(returned, torch.Tensor)
        and returned.data_ptr() == out.data_ptr()
        and returned.shape == out.shape
        and returned.stride() == out.stride()
    )
    result.returned_out = returned_out and result.returned_out is not False
    result.overrun = result.overrun or not bool(buffer[out_elements:].isnan().all())
    return out.clone()


def _bits(tensor: torch.Tensor) -> torch.Tensor:
    """The raw 16-bit patterns of a bf16/fp16 tensor (NaN-safe bitwise comparison)."""
    return tensor.contiguous().view(torch.int16) if tensor.element_size() == 2 else tensor.contiguous()


def _device_for(profile: str) -> torch.device:
    if profile == "interpret":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise RuntimeError(f"Profile {profile!r} needs a CUDA GPU; use profile 'interpret' on a CPU")
    return torch.device("cuda")


def main(argv: list[str] | None = None) -> int:
    """Command line: run a profile, print the summary (or the metrics as JSON), exit 1 on failure."""
    parser = argparse.ArgumentParser(description="Verify mla_verify_attention against the float64 reference.")
    parser.add_argument("--profile", choices=sorted(PROFILES), default="full")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--limit", type=int, default=None, help="run only the first N cases")
    parser.add_argument("--tol", type=float, default=1e-2, help="per-case max relative error")
    parser.add_argument("--max-err-ratio", type=float, default=MAX_ERR_RATIO,
                        help="per-case bound on the error over the input-dtype reference's")
    parser.add_argument("--json", action="store_true", help="print the metrics as one JSON object")
    args = parser.parse_args(argv)
    if args.profile == "interpret" and os.environ.get("TRITON_INTERPRET") != "1":
        # The interpreter must be chosen before triton compiles anything: start again with it set.
        command = [sys.executable, "-m", "phases.kernel.verify", *(sys.argv[1:] if argv is None else argv)]
        os.execve(sys.executable, command, {**os.environ, "TRITON_INTERPRET": "1"})
    metrics = run(profile=args.profile, seed=args.seed, limit=args.limit, tol=args.tol, max_err_ratio=args.max_err_ratio)
    if args.json:
        print(json.dumps(metrics))
    else:
        for name, value in metrics.items():
            print(f"{name:>18}: {value}")
    return 0 if metrics["cases_failed"] == 0 and metrics["cases"] > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
