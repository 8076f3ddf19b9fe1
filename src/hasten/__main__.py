"""``python -m hasten ...`` is the ``hasten`` command."""
from hasten.commands.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
