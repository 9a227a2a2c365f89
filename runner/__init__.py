"""mla-gate runner: drive a phase-gated engineering plan.

A plan (Markdown with YAML front matter, or plain YAML) lists phases; each phase has
build, verify and benchmark gates with thresholds. The runner runs the current phase's
gates, records the evidence under ``reports/``, rewrites only the status bytes of the plan
and makes a git checkpoint when every gate passes.
"""

__version__ = "0.1.0"
TOOL = f"mla-gate runner {__version__}"
"""How results files and reports name the tool that wrote them."""
