"""``python -m serving generate`` end to end on the tiny random model."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "serving", "generate", *args], cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_generate_prints_tokens_and_speed_and_speculation_matches_plain():
    plain = run_cli("--random-model", "tiny", "--prompt", "1,2,3", "--random-prompt", "40", "--max-new-tokens", "10", "--json")
    spec = run_cli("--random-model", "tiny", "--prompt", "1,2,3", "--random-prompt", "40", "--max-new-tokens", "10",
                   "--speculate", "tree:3x3", "--json")
    assert plain.returncode == 0, plain.stderr
    a, b = json.loads(plain.stdout), json.loads(spec.stdout)
    assert [r["output"] for r in a["requests"]] == [r["output"] for r in b["requests"]]
    assert len(a["requests"][1]["output"]) == 10 and b["leaked_slots"] == 0
    text = run_cli("--random-model", "tiny", "--prompt", "5", "--max-new-tokens", "4", "--speculate", "ngram:2x2")
    assert "tokens/s" in text.stdout and "accepted drafts per step" in text.stdout and "attention" in text.stdout


def test_text_prompt_without_tokenizer_is_refused():
    out = run_cli("--random-model", "tiny", "--prompt", "hello there")
    assert out.returncode == 2 and "Expected token ids like '1,2,3'" in out.stderr


def test_serving_never_imports_transformers():
    code = ("import sys, serving.stack.cli as c; c.main(['generate', '--random-model', 'tiny', '--prompt', '1,2', "
            "'--max-new-tokens', '2', '--speculate', 'tree:2x2']); assert 'transformers' not in sys.modules, 'imported'")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
