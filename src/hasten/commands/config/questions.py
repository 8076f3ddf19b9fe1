"""The prompts ``hasten config`` is made of: a choice, a whole number, a number, yes/no, a text.

Every answer is checked where it is typed: a word that is not a number, a number out of range or an unknown
choice says what was expected and asks again, so a slip never ends the questionnaire. An empty answer takes the
default shown in brackets. Choices are an arrow-key menu on a full terminal and a numbered list read as a line
otherwise (``TERM=dumb``, output piped, a notebook): see ``hasten.commands.menu``. When input ends before the
last question (Ctrl+D, a closed pipe) the command stops with a ``CommandError`` and nothing is saved.
"""
from __future__ import annotations

import builtins
from typing import Any, Callable, Optional, Sequence

from ..errors import CommandError

__all__ = ["Choice", "ask_choice", "ask_int", "ask_float", "ask_bool", "ask_text", "InputEnded"]

Choice = tuple  # (label shown, value returned)


class InputEnded(CommandError):
    """The input closed before every question was answered."""


_ENDED = ("the input ended before every question was answered; nothing was saved. Run `hasten config` again, or "
          "write a file without questions with `hasten config default`.")


def _read(prompt: str) -> str:
    try:
        return builtins.input(prompt)
    except EOFError:
        print()
        raise InputEnded(_ENDED) from None


def _ask(question: str, shown_default: Optional[str], parse: Callable[[str], Any], default: Any = None) -> Any:
    """Ask until ``parse`` accepts the answer (it raises ``ValueError`` with the reason otherwise)."""
    prompt = f"{question} [{shown_default}]: " if shown_default is not None else f"{question}: "
    while True:
        answer = _read(prompt).strip()
        if not answer and shown_default is not None:
            return default
        try:
            return parse(answer)
        except ValueError as error:
            print(f"  {error} Please try again.")


def ask_choice(question: str, choices: Sequence[Choice], default: int = 0) -> Any:
    """The value of the choice picked from ``choices`` (``(label, value)`` pairs); ``default`` is an index."""
    from ..menu import BulletMenu

    labels = [str(label) for label, _ in choices]
    try:
        index = BulletMenu(question, labels).run(default_choice=default)
    except EOFError:
        print()
        raise InputEnded(_ENDED) from None
    return choices[index][1]


def _whole_number(text: str) -> int:
    """``42``, ``1_000``, ``1e8`` (a whole number written in scientific notation)."""
    cleaned = text.replace("_", "")
    try:
        return int(cleaned)
    except ValueError:
        pass
    try:
        number = float(cleaned)
    except ValueError:
        raise ValueError(f"{text!r} is not a whole number.") from None
    if not number.is_integer():
        raise ValueError(f"{text!r} is not a whole number.")
    return int(number)


def _bounds(value, minimum, maximum) -> None:
    if minimum is not None and value < minimum:
        raise ValueError(f"{value} is too small: the smallest allowed is {minimum}.")
    if maximum is not None and value > maximum:
        raise ValueError(f"{value} is too large: the largest allowed is {maximum}.")


def ask_int(question: str, default: int, minimum: Optional[int] = None, maximum: Optional[int] = None,
            check: Optional[Callable[[int], None]] = None) -> int:
    """A whole number within ``[minimum, maximum]`` that ``check`` (raising ``ValueError``) accepts."""
    def parse(text: str) -> int:
        value = _whole_number(text)
        _bounds(value, minimum, maximum)
        if check is not None:
            check(value)
        return value

    return _ask(question, str(default), parse, default)


def ask_float(question: str, default: float, minimum: Optional[float] = None) -> float:
    """A number (``1``, ``0.5``, ``1e-3``) of at least ``minimum``."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise ValueError(f"{text!r} is not a number.") from None
        if value != value or value in (float("inf"), float("-inf")):
            raise ValueError(f"{text!r} is not a finite number.")
        _bounds(value, minimum, None)
        return value

    return _ask(question, str(default), parse, default)


_YES = ("y", "yes", "true", "1")
_NO = ("n", "no", "false", "0")


def ask_bool(question: str, default: bool = False) -> bool:
    """Yes or no (``y``/``n`` too); the default is the capitalised one."""
    def parse(text: str) -> bool:
        word = text.lower()
        if word in _YES:
            return True
        if word in _NO:
            return False
        raise ValueError(f"{text!r} is neither yes nor no.")

    return _ask(question, "YES/no" if default else "yes/NO", parse, default)


def ask_text(question: str, default: Optional[str] = None, check: Optional[Callable[[str], Any]] = None) -> Any:
    """A line of text; ``check`` (raising ``ValueError``) may refuse it or return it cleaned. Without a
    ``default`` an empty answer is refused."""
    def parse(text: str):
        if not text:
            raise ValueError("An answer is needed here.")
        return check(text) if check is not None else text

    return _ask(question, default, parse, default)
