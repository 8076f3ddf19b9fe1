"""A ``tqdm`` progress bar shown on the main process only (the others get a disabled bar).

Library code imports ``hasten.utils.progress`` instead of this module: importing ``hasten.utils.tqdm`` as a module
would make ``from hasten.utils import tqdm`` return the module rather than this function.
"""
from __future__ import annotations

__all__ = ["tqdm"]


def tqdm(*args, main_process_only: bool = True, **kwargs):
    """``tqdm.auto.tqdm(*args, **kwargs)``, disabled on every process but the main one (per machine).

    With ``main_process_only=False`` every process shows its bar.
    """
    from tqdm.auto import tqdm as _tqdm

    from ..state import PartialState

    if main_process_only and PartialState._shared_state and not PartialState().is_local_main_process:
        kwargs["disable"] = True
    return _tqdm(*args, **kwargs)
