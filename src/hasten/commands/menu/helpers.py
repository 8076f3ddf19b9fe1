"""Writing to the terminal for the menu: colours, cursor moves, clearing lines (ANSI escape sequences)."""
from __future__ import annotations

import enum
import shutil
import sys

__all__ = ["CURSOR_TO_CHAR", "Direction", "forceWrite", "writeColor", "reset_cursor", "move_cursor", "clear_line",
           "linebreak"]

CURSOR_TO_CHAR = {"UP": "A", "DOWN": "B", "RIGHT": "C", "LEFT": "D"}  # the final letter of ESC [ n <letter>


class Direction(enum.Enum):
    UP = 0
    DOWN = 1


def _width() -> int:
    return shutil.get_terminal_size().columns


def forceWrite(content: object, end: str = "") -> None:  # noqa: N802 - Accelerate's name
    """Write and flush at once (the menu redraws in place)."""
    sys.stdout.write(str(content) + end)
    sys.stdout.flush()


def writeColor(content: object, color: int, end: str = "") -> None:  # noqa: N802 - Accelerate's name
    """Write in an ANSI colour (32: green)."""
    forceWrite(f"\033[{color}m{content}\033[0m", end)


def reset_cursor() -> None:
    forceWrite("\r")


def move_cursor(num_lines: int, direction: str) -> None:
    forceWrite(f"\033[{num_lines}{CURSOR_TO_CHAR[direction.upper()]}")


def clear_line() -> None:
    forceWrite(" " * _width())
    reset_cursor()


def linebreak() -> None:
    reset_cursor()
    forceWrite("-" * _width())
