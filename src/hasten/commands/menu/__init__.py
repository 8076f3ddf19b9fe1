"""A terminal menu to pick one of several choices with the arrow or number keys (``hasten config``'s questions).

Where keys cannot be read one by one (input or output piped, ``TERM=dumb``, a notebook, a terminal whose
settings cannot be read) the menu prints numbered choices and reads the number (or the choice's text) instead.
"""
from .selection_menu import BulletMenu

__all__ = ["BulletMenu"]
