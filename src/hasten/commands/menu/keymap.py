"""Read single key presses from the keyboard, arrows included, without waiting for Enter."""
from __future__ import annotations

import os
import string
import sys
from typing import Union

__all__ = ["ARROW_KEY_FLAG", "KEYMAP", "get_raw_chars", "get_character"]

ARROW_KEY_FLAG = 1 << 8  # arrow keys are reported as the letter of their escape sequence plus this flag

KEYMAP = {
    "tab": ord("\t"),
    "newline": ord("\r"),
    "esc": 27,
    "up": ord("A") + ARROW_KEY_FLAG,
    "down": ord("B") + ARROW_KEY_FLAG,
    "right": ord("C") + ARROW_KEY_FLAG,
    "left": ord("D") + ARROW_KEY_FLAG,
    "mod_int": ord("["),
    "undefined": sys.maxsize,
    "interrupt": 3,  # Ctrl+C in raw mode
    "insert": 50,
    "delete": 51,
    "pg_up": 53,
    "pg_down": 54,
}
KEYMAP["arrow_begin"] = KEYMAP["up"]
KEYMAP["arrow_end"] = KEYMAP["left"]
for _digit in range(10):
    KEYMAP[str(_digit)] = ord(str(_digit))

# Windows reports arrows as a prefix byte and a scan code; they are translated to the ANSI sequence.
_WINDOWS_ARROWS = {b"H": "A", b"P": "B", b"M": "C", b"K": "D"}
_pending: list = []  # characters of a translated Windows key still to be returned


def _windows_char() -> str:
    import msvcrt

    if _pending:
        return _pending.pop(0)
    char = msvcrt.getwch()
    if char in ("\x00", "\xe0"):
        code = msvcrt.getwch().encode("latin-1", "replace")
        if code in _WINDOWS_ARROWS:
            _pending.extend(["[", _WINDOWS_ARROWS[code]])
            return chr(KEYMAP["esc"])
        return "\x00"  # another special key: reported as undefined
    return char


def get_raw_chars() -> str:
    """One character from the keyboard, read in raw mode (no echo, no line buffering)."""
    if os.name == "nt":
        return _windows_char()
    import termios
    import tty

    descriptor = sys.stdin.fileno()
    saved = termios.tcgetattr(descriptor)
    try:
        tty.setraw(descriptor)
        return sys.stdin.read(1)
    finally:
        termios.tcsetattr(descriptor, termios.TCSADRAIN, saved)


def get_character() -> Union[str, int]:
    """The key pressed: a printable character, Enter or Ctrl+C as such, an arrow as ``chr(KEYMAP[...])``;
    ``KEYMAP["undefined"]`` for anything else."""
    char = get_raw_chars()
    if char == "":
        raise EOFError("the input ended while a menu was waiting for a key")
    if ord(char) in (KEYMAP["interrupt"], KEYMAP["newline"]):
        return char
    if ord(char) == KEYMAP["esc"]:
        second = get_raw_chars()
        if second == "" or ord(second) != KEYMAP["mod_int"]:
            return KEYMAP["undefined"]
        third = get_raw_chars()
        if third == "":
            return KEYMAP["undefined"]
        key = ord(third) + ARROW_KEY_FLAG
        return chr(key) if KEYMAP["arrow_begin"] <= key <= KEYMAP["arrow_end"] else KEYMAP["undefined"]
    return char if char in string.printable else KEYMAP["undefined"]
