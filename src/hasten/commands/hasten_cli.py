"""Accelerate's ``accelerate_cli`` module under hasten's name: ``main`` runs the ``hasten`` command line."""
from .cli import main

__all__ = ["main"]
