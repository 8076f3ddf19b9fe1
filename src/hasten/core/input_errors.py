"""The errors for bad input found before anything was started: a command line, or a config file read by the rooms
that turn it into settings (``config/``) for ``hasten launch`` and for a process started without it.

``hasten`` prints a ``CommandError``'s message and exits with status 2; in a script it is a ``ValueError``.
"""

__all__ = ["CommandError", "MissingFileError", "ExistingFileError"]


class CommandError(ValueError):
    """Bad command-line or config-file input, found before anything was started; the message says how to fix it."""


class MissingFileError(CommandError, FileNotFoundError):
    """A file the command reads does not exist (also a ``FileNotFoundError``, which Accelerate's commands raise)."""


class ExistingFileError(CommandError, FileExistsError):
    """A file the command would write exists already (also a ``FileExistsError``, as in Accelerate)."""
