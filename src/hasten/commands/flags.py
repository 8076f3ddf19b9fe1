"""Command-line flags that accept both spellings, ``--num_processes`` and ``--num-processes``.

Accelerate accepts either; scripts and configs written for it use both, so every hasten flag does too.
``--help`` shows each flag once, under its underscore spelling.
"""
from __future__ import annotations

import argparse


def spellings(option: str) -> list:
    """``"--num_processes"`` -> ``["--num_processes", "--num-processes"]``; other options unchanged."""
    if option.startswith("--") and "_" in option[2:]:
        return [option, "--" + option[2:].replace("_", "-")]
    return [option]


def with_both_spellings(options) -> list:
    """Every option of ``options`` followed by its dashed spelling, each once."""
    return list(dict.fromkeys(spelling for option in options for spelling in spellings(option)))


def add_flag(parser, name: str, *short: str, aliases=(), **kwargs) -> argparse.Action:
    """Add ``--name`` (and ``--na-me`` when the name has underscores), ``aliases`` and ``short`` options (``-n``)."""
    kwargs.setdefault("dest", name)
    options = [*short, "--" + name, *("--" + alias for alias in aliases)]
    return parser.add_argument(*with_both_spellings(options), **kwargs)


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
