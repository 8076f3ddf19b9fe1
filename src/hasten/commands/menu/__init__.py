"""A terminal menu to pick one of several choices with the arrow or number keys (``hasten config``'s questions).

Without a terminal (input piped, a notebook) the menu prints numbered choices and reads the number instead.
"""
from .selection_menu import BulletMenu

__all__ = ["BulletMenu"]
