"""Gate helpers shared by several phases: engines built through ``serving.stack``
(``engines``), the greedy comparison (``greedy``), step timing (``timing``), metrics reported
as samples of interleaved repetitions (``samples``), and the kernel timing harness and roofline
(``kernel_timing``, ``roofline``) that phases ``kernel`` and ``defrag`` both time with.

The one named place for code more than one phase's gates use: phase packages import from here
and from the library layers, never from each other (``tests/test_layers.py``).
"""
