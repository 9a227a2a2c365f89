"""``python -m serving generate`` shows fragmentation and compactions; ``--no-defrag`` turns compaction off."""

from __future__ import annotations

from serving.stack.cli import main


def test_generate_shows_fragmentation_and_compactions_and_can_turn_them_off(capsys):
    args = ["generate", "--random-model", "tiny", "--random-prompt", "40", "--random-prompt", "30",
            "--max-new-tokens", "6", "--speculate", "tree:2x2"]
    assert main(args) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line.startswith("defrag on: ") and "runs per 1k tokens" in line and "largest free run" in line
    assert main(args + ["--no-defrag"]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith("defrag off (--no-defrag): 0 compactions")
