"""The demo model the speculation gates measure: trained once per trainer version, then reused.

``serving.demo.train`` is deterministic, so its output is cached under the temporary folder by
a hash of the trainer's sources and its size; ``MLA_GATE_DEMO_MODEL`` names a folder to use
instead (a model trained earlier). A folder is used only when its ``train.json`` exists (the
trainer writes it last), so an interrupted training is never picked up.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

import serving.demo.corpus as corpus
import serving.demo.train as train


def cache_folder(tiny: bool) -> Path:
    digest = hashlib.sha256()
    for module in (train, corpus):
        digest.update(Path(module.__file__).read_bytes())
    digest.update(b"tiny" if tiny else b"full")
    return Path(tempfile.gettempdir()) / f"mla-gate-demo-{digest.hexdigest()[:12]}"


def trained_model(tiny: bool = False, log=print) -> tuple[Path, dict]:
    """(folder, the training summary), training first when no finished folder exists."""
    named = os.environ.get("MLA_GATE_DEMO_MODEL")
    folder = Path(named) if named else cache_folder(tiny)
    done = folder / "train.json"
    if not done.is_file():
        if named:
            raise ValueError(f"Expected a trained demo model in MLA_GATE_DEMO_MODEL={named} (with train.json), got none")
        train.run(folder, tiny=tiny, log=log)
    return folder, json.loads(done.read_text())


def heldout_contexts(folder: Path, context: int, count: int) -> list[list[int]]:
    """``count`` prompts of ``context`` tokens from the held-out files (never trained on): each
    the next held-out files' openings, joined as training joins files (by the end-of-text id),
    until it is long enough."""
    files = [p["ids"] for p in json.loads((folder / "heldout.json").read_text())["prompts"]]
    if not files:
        raise ValueError(f"Expected held-out prompts in {folder / 'heldout.json'}, got none")
    eot = json.loads((folder / "generation_config.json").read_text())["eos_token_id"]
    out, at = [], 0
    for _ in range(count):
        ids: list[int] = []
        while len(ids) < context:
            ids += files[at % len(files)] + [eot]
            at += 1
        out.append(ids[:context])
    return out
