"""``TrackerSession``: the trackers of one ``Accelerator`` — which ``log_with`` asked for, which run on this
process, and whether a run is open — so the Accelerator's tracker methods stay one line each.

Every process may go through ``start`` / ``log`` / ``finish``; a tracker runs on the main process only unless its
``main_process_only`` is False. Input is checked on every process that calls, before any tracker acts, so a bad call
fails the same way everywhere and no tracker holds half of it. As in the reference, the calls are also safe on the
main process alone (diffusers' scripts start the trackers inside ``if accelerator.is_main_process:`` and log on every
process): on the other processes ``log`` without an open run does nothing.
"""
from __future__ import annotations

import numbers
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Optional, Union

from .base import GeneralTracker
from .registry import LOGGER_TYPE_TO_CLASS, TrackerEntry, filter_trackers
from .values import prepare_log_values

if TYPE_CHECKING:
    import torch

    from ..config.project import ProjectConfiguration

__all__ = ["TrackerSession", "logging_dir_of"]


def logging_dir_of(project_dir: Optional[Union[str, os.PathLike]] = None,
                   project_config: Optional[ProjectConfiguration] = None) -> Optional[str]:
    """The logging directory that ``Accelerator(project_dir=..., project_config=...)`` will have."""
    if project_config is not None and getattr(project_config, "logging_dir", None) is not None:
        return os.fspath(project_config.logging_dir)
    if project_dir is not None:
        return os.fspath(project_dir)
    return getattr(project_config, "project_dir", None)


def _entry_name(entry) -> str:
    return entry.name if isinstance(entry, GeneralTracker) else str(entry)


def _check_step(step):
    if step is None:
        return None
    if hasattr(step, "item") and not isinstance(step, numbers.Number):  # a one-element tensor
        step = step.item()
    if isinstance(step, bool) or not isinstance(step, numbers.Integral):
        raise TypeError(f"Accelerator.log(step=...) takes an int (or None), got {step!r}.")
    return int(step)


class TrackerSession:
    """What ``log_with`` named (checked now: known, installed, logging directory present) and the open run."""

    def __init__(self, log_with: Optional[Union[TrackerEntry, list[TrackerEntry]]] = None,
                 logging_dir: Optional[Union[str, os.PathLike]] = None):
        self.log_with = filter_trackers(log_with, logging_dir)
        self.is_open = False

    @property
    def names(self) -> list[str]:
        return [_entry_name(entry) for entry in self.log_with]

    def start(self, project_name: str, config: Any, init_kwargs: Optional[dict[str, dict[str, Any]]],
              logging_dir: Optional[Union[str, os.PathLike]], is_main_process: bool) -> list[GeneralTracker]:
        """Build and start the trackers that run on this process; return them. ``init_kwargs`` is
        ``{tracker name: {keyword: value}}`` for the built-in trackers' constructors."""
        if self.is_open and self.log_with:
            raise RuntimeError("init_trackers() was already called for this run: call end_training() before starting "
                               "another one.")
        named = [entry for entry in self.log_with if not isinstance(entry, GeneralTracker)]
        if (named or project_name is not None) and (not isinstance(project_name, str) or not project_name):
            # trackers given by name are built with it; tracker objects were built already (None is fine then)
            raise ValueError(f"init_trackers(project_name=...) takes a non-empty str, got {project_name!r}"
                             + (f" (the trackers named {[str(e) for e in named]} are built with it)." if named
                                else "."))
        init_kwargs = {} if init_kwargs is None else init_kwargs
        if not isinstance(init_kwargs, dict) or not all(isinstance(v, dict) for v in init_kwargs.values()):
            raise TypeError("init_trackers(init_kwargs=...) takes {tracker name: {keyword: value}}, e.g. "
                            "{'wandb': {'mode': 'offline'}}.")
        for entry in self.log_with:
            if not isinstance(entry, GeneralTracker) and LOGGER_TYPE_TO_CLASS[str(entry)].requires_logging_directory \
                    and logging_dir is None:
                raise ValueError(f"Logging with `{entry}` requires a `logging_dir`, and the Accelerator's "
                                 "project_configuration.logging_dir is None.")
        trackers = []
        for entry in self.log_with:
            if isinstance(entry, GeneralTracker):
                tracker = entry
            elif is_main_process or not LOGGER_TYPE_TO_CLASS[str(entry)].main_process_only:
                tracker = self._build(str(entry), project_name, logging_dir, dict(init_kwargs.get(str(entry), {})))
            else:
                continue
            if is_main_process or not tracker.main_process_only:
                trackers.append(tracker)
        started = []
        try:
            for tracker in trackers:
                tracker.start()
                started.append(tracker)
                if config is not None:
                    tracker.store_init_configuration(config)
        except BaseException:
            for tracker in started:  # close what was opened, then report the failure
                tracker.finish()
            raise
        self.is_open = True
        return trackers

    @staticmethod
    def _build(name: str, project_name: str, logging_dir, kwargs: dict) -> GeneralTracker:
        tracker_class = LOGGER_TYPE_TO_CLASS[name]
        if tracker_class.requires_logging_directory:
            tracker = tracker_class(project_name, os.fspath(logging_dir), **kwargs)
        else:
            tracker = tracker_class(project_name, **kwargs)
        if logging_dir is not None and hasattr(tracker, "_use_logging_dir"):  # built-ins that can write locally
            tracker._use_logging_dir(os.fspath(logging_dir))
        return tracker

    def log(self, trackers: list[GeneralTracker], values: Mapping[str, Any],
            step: Optional[Union[int, torch.Tensor]] = None, log_kwargs: Optional[dict[str, dict[str, Any]]] = None,
            is_main_process: bool = True) -> None:
        """Check ``values`` (tensors of one element become numbers) and ``step``, then log to ``trackers``. With no
        run open: an error on the main process, nothing on the others (their run may have been started on the main
        process only)."""
        if self.log_with and not self.is_open:
            if not is_main_process:
                return
            raise RuntimeError("Accelerator.log() was called with no tracker run open: call "
                               "accelerator.init_trackers(project_name, config) first (and not after end_training()).")
        values = prepare_log_values(values)
        step = _check_step(step)
        log_kwargs = log_kwargs or {}
        for tracker in trackers:
            tracker.log(values, step=step, **log_kwargs.get(tracker.name, {}))

    def finish(self, trackers: list[GeneralTracker]) -> None:
        """Finish every tracker (all of them, even when one fails; the first failure is raised after)."""
        error = None
        for tracker in trackers:
            try:
                tracker.finish()
            except Exception as failure:  # noqa: BLE001 - the others still get closed
                error = error or failure
        self.is_open = False
        if error is not None:
            raise error

    def get(self, trackers: list[GeneralTracker], name: str, unwrap: bool = False) -> Any:
        """The tracker called ``name`` on this process (its run object with ``unwrap``). A configured tracker that
        does not run here (another process's, or before init_trackers) is a blank tracker whose methods do
        nothing; a name that is not configured is a ValueError."""
        for tracker in trackers:
            if tracker.name == name:
                return tracker.tracker if unwrap else tracker
        if self.log_with and name not in self.names:
            raise ValueError(f"{name!r} is not one of the Accelerator's trackers: they are {', '.join(self.names)}.")
        return GeneralTracker(_blank=True)
