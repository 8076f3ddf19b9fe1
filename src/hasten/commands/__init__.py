"""The ``hasten`` command line: ``launch``, ``env``, ``config``, ``test`` and ``estimate-memory``.

Each subcommand lives in its own module with ``add_parser(subparsers)`` and ``run(args) -> int``;
``cli.main`` imports only the one that was asked for, so the command starts fast.
"""
