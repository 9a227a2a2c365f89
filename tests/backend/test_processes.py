"""The capped child's peak memory is its own, whatever the test process holds when it forks."""

from __future__ import annotations

from tests.backend.processes import run_python


def _own_peak_mb() -> float:
    with open("/proc/self/status") as status:
        return int(next(line.split()[1] for line in status if line.startswith("VmHWM:"))) / 1024


def test_a_childs_peak_is_not_the_forking_parents():
    """A parent holding 600 MB more than a small child needs: the child's peak stays the child's.
    (``wait4``'s ``ru_maxrss`` of a forked child reads at least the parent's resident set.)"""
    ballast = bytearray(600 << 20)
    ballast[:: 4096] = b"\x01" * len(ballast[:: 4096])  # touch every page: resident, not just mapped
    parent_mb = _own_peak_mb()
    small = run_python("x = 1")
    big = run_python("b = bytearray(200 << 20); b[::4096] = b'\\x01' * len(b[::4096])")
    assert small.returncode == 0 and big.returncode == 0, small.stderr + big.stderr
    assert small.peak_rss_mb < parent_mb - 400, (small.peak_rss_mb, parent_mb)
    assert 150 < big.peak_rss_mb - small.peak_rss_mb < 260  # the 200 MB the child touched, seen as its own
    del ballast


def test_a_child_keeps_its_exit_code_and_output():
    run = run_python("import sys; print('out'); print('err', file=sys.stderr); sys.exit(3)")
    assert (run.returncode, run.stdout, run.stderr) == (3, "out\n", "err\n")
