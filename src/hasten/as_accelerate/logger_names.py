"""Logger names under the switch: ``logging.getLogger("accelerate.X")`` is hasten's ``hasten.X`` logger.

Code written for Accelerate (its users' tests, ``assertLogs("accelerate.utils.environment")``, a handler put on
``logging.getLogger("accelerate")``) names the reference's loggers. With the switch on, those names answer with
hasten's logger at the same path, so the records hasten writes reach them: the same promise as for modules. A room
whose messages Accelerate writes under a face's name logs under that name (``core/environment.py`` as
``hasten.utils.environment``). Only names starting with ``accelerate`` are touched; off, nothing changes.
"""
from __future__ import annotations

import logging

__all__ = ["alias_logger_names", "unalias_logger_names"]

_ALIAS, _HOME = "accelerate", "hasten"


class _AliasingGetLogger:
    """``Manager.getLogger`` answering ``accelerate[.X]`` with the ``hasten[.X]`` logger."""

    def __init__(self, original):
        self.original = original

    def __call__(self, name):
        if isinstance(name, str) and (name == _ALIAS or name.startswith(_ALIAS + ".")):
            name = _HOME + name[len(_ALIAS):]
        return self.original(name)


def alias_logger_names() -> None:
    manager = logging.Logger.manager
    if not isinstance(manager.getLogger, _AliasingGetLogger):
        manager.getLogger = _AliasingGetLogger(manager.getLogger)


def unalias_logger_names() -> None:
    manager = logging.Logger.manager
    if isinstance(manager.getLogger, _AliasingGetLogger):
        del manager.getLogger  # the class's method again
