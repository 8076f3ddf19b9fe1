"""``get_logger``: a logger that, by default, logs on the main process only.

``logger.info("...", main_process_only=False)`` logs on every process; ``in_order=True`` makes the processes
log one after the other, in rank order.
"""
from __future__ import annotations

import logging
from typing import Any, Optional

from .core.env_aliases import get_setting
from .state import PartialState

__all__ = ["get_logger", "MultiProcessAdapter"]


class MultiProcessAdapter(logging.LoggerAdapter):
    """A ``LoggerAdapter`` that knows which process it runs in."""

    @staticmethod
    def _should_log(main_process_only: bool) -> bool:
        state = PartialState()
        return not main_process_only or state.is_main_process

    def log(self, level: int, msg: object, *args: Any, **kwargs: Any) -> None:
        main_process_only = kwargs.pop("main_process_only", True)
        in_order = kwargs.pop("in_order", False)
        kwargs.setdefault("stacklevel", 2)
        enabled = self.isEnabledFor(level)
        if not enabled and not in_order:
            return
        if not PartialState._shared_state:
            raise RuntimeError(
                "get_logger(...) was used before the process state exists: create the Accelerator (or "
                "PartialState()) before logging with it."
            )
        if in_order:
            # The barriers are entered whatever this process's log level: levels are per process (scripts often
            # quieten all but the main one), and a process that skipped them would leave the others waiting.
            state = PartialState()
            for index in range(state.num_processes):
                if index == state.process_index and enabled:
                    msg_, kwargs_ = self.process(msg, kwargs)
                    self.logger.log(level, msg_, *args, **kwargs_)
                state.wait_for_everyone()
        elif self._should_log(main_process_only):
            msg, kwargs = self.process(msg, kwargs)
            self.logger.log(level, msg, *args, **kwargs)

    def warning_once(self, *args: Any, **kwargs: Any) -> None:
        """``warning`` that is emitted only once per message."""
        key = (args, tuple(sorted(kwargs.items())))
        if key not in _WARNED:
            _WARNED.add(key)
            self.warning(*args, **kwargs)


_WARNED: set = set()


def get_logger(name: str, log_level: Optional[str] = None) -> MultiProcessAdapter:
    """A logger for ``name`` whose calls take ``main_process_only`` (default True) and ``in_order``.

    ``log_level`` (or the ``HASTEN_LOG_LEVEL`` / ``ACCELERATE_LOG_LEVEL`` environment variable) sets the level
    of the underlying logger.
    """
    log_level = log_level or get_setting("log_level")  # HASTEN_LOG_LEVEL or ACCELERATE_LOG_LEVEL
    logger = logging.getLogger(name)
    if log_level is not None:
        logger.setLevel(log_level.upper())
        logger.root.setLevel(log_level.upper())
    return MultiProcessAdapter(logger, {})
