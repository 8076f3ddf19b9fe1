"""Accelerate's import path ``accelerate.utils.tqdm``: a progress bar on the main process only (``hasten/progress.py``).

Library code imports ``hasten.progress``: importing ``hasten.utils.tqdm`` as a module would make
``from hasten.utils import tqdm`` return the module rather than the function.
"""
from ..progress import tqdm  # noqa: F401

__all__ = ["tqdm"]
