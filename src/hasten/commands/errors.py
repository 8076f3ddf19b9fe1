"""The error a subcommand raises for bad input: ``hasten`` prints its message and exits with status 2."""


class CommandError(ValueError):
    """Bad command-line input, found before anything was started; the message says how to fix it."""


class MissingFileError(CommandError, FileNotFoundError):
    """A file the command reads does not exist (also a ``FileNotFoundError``, which Accelerate's commands raise)."""


class ExistingFileError(CommandError, FileExistsError):
    """A file the command would write exists already (also a ``FileExistsError``, as in Accelerate)."""
