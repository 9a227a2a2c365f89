"""``python -m runner ...`` and the ``runner`` script: the command line, with start-up guarded.

Importing the command line takes a moment (pydantic, typer, rich); Ctrl-C or SIGTERM in that
moment, or anywhere outside a command's own handling, exits 130 with one line, not a traceback.
"""

from __future__ import annotations

import signal
import sys


def _terminate(signum, frame):
    raise KeyboardInterrupt


def main() -> None:
    previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        from runner.cli import main as cli_main

        cli_main()
    except KeyboardInterrupt:
        sys.stderr.write("runner: interrupted\n")
        sys.exit(130)
    finally:
        signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    main()
