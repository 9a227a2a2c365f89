"""Sample plan texts shared by the plan-layer tests."""

from __future__ import annotations

from pathlib import Path

MARKDOWN_PLAN = """\
---
schema: 1
id: demo                 # plan id, used in tags and report paths
title: Demo plan
phases:
  - id: one
    title: First phase
    status: pending   # written by the runner
    paths: [src/]
    gates:
      - name: build
        kind: build
        run: "make"
      - name: speed
        kind: benchmark
        call: mypkg.bench:run
        args: {quick: true}
        env: {FOO: "1"}
        requires: [cuda]
        timeout: 900
        expect:
          speedup: ">= 1.5"
          errors: "== 0"
  - id: two
    title: Second phase
    gates:
      - name: check
        kind: verify
        run: pytest -q
---
# Demo plan

Human prose, untouched by the runner.

<!-- runner:status:begin -->
(generated)
<!-- runner:status:end -->

More prose.
"""

YAML_PLAN = """\
schema: 1
id: demo-yaml
phases:
  - id: only
    gates:
      - name: unit
        kind: verify
        run: pytest
"""


def write_plan(directory: Path, text: str, name: str = "plan.md") -> Path:
    """Write ``text`` byte for byte (no newline translation) and return the path."""
    path = directory / name
    path.write_bytes(text.encode("utf-8"))
    return path
