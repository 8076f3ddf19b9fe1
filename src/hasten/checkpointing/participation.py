"""Who writes what in a ``save_state``, decided without waiting for processes that may never come.

Under a strategy that holds the whole state on every process (one process, DDP: ``Strategy.saves_from_one_process``)
the main process writes the complete checkpoint by itself, whether the other processes call ``save_state`` too (the
usual way) or not (diffusers' scripts call it inside ``if accelerator.is_main_process:``). Every other process that
does call it adds its own files (its random states, its loaders' positions) to that checkpoint once the main
process has completed it (``contributions.py``); one that does not call it adds nothing and nothing waits for it.
The two processes meet through the process group's key-value store, one handshake per ``save_state`` call:

- the main process publishes the folder it saves to as it starts (``{call}/folder``), then the outcome once the
  checkpoint is complete or has failed (``{call}/outcome``); as it completes the checkpoint it records which
  processes have announced that they are adding their files (``{call}/coming``), so that a process killed half way
  makes the checkpoint incomplete rather than silently without its random states;
- another process reads the main process's folder for the same call: the same folder, it contributes; another
  folder (each process was given a temporary folder of its own, as some scripts do), it saves a complete
  checkpoint there by itself.

``call`` counts the main process's ``save_state`` calls; another process pairs its n-th call with the main
process's next one it has not seen. A run that saves on every process keeps them paired; one that saves on the main
process only never asks the others. A run that mixes the two (saves on the main process only, later on every
process) skips the main process's calls the others took no part in when they name another folder and the main
process already started the next one; otherwise this process counts the call as one into a folder of its own.

Two cases keep the collective save, where every process takes part in every step and a failure anywhere stops all
of them: strategies whose state lives in shards on every process (FSDP, DeepSpeed, tensor parallelism; they cannot
save from one process, and, as in the reference, ``save_state`` must be called on every process), and
``ProjectConfiguration(save_on_each_node=True)``, where each machine's main process writes a copy on its own disk.
The latter still accepts a save called on the main process only: the main process waits up to
``HASTEN_SAVE_STATE_JOIN_TIMEOUT`` seconds (default 10) for the others and, when they do not come, saves alone.
"""
from __future__ import annotations

import itertools
import logging
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from ..collectives.process_view import ProcessView
from ..core.env_aliases import get_setting
from ..state import PartialState
from .errors import CheckpointError

if TYPE_CHECKING:
    from .strategy_protocol import CheckpointingStrategy

__all__ = ["Participation", "saves_apart", "settle_participation", "Handshake"]

logger = logging.getLogger(__name__)

_DEFAULT_JOIN_SECONDS = 10.0
_calls = itertools.count(1)  # the main process's save_state calls that meet the others' through the store
_next_main_call = [1]  # another process: the first call of the main process it has not paired with or skipped
_joins = itertools.count(1)  # the same for the save_on_each_node decision


class Handshake:
    """One ``save_state`` call's keys in the process group's store (see the module docstring)."""

    def __init__(self, call: int):
        from torch.distributed import distributed_c10d

        self.store = distributed_c10d._get_default_store()
        self.call = call
        self.prefix = f"hasten/save_state/{call}"

    def publish_folder(self, folder: Path) -> None:
        self.store.set(f"{self.prefix}/folder", str(folder))

    def main_folder(self) -> str:
        """The folder the main process saves to in this call (waits until it has started)."""
        return self._wait("folder", "to start its save_state")

    def announce(self, process_index: int) -> None:
        """Another process: say that this process is adding its files to this save."""
        self.store.append(f"{self.prefix}/coming", f"{process_index},")

    def announced(self) -> list[int]:
        """The main process, as it completes the checkpoint: the processes that announced themselves so far (their
        files are then required at load; see ``contributions.py``)."""
        key = f"{self.prefix}/coming"
        if not self.store.check([key]):
            return []
        return sorted(int(item) for item in self.store.get(key).decode().split(",") if item)

    def started(self) -> bool:
        """Whether the main process has started this call (without waiting)."""
        return self.store.check([f"{self.prefix}/folder"])

    def publish_outcome(self, save_id: Optional[str], error: Optional[BaseException] = None) -> None:
        text = f"ok {save_id}" if error is None else f"failed {type(error).__name__}: {error}"
        self.store.set(f"{self.prefix}/outcome", text)

    def outcome(self) -> str:
        """The save's id once the main process completed it; raises ``CheckpointError`` if it failed."""
        text = self._wait("outcome", "to complete the checkpoint")
        if text.startswith("ok "):
            return text[3:]
        raise CheckpointError(f"The main process's save failed ({text[len('failed '):]}), so this process's files "
                              "were not added to it.")

    def _wait(self, key: str, what: str) -> str:
        from torch.distributed import distributed_c10d

        timeout = getattr(distributed_c10d, "default_pg_timeout", timedelta(minutes=30))
        try:
            self.store.wait([f"{self.prefix}/{key}"], timeout)
        except Exception as error:  # noqa: BLE001 - the store's timeout: say what was awaited
            raise CheckpointError(
                f"save_state waited {timeout} for the main process {what} and it did not: call save_state on the "
                "main process whenever the other processes call it.") from error
        return self.store.get(f"{self.prefix}/{key}").decode()


@dataclass
class Participation:
    """How this process takes part in one save.

    ``processes``: what the save's collectives run over (None: every process; a one-process view when this process
    writes a checkpoint by itself). ``handshake``: set when the main process writes alone and publishes its outcome.
    ``contributes``: this process adds its own files to the main process's checkpoint (``contributions.py``).
    ``skip``: this process writes nothing (save_on_each_node: the main process already saved alone). ``alone``: the
    main process writes the checkpoint without the others' files (they add them, or, with save_on_each_node, not).
    ``own_folder``: this process, not the main one, writes a whole checkpoint into a folder of its own."""
    processes: object = None
    handshake: Optional[Handshake] = None
    contributes: bool = False
    skip: bool = False
    alone: bool = False
    own_folder: bool = False


def saves_apart(strategy: CheckpointingStrategy) -> bool:
    """Whether the main process writes the checkpoint without waiting for the others (several processes, a
    strategy that holds the whole state on every process); else every process saves together."""
    return PartialState().use_distributed and bool(getattr(strategy, "saves_from_one_process", False))


def settle_participation(strategy: CheckpointingStrategy, folder: Path,
                         save_on_each_node: bool = False) -> Participation:
    """Decide how this process takes part in saving to ``folder`` (see the module docstring)."""
    state = PartialState()
    if not saves_apart(strategy):
        return Participation()  # one process, or state in shards on every process: together, as always
    if save_on_each_node:
        return _join_or_alone(state)
    if state.is_main_process:
        handshake = Handshake(next(_calls))
        handshake.publish_folder(folder)
        return Participation(processes=ProcessView.alone(state), handshake=handshake, alone=True)
    handshake = _pair(str(folder))
    if handshake is not None:
        return Participation(handshake=handshake, contributes=True)
    return Participation(processes=ProcessView.alone(state), own_folder=True)  # a whole checkpoint there


def _pair(folder: str) -> Optional[Handshake]:
    """Another process: the main process's call saving to ``folder`` that this call pairs with, or None when the
    main process saves elsewhere (see the module docstring)."""
    first = Handshake(_next_main_call[0])
    if first.main_folder() == folder:
        _next_main_call[0] = first.call + 1
        return first
    later = Handshake(first.call + 1)
    while later.started():  # calls the main process made alone: skip them if it already started this one
        if later.main_folder() == folder:
            _next_main_call[0] = later.call + 1
            return later
        later = Handshake(later.call + 1)
    _next_main_call[0] = first.call + 1
    return None


def _join_seconds() -> float:
    return get_setting("save_state_join_timeout", _DEFAULT_JOIN_SECONDS, parse=float)


def _join_or_alone(state) -> Participation:
    """save_on_each_node: every process that calls ``save_state`` counts itself in; the main process waits until all
    have or ``HASTEN_SAVE_STATE_JOIN_TIMEOUT`` passed, and decides: together, or alone."""
    from torch.distributed import distributed_c10d

    store = distributed_c10d._get_default_store()
    key = f"hasten/save_state_on_each_node/{next(_joins)}"
    store.add(f"{key}/arrived", 1)
    if state.is_main_process:
        deadline = time.monotonic() + _join_seconds()
        while store.add(f"{key}/arrived", 0) < state.num_processes and time.monotonic() < deadline:
            time.sleep(0.002)
        decision = "together" if store.add(f"{key}/arrived", 0) >= state.num_processes else "alone"
        store.set(f"{key}/decision", decision)
    else:
        store.wait([f"{key}/decision"], getattr(distributed_c10d, "default_pg_timeout", timedelta(minutes=30)))
        decision = store.get(f"{key}/decision").decode()
    if decision == "together":
        return Participation()
    if state.is_main_process:
        logger.info("save_state was called on the main process only: it saves alone (save_on_each_node).")
        return Participation(processes=ProcessView.alone(state), alone=True)
    logger.info("The main process saved this checkpoint alone (the other processes did not call save_state in time); "
                "process %d writes nothing.", state.process_index)
    return Participation(skip=True, alone=True)
