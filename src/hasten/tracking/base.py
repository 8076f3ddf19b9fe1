"""``GeneralTracker``: the base class of experiment trackers, and ``on_main_process`` for their methods.

A tracker names itself (``name``), says whether it writes to a logging directory (``requires_logging_directory``)
and which package it runs on (``package``, ``is_installed``), exposes its underlying run object (``tracker``) and
implements ``store_init_configuration``, ``log`` and ``finish``. Subclass it to log to anything; give an instance to
``Accelerator(log_with=[...])`` or register the class with ``register_tracker_class``.
"""
from __future__ import annotations

import importlib.util
from functools import wraps
from typing import Any, Callable, Optional, TypeVar

__all__ = ["GeneralTracker", "on_main_process"]

F = TypeVar("F", bound=Callable[..., Any])  # a tracker method, returned with its signature


def on_main_process(function: F) -> F:
    """Decorator for tracker methods: run on the main process only when the tracker's ``main_process_only`` is True.

    The process state is looked up when the method runs, not when the tracker is built.
    """

    @wraps(function)
    def execute_on_main_process(self: GeneralTracker, *args: Any, **kwargs: Any) -> Any:
        if getattr(self, "main_process_only", False):
            from ..state import PartialState

            return PartialState().on_main_process(function)(self, *args, **kwargs)
        return function(self, *args, **kwargs)

    return execute_on_main_process


class GeneralTracker:
    """Base class of trackers. Subclasses define ``name`` (str), ``requires_logging_directory`` (bool) and a
    ``tracker`` property, and override ``store_init_configuration`` / ``log`` / ``finish`` as their API needs.

    ``main_process_only`` (default True) makes methods decorated with ``on_main_process`` run on the main process
    only. ``start()`` is called once the process state exists, before anything is logged.
    """

    main_process_only = True
    #: the module the tracker runs on, imported when it starts; None when it needs none
    package: Optional[str] = None
    #: the pip distribution that installs ``package``, where the names differ
    distribution: Optional[str] = None

    @classmethod
    def is_installed(cls) -> bool:
        """Whether the tracker can run here: its ``package`` is importable (always, without one). What
        ``log_with`` and ``get_available_trackers`` ask; a tracker whose check is finer overrides it."""
        return cls.package is None or importlib.util.find_spec(cls.package) is not None

    def __init__(self, _blank: bool = False):
        if _blank:
            return
        missing = [f"`{name}`" for name in ("name", "requires_logging_directory") if not hasattr(self, name)]
        if "tracker" not in dir(self):  # a property that may need start() first: look it up without calling it
            missing.append("`tracker`")
        if missing:
            raise NotImplementedError(
                f"The tracker class {type(self).__name__} is missing the required attributes {', '.join(missing)}: "
                "define them in the class."
            )

    def start(self) -> None:
        """Create the run (called lazily, once the process group exists)."""

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        """Record ``values`` (str keys; bool, str, int, float or None values) as the run's hyperparameters."""

    def log(self, values: dict[str, Any], step: Optional[int] = None, **kwargs: Any) -> None:
        """Log ``values`` (str keys; str, int or float values) at ``step``."""

    def finish(self) -> None:
        """Close the run."""
