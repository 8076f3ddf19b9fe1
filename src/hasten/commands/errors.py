"""The error a subcommand raises for bad input: ``hasten`` prints its message and exits with status 2. The classes
live in ``core/input_errors.py``, where the config rooms that check a config file for the launcher raise them too."""

from ..core.input_errors import CommandError, ExistingFileError, MissingFileError

__all__ = ["CommandError", "MissingFileError", "ExistingFileError"]
