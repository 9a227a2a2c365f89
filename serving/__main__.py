"""``python -m serving ...``: the engine's command line (see ``serving.engine.cli``)."""

from serving.engine.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
