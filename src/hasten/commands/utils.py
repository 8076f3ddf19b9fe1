"""Accelerate's argument-parser classes: every ``--multi_word`` option also answers to ``--multi-word``.

hasten's own commands declare their flags with ``flags.add_flag``; these classes give code written against
``accelerate.commands.utils`` the same behaviour, through the same spelling rule.
"""
from __future__ import annotations

import argparse
from typing import Any, Callable, Optional

from .flags import OneSpellingHelpFormatter, recording, with_both_spellings

__all__ = ["CustomArgumentParser", "CustomArgumentGroup"]


_ACTIONS = {"store": recording(argparse._StoreAction), "store_true": recording(argparse._StoreTrueAction),
            "store_false": recording(argparse._StoreFalseAction), "store_const": recording(argparse._StoreConstAction)}


def _add(add, args, kwargs):
    """Register an argument with both spellings; value-storing actions record that they were given."""
    if args and all(isinstance(arg, str) and arg.startswith("-") for arg in args):
        args = with_both_spellings(args)
        action = kwargs.get("action", "store")
        if isinstance(action, str) and action in _ACTIONS:
            kwargs["action"] = _ACTIONS[action]
    return add(*args, **kwargs)


class CustomArgumentGroup(argparse._ArgumentGroup):
    """An argument group whose options accept ``-`` and ``_`` spellings (``namespace.nondefault`` lists those given)."""

    def add_argument(self, *args: Any, **kwargs: Any) -> argparse.Action:
        return _add(super().add_argument, args, kwargs)


class CustomArgumentParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose options accept ``-`` and ``_`` spellings, shown once each in ``--help``.

    Options given on the command line are listed in ``namespace.nondefault``, as in Accelerate.
    """

    def __init__(self, *args: Any, **kwargs: Any):
        kwargs.setdefault("formatter_class", OneSpellingHelpFormatter)
        super().__init__(*args, **kwargs)

    def add_argument(self, *args: Any, **kwargs: Any) -> argparse.Action:
        return _add(super().add_argument, args, kwargs)

    def add_argument_group(self, *args: Any, **kwargs: Any) -> CustomArgumentGroup:
        group = CustomArgumentGroup(self, *args, **kwargs)
        self._action_groups.append(group)
        return group


def command_parser(add_parser: Callable[[argparse._SubParsersAction], argparse.ArgumentParser],
                   subparsers: Optional[argparse._SubParsersAction] = None,
                   func: Optional[Callable[[argparse.Namespace], Any]] = None) -> argparse.ArgumentParser:
    """Accelerate's ``<name>_command_parser(subparsers=None)`` built from a hasten ``add_parser(subparsers)``.

    With ``subparsers`` the command is registered there (``func`` becomes its ``args.func``, as in
    Accelerate); without, it is a parser of its own, named ``hasten <command>``.
    """
    if subparsers is None:
        return add_parser(CustomArgumentParser(prog="hasten").add_subparsers())
    parser = add_parser(subparsers)
    if func is not None:
        parser.set_defaults(func=func)
    return parser
