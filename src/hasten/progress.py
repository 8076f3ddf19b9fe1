"""Progress bars on the main process: ``progress_bar`` for hasten's own long operations (loading checkpoint
shards ...) and Accelerate's ``tqdm``.

``progress_bar`` shows on the local main process only, and only when stdout is a terminal, so logs, CI output and
the other processes stay clean. ``tqdm`` is a plain ``tqdm.auto.tqdm`` disabled on every process but the main one
(Accelerate's ``accelerate.utils.tqdm``).
"""
from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Optional, Union

if TYPE_CHECKING:
    from tqdm.auto import tqdm as Tqdm

__all__ = ["progress_bar", "tqdm"]


def _on_other_process() -> bool:
    from .state import PartialState

    return bool(PartialState._shared_state) and not PartialState().is_local_main_process


def _stdout_is_a_terminal() -> bool:
    try:
        return sys.stdout.isatty()
    except (AttributeError, ValueError):  # replaced or closed stdout
        return False


def progress_bar(iterable: Optional[Iterable[Any]] = None, *, total: Optional[float] = None, desc: Optional[str] = None,
                 unit: str = "it", **kwargs: Any) -> Union[Tqdm, Iterable[Any], None]:
    """A ``tqdm`` bar over ``iterable``, disabled off the local main process and when stdout is not a terminal.
    Without tqdm installed, ``iterable`` itself."""
    try:
        from tqdm.auto import tqdm as _tqdm
    except ImportError:
        return iterable
    disable = kwargs.pop("disable", False) or not _stdout_is_a_terminal() or _on_other_process()
    return _tqdm(iterable, total=total, desc=desc, unit=unit, disable=disable, **kwargs)


def tqdm(*args: Any, main_process_only: bool = True, **kwargs: Any) -> Tqdm:
    """``tqdm.auto.tqdm(*args, **kwargs)``, disabled on every process but the main one (per machine).

    With ``main_process_only=False`` every process shows its bar.
    """
    from tqdm.auto import tqdm as _tqdm

    from .state import PartialState

    if main_process_only and PartialState._shared_state and not PartialState().is_local_main_process:
        kwargs["disable"] = True
    return _tqdm(*args, **kwargs)
