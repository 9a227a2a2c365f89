"""The kernel's internals that gate, benchmark and tuning code may use, named in one place.

Serving code uses the public API (``kernel``). Gates and hand-run tools that must reach below it
(compile one variant for sm_90 without a GPU, plan with a chosen schedule, time the split merge
alone, read a cache's rows) import from here and never from the kernel's other modules
(``tests/test_layers.py``). Renaming something here is a change to this surface, seen in one file.

- ``hopper``: the Hopper (sm_90, Gluon) path as a namespace: ``VARIANTS``, ``CANDIDATES``,
  ``choose_variant``, ``make_plan``, ``plan_tensors``, ``run_split_and_combine``,
  ``compile_for_sm90``, ``resource_stats``, ``kernel_name`` (its public names only);
- the Triton path's planning and launches: ``make_plan`` / ``upload_plan`` / ``run_plan`` over a
  ``Workspace``, ``PlanLayout``, ``HeadDims``, ``plan_work``, ``program_makespan``,
  ``default_tile_config``, ``with_contiguity``, ``contiguous_runs``, ``launch_combine``,
  ``compile_split_for_sm90``;
- ``kv_rows``: a ``[slots, D]`` or ``[slots, 1, D]`` cache as ``[slots, D]`` rows;
- ``interpreting``: whether Triton runs in its CPU interpreter.
"""

from kernel import hopper
from kernel.mla_verify import Workspace, interpreting, make_plan, run_plan
from kernel.plan import (
                         HeadDims,
                         PlanLayout,
                         contiguous_runs,
                         default_tile_config,
                         plan_work,
                         program_makespan,
                         with_contiguity,
)
from kernel.staging import upload_plan
from kernel.triton_kernels import compile_split_for_sm90, launch_combine
from kernel.validation import kv_rows

__all__ = ["hopper", "Workspace", "interpreting", "make_plan", "run_plan", "HeadDims", "PlanLayout", "contiguous_runs",
           "default_tile_config", "plan_work", "program_makespan", "with_contiguity", "upload_plan",
           "compile_split_for_sm90", "launch_combine", "kv_rows"]
