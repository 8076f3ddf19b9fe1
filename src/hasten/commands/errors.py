"""The error a subcommand raises for bad input: ``hasten`` prints its message and exits with status 2."""


class CommandError(ValueError):
    """Bad command-line input, found before anything was started; the message says how to fix it."""
