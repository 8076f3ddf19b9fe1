"""Hide and show the terminal cursor (ANSI on POSIX, the console API on Windows)."""
from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["hide_cursor", "show_cursor", "hide"]


def _set_windows_cursor(visible: bool) -> None:
    import ctypes

    class CursorInfo(ctypes.Structure):
        _fields_ = [("size", ctypes.c_int), ("visible", ctypes.c_byte)]

    info = CursorInfo()
    handle = ctypes.windll.kernel32.GetStdHandle(-11)  # the standard output console
    ctypes.windll.kernel32.GetConsoleCursorInfo(handle, ctypes.byref(info))
    info.visible = visible
    ctypes.windll.kernel32.SetConsoleCursorInfo(handle, ctypes.byref(info))


def _set_cursor(visible: bool) -> None:
    if os.name == "nt":
        _set_windows_cursor(visible)
    else:
        sys.stdout.write("\033[?25h" if visible else "\033[?25l")
        sys.stdout.flush()


def hide_cursor() -> None:
    _set_cursor(False)


def show_cursor() -> None:
    _set_cursor(True)


@contextmanager
def hide() -> Iterator[None]:
    """The cursor hidden for the duration of the block, shown again even after an error or Ctrl+C."""
    hide_cursor()
    try:
        yield
    finally:
        show_cursor()
