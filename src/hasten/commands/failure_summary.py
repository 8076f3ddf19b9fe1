"""Which rank started a failed job, and the summary ``hasten launch`` prints about it.

torchrun's agent records one ``ProcessFailure`` per failed worker and calls the one with the smallest
timestamp the root cause. That goes wrong in two common ways:

- timestamps have one-second resolution, and a worker that failed *because* a peer died (gloo's
  "Connection closed by peer", recorded in its error file) is as early as the peer, or earlier: a worker
  killed by a signal has no error file, so its time is only when the agent noticed it;
- the ranks the agent stops after the first failure (SIGTERM) are failures too.

The rules here: a worker the agent stopped (SIGTERM) is never the root cause while another one is; the
failures of the first few seconds form the first wave; in that wave a death by a signal no peer can cause
(SIGKILL, SIGSEGV, ...) wins over a Python error, which is often only the echo of that death; then the
earliest (sub-second times, which ``run_script`` adds to the error file), then the lowest rank.
"""
from __future__ import annotations

import signal
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

__all__ = ["root_cause", "precise_time", "signal_hint", "PRECISE_TIME_KEY"]

PRECISE_TIME_KEY = "hasten_time"  # in the error file's message.extraInfo: time.time() of the failure
FIRST_WAVE_SECONDS = 3.0  # later failures are consequences (the agent's SIGKILL comes 30 s after its SIGTERM)

_STOPPED_BY_AGENT = -signal.SIGTERM
# deaths a peer's failure cannot cause; SIGABRT is left out (NCCL's watchdog aborts a rank whose peer died)
_DECISIVE_SIGNALS = {-int(getattr(signal, name)) for name in
                     ("SIGKILL", "SIGSEGV", "SIGBUS", "SIGILL", "SIGFPE", "SIGSYS", "SIGXCPU", "SIGXFSZ")
                     if hasattr(signal, name)}


def precise_time(failure: ProcessFailure) -> float:
    """The failure's time: the sub-second one from its error file when there is one, else torch's timestamp."""
    data = getattr(failure, "error_file_data", None)
    try:
        return float(data["message"]["extraInfo"][PRECISE_TIME_KEY])
    except (TypeError, KeyError, ValueError):
        return float(failure.timestamp)


def root_cause(failures: dict[int, ProcessFailure]) -> tuple[int, ProcessFailure]:
    """``(rank, failure)`` that started a failed job (see the module's docstring for the rules)."""
    candidates = {rank: f for rank, f in failures.items() if f.exitcode != _STOPPED_BY_AGENT} or dict(failures)
    start = min(float(f.timestamp) for f in candidates.values())
    wave = {rank: f for rank, f in candidates.items() if float(f.timestamp) <= start + FIRST_WAVE_SECONDS}
    rank = min(wave, key=lambda r: (wave[r].exitcode not in _DECISIVE_SIGNALS, precise_time(wave[r]), r))
    return rank, wave[rank]


def signal_hint(rank: int, failure: ProcessFailure) -> str | None:
    """A line on what probably sent the root cause's signal, or None when the worker did not die by one."""
    if failure.exitcode >= 0:
        return None
    try:
        name = signal.Signals(-failure.exitcode).name
    except ValueError:
        name = f"signal {-failure.exitcode}"
    where = f"rank {rank} (pid {failure.pid})"
    if failure.exitcode == -signal.SIGKILL:
        return (f"hasten launch: {where} was killed by SIGKILL, which a program does not send itself by accident: "
                "most often it is the kernel's out-of-memory (OOM) killer. Check `dmesg` (or `journalctl -k`) for "
                "'Out of memory' / 'oom-kill', and the machine's memory use (fewer processes, a smaller batch, "
                "fewer DataLoader workers).")
    if failure.exitcode == _STOPPED_BY_AGENT:
        return (f"hasten launch: {where} ended by SIGTERM, sent from outside the job (the launcher sends it only "
                "after another failure): a scheduler's preemption or time limit, or a `kill`.")
    return f"hasten launch: {where} died by {name}: a crash in native code (the rank's output may show a stack)."
