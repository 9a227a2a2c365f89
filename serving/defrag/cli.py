"""What ``python -m serving generate`` shows of defragmentation."""

from __future__ import annotations


def defrag_line(summary: dict) -> str:
    """One line from ``Defragmenter.summary()``: fragmentation now, compactions and rows moved."""
    f = summary["fragmentation"]
    state = "on" if summary["enabled"] else "off (--no-defrag)"
    return (
        f"defrag {state}: {summary['compactions']} compactions ({summary['completed']} completed), "
        f"{summary['moved_rows']} rows moved in {summary['steps_moving']} steps; fragmentation {f['runs_per_1k']:.2f} runs "
        f"per 1k tokens (worst request {f['max_runs_per_1k']:.2f}), {f['contiguous_requests']}/{f['requests']} "
        f"requests contiguous, largest free run {f['largest_free_run']} of {f['free_slots']} free slots"
    )
