"""``python -m runner ...``: the command line without installing the package."""

from runner.cli import main

if __name__ == "__main__":
    main()
