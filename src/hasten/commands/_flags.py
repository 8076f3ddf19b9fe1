"""Command-line flags that accept both spellings, ``--num_processes`` and ``--num-processes``.

Accelerate accepts either; scripts and configs written for it use both, so every hasten flag does too.
"""
from __future__ import annotations

import argparse


def add_flag(parser, name: str, *short: str, **kwargs) -> argparse.Action:
    """Add ``--name`` (and ``--na-me`` when the name has underscores) plus any ``short`` options like ``-n``."""
    spellings = [*short, "--" + name]
    if "_" in name:
        spellings.append("--" + name.replace("_", "-"))
    kwargs.setdefault("dest", name)
    return parser.add_argument(*spellings, **kwargs)
