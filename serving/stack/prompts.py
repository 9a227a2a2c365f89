"""Prompts on the command line: token ids, or text through the model folder's tokenizer."""

from __future__ import annotations

from pathlib import Path


def load_tokenizer(folder: str | None):
    """The folder's ``tokenizer.json`` (a ``tokenizers.Tokenizer``), None when it has none."""
    tok_file = Path(folder or "") / "tokenizer.json"
    if folder is None or not tok_file.is_file():
        return None
    try:
        from tokenizers import Tokenizer
    except ImportError as exc:  # optional dependency
        raise ValueError(f"Expected the 'tokenizers' package for {tok_file}, got none installed") from exc
    try:
        return Tokenizer.from_file(str(tok_file))
    except Exception as exc:  # the Rust library raises its own exception types
        raise ValueError(f"Expected a valid tokenizer in {tok_file}, got: {str(exc).splitlines()[0] if str(exc) else exc!r}") from None


def parse_prompt(text: str, tokenizer) -> list[int]:
    """Comma- or space-separated token ids, else text through the folder's tokenizer."""
    parts = text.replace(",", " ").split()
    if not parts:
        raise ValueError(f"Expected a non-empty --prompt (token ids like '1,2,3', or text), got {text!r}")
    if all(p.isdigit() for p in parts):
        return [int(p) for p in parts]
    if tokenizer is None:
        raise ValueError(f"Expected token ids like '1,2,3' (no tokenizer.json for text), got {text!r}")
    return tokenizer.encode(text).ids


def check_prompts(prompts: list[list[int]], vocab_size: int) -> None:
    for i, prompt in enumerate(prompts):
        if not prompt:
            raise ValueError(f"Expected prompt [{i}] to have at least one token, got none")
        bad = next((t for t in prompt if not 0 <= t < vocab_size), None)
        if bad is not None:
            raise ValueError(f"Expected token ids in [0, {vocab_size}) (the model's vocab_size), got {bad} in prompt [{i}]")


