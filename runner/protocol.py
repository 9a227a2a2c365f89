"""The contract between the runner and a gate process, defined once.

Both sides import these names: the runner's execution side (``runner.gates.execute``,
``runner.gates.verdict``, ``runner.gates.call``) when it starts a gate and reads back what it left, and
the gate side through ``runner.gatekit``.

Every gate process gets, besides the runner's own environment and the gate's ``env:``:

==========================  ===================================================================
``RUNNER_GATE``             the gate's name
``RUNNER_METRICS``          a file the gate may write its metrics to (one JSON object of scalars)
``RUNNER_STATUS``           a file ``runner.gates.call`` writes its status line to (callable gates)
``RUNNER_PROGRESS``         a file the gate may append ``{"done": n, "total": m}`` lines to
``RUNNER_ARTIFACTS``        a fresh folder for small UTF-8 text files the report keeps
==========================  ===================================================================

Plots: an artifact whose name ends in ``PLOT_SUFFIX`` holds one figure in the declared format
``PLOT_FORMAT`` (see ``runner.gatekit.write_plot``); the HTML report draws every such artifact.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

GATE_ENV = "RUNNER_GATE"
METRICS_ENV = "RUNNER_METRICS"
STATUS_ENV = "RUNNER_STATUS"
PROGRESS_ENV = "RUNNER_PROGRESS"
ARTIFACTS_ENV = "RUNNER_ARTIFACTS"

MAX_METRICS_BYTES = 1 << 20  # the most of a gate's metrics file the runner reads
MAX_ARTIFACTS = 20
MAX_ARTIFACT_BYTES = 1 << 20
ARTIFACT_NAME_PATTERN = r"[A-Za-z0-9][A-Za-z0-9._-]*"

PLOT_FORMAT = "runner.plot/1"
PLOT_SUFFIX = ".plot.json"


@dataclass(frozen=True)
class GateFiles:
    """Where one gate process leaves what it reports (all inside the runner's scratch folder)."""

    metrics: Path
    status: Path
    progress: Path
    artifacts: Path

    @classmethod
    def inside(cls, scratch: Path) -> "GateFiles":
        scratch = Path(scratch)
        return cls(
            metrics=scratch / "metrics.json",
            status=scratch / "status.json",
            progress=scratch / "progress.jsonl",
            artifacts=scratch / "artifacts",
        )

    def environment(self, gate_name: str) -> dict[str, str]:
        """The ``RUNNER_*`` variables that point a gate process at these files."""
        return {
            GATE_ENV: gate_name,
            METRICS_ENV: str(self.metrics),
            STATUS_ENV: str(self.status),
            PROGRESS_ENV: str(self.progress),
            ARTIFACTS_ENV: str(self.artifacts),
        }
