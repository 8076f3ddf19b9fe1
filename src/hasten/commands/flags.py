"""Command-line flags that accept both spellings, ``--num_processes`` and ``--num-processes``.

Accelerate accepts either; scripts and configs written for it use both, so every hasten flag does too.
``--help`` shows each flag once, under its underscore spelling.
"""
from __future__ import annotations

import argparse
import functools
from collections.abc import Iterable
from typing import Any, Optional, Union


def spellings(option: str) -> list:
    """``"--num_processes"`` -> ``["--num_processes", "--num-processes"]``; other options unchanged."""
    if option.startswith("--") and "_" in option[2:]:
        return [option, "--" + option[2:].replace("_", "-")]
    return [option]


def with_both_spellings(options: Iterable[str]) -> list:
    """Every option of ``options`` followed by its dashed spelling, each once."""
    return list(dict.fromkeys(spelling for option in options for spelling in spellings(option)))


GIVEN = "nondefault"  # the parsed namespace's set of the flags given on the command line (Accelerate's name)


def recording(action: Union[str, type[argparse.Action]], parser: Optional[argparse._ActionsContainer] = None) -> type:
    """The argparse action ``action`` (a class, or a name such as ``"store_true"`` looked up on ``parser``) that
    also adds its ``dest`` to the namespace's ``nondefault`` set when its argument is given, so that a flag given
    with its default value can be told from one left out. One class per action class, made once."""
    action_class = parser._registry_get("action", action, action) if isinstance(action, str) else action
    return _recording_class(action_class)


@functools.lru_cache(maxsize=None)
def _recording_class(action_class: type) -> type:
    class Recording(action_class):
        def __call__(self, parser, namespace, values, option_string=None):
            super().__call__(parser, namespace, values, option_string)
            given = getattr(namespace, GIVEN, None)
            if given is None:
                given = set()
                setattr(namespace, GIVEN, given)
            given.add(self.dest)

    Recording.__name__ = Recording.__qualname__ = f"Recording{action_class.__name__}"
    return Recording


def add_flag(parser: argparse._ActionsContainer, name: str, *short: str, aliases: Iterable[str] = (),
             **kwargs: Any) -> argparse.Action:
    """Add ``--name`` (and ``--na-me`` when the name has underscores), ``aliases`` and ``short`` options (``-n``).

    A flag given on the command line is recorded in the namespace's ``nondefault`` set (see ``was_given``)."""
    kwargs.setdefault("dest", name)
    kwargs["action"] = recording(kwargs.get("action", "store"), parser)
    options = [*short, "--" + name, *("--" + alias for alias in aliases)]
    return parser.add_argument(*with_both_spellings(options), **kwargs)


def was_given(args: argparse.Namespace, dest: str, default: Any = None) -> bool:
    """Whether ``args`` holds a value of its own for ``dest``: the flag was given on the command line (it is in
    ``nondefault``), or the value is neither None nor the parser's ``default`` (a namespace built or changed by
    code, which has no record of what was typed)."""
    if dest in (getattr(args, GIVEN, None) or ()):
        return True
    value = getattr(args, dest, None)
    return value is not None and not (default is not None and value == default)


def _shown(options) -> list:
    """The spellings ``--help`` shows: the dashed twin of an underscore option is left out."""
    present = set(options)
    return [option for option in options
            if not (option.startswith("--") and "-" in option[2:] and "_" not in option
                    and "--" + option[2:].replace("-", "_") in present)]


class OneSpellingHelpFormatter(argparse.HelpFormatter):
    """Shows each flag once, under its underscore spelling (the dashed one works the same)."""

    def _format_action_invocation(self, action):
        if not action.option_strings:
            return super()._format_action_invocation(action)
        shown = argparse.Action(_shown(action.option_strings), action.dest, nargs=action.nargs,
                                metavar=action.metavar, choices=action.choices)
        return super()._format_action_invocation(shown)
