"""Bind keys to methods: ``@mark(KEYMAP["up"])`` on a method, ``@register`` on its class."""
from __future__ import annotations

from typing import Any, Callable, TypeVar

from .keymap import KEYMAP, get_character

__all__ = ["mark", "mark_multiple", "KeyHandler", "register"]

F = TypeVar("F", bound=Callable[..., Any])  # a key-handling method, returned as it came


def mark(key: int) -> Callable[[F], F]:
    """The decorated method handles ``key`` (a ``KEYMAP`` code)."""
    return mark_multiple(key)


def mark_multiple(*keys: int) -> Callable[[F], F]:
    """The decorated method handles each of ``keys``."""

    def decorator(method: F) -> F:
        method.handle_key = [*getattr(method, "handle_key", []), *keys]
        return method

    return decorator


class KeyHandler(type):
    """Metaclass: collects the marked methods into ``key_handler`` and adds ``handle_input``."""

    def __new__(cls, name, bases, attrs):
        new_cls = super().__new__(cls, name, bases, attrs)
        handlers = dict(getattr(new_cls, "key_handler", {}))
        for value in attrs.values():
            for key in getattr(value, "handle_key", []):
                handlers[key] = value
        new_cls.key_handler = handlers
        new_cls.handle_input = KeyHandler.handle_input
        return new_cls

    @staticmethod
    def handle_input(cls: Any) -> Any:
        """Read one key and call its method; the method's result (None for an unbound key)."""
        char = get_character()
        code = char if char == KEYMAP["undefined"] else ord(char)
        handler = cls.key_handler.get(code)
        if handler is None:
            return None
        cls.current_selection = code
        return handler(cls)


def register(cls: type) -> type:
    """``cls`` rebuilt with the ``KeyHandler`` metaclass."""
    return KeyHandler(cls.__name__, cls.__bases__, cls.__dict__.copy())
