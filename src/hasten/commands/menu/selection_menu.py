"""``BulletMenu``: pick one of several choices with the arrow keys, a digit, then Enter."""
from __future__ import annotations

import builtins
import importlib.util
import os
import sys
from typing import NoReturn, Optional

from . import cursor, input
from .helpers import Direction, clear_line, forceWrite, linebreak, move_cursor, reset_cursor, writeColor
from .keymap import KEYMAP

__all__ = ["BulletMenu", "in_colab"]

try:
    in_colab = importlib.util.find_spec("google.colab") is not None
except (ImportError, ValueError):
    in_colab = False


def _raw_keys_readable() -> bool:
    """Whether the terminal lets single key presses be read (POSIX: its settings can be read; Windows: always)."""
    if os.name == "nt":
        return True
    try:
        import termios

        termios.tcgetattr(sys.stdin.fileno())
    except (ImportError, OSError, ValueError, AttributeError):  # termios.error is an OSError subclass
        return False
    return True


def _line_mode() -> bool:
    """Keys cannot be read one by one or the cursor cannot be moved (no terminal, ``TERM=dumb``, a notebook):
    ask for the number instead."""
    if in_colab or not (sys.stdin.isatty() and sys.stdout.isatty()):
        return True
    if os.name != "nt" and os.environ.get("TERM", "dumb") in ("", "dumb", "unknown"):
        return True
    return not _raw_keys_readable()


@input.register
class BulletMenu:
    """A menu of ``choices`` under ``prompt``; ``run()`` returns the index picked."""

    def __init__(self, prompt: Optional[str] = None, choices: list = []):  # noqa: B006 - Accelerate's signature
        self.position = 0
        self.choices = list(choices)
        self.prompt = prompt
        self.arrow_char = "*" if sys.platform == "win32" else "➔ "

    def write_choice(self, index: int, end: str = "") -> None:
        if sys.platform == "win32":
            forceWrite(self.choices[index], end)
        else:
            writeColor(self.choices[index], 32, end)

    def print_choice(self, index: int) -> None:
        """Draw one line of the menu: the current choice with the arrow, the others indented."""
        if index == self.position:
            forceWrite(f" {self.arrow_char} ")
            self.write_choice(index)
        else:
            forceWrite(f"    {self.choices[index]}")
        reset_cursor()

    def move_direction(self, direction: Direction, num_spaces: int = 1) -> None:
        """Move the arrow ``num_spaces`` lines up or down (not past either end) and redraw both lines."""
        step = num_spaces if direction == Direction.DOWN else -num_spaces
        if not 0 <= self.position + step < len(self.choices):
            return
        old = self.position
        self.position += step
        clear_line()
        self.print_choice(old)
        move_cursor(num_spaces, direction.name)
        self.print_choice(self.position)

    @input.mark(KEYMAP["up"])
    def move_up(self) -> None:
        self.move_direction(Direction.UP)

    @input.mark(KEYMAP["down"])
    def move_down(self) -> None:
        self.move_direction(Direction.DOWN)

    @input.mark(KEYMAP["newline"])
    def select(self) -> int:
        move_cursor(len(self.choices) - self.position, "DOWN")
        return self.position

    @input.mark(KEYMAP["interrupt"])
    def interrupt(self) -> NoReturn:
        move_cursor(len(self.choices) - self.position, "DOWN")
        raise KeyboardInterrupt

    @input.mark_multiple(*[KEYMAP[str(number)] for number in range(10)])
    def select_row(self) -> None:
        """A digit moves the arrow to that choice (Enter then picks it)."""
        index = int(chr(self.current_selection))
        if index < len(self.choices) and index != self.position:
            direction = Direction.DOWN if index > self.position else Direction.UP
            self.move_direction(direction, abs(index - self.position))

    def _run_line_mode(self, default_choice: int) -> int:
        """Numbered choices; the number typed (or the choice's text, in any case), the default on Enter."""
        for index, choice in enumerate(self.choices):
            forceWrite(f"  [{index}] {choice}", "\n")
        names = [str(choice).strip().lower() for choice in self.choices]
        while True:
            answer = builtins.input(f"Choice [{default_choice}]: ").strip()
            if not answer:
                return default_choice
            if answer.isdigit() and int(answer) < len(self.choices):
                return int(answer)
            if answer.lower() in names:
                return names.index(answer.lower())
            forceWrite(f"{answer!r} is not one of the choices. Please type a number from 0 to "
                       f"{len(self.choices) - 1}.", "\n")

    def run(self, default_choice: int = 0) -> int:
        """Show the menu and return the index of the choice made."""
        if _line_mode():
            if self.prompt:
                forceWrite(self.prompt, "\n")
            return self._run_line_mode(default_choice)
        if self.prompt:
            linebreak()
            forceWrite(self.prompt, "\n")
        forceWrite("(arrow keys or a digit to move, Enter to choose)", "\n")
        self.position = default_choice
        for index in range(len(self.choices)):
            self.print_choice(index)
            forceWrite("\n")
        move_cursor(len(self.choices) - self.position, "UP")
        with cursor.hide():
            while True:
                choice = self.handle_input()
                if choice is not None:
                    reset_cursor()
                    for _ in range(len(self.choices) + 1):
                        move_cursor(1, "UP")
                        clear_line()
                    self.write_choice(choice, "\n")
                    return choice
