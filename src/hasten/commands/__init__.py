"""The ``hasten`` command line: ``launch``, ``env``, ``config``, ``test``, ``estimate-memory``, ``to-fsdp2``,
``merge-weights`` and ``tpu-config``.

Each subcommand lives in its own module with ``add_parser(subparsers)`` and ``run(args) -> int``;
``cli.main`` imports only the one that was asked for, so the command starts fast. The modules also carry
Accelerate's names for the same things (``launch_command_parser(subparsers=None)``, ``launch_command(args)``,
``main()`` ...), built on those two.
"""
