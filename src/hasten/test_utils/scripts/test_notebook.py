"""``notebook_launcher`` in the situations a notebook meets (Accelerate's CLI suite runs this file,
``test_utils/scripts/test_notebook.py``, with ``python``; it starts its processes itself).

The number of processes comes from ``HASTEN_NUM_PROCESSES`` / ``ACCELERATE_NUM_PROCESSES`` (default 1). Checked:

- a function that builds a ``PartialState`` runs (on one process: in this process);

and with two or more processes:

- the workers do not start in CUDA's broken-fork state (where a GPU is);
- both rendezvous back ends, ``static`` and ``c10d``;
- ``max_restarts``: a function that fails its first three tries succeeds on the fourth;
- monitoring: when one process fails, the launcher stops the others (one sleeping for 100 s) at once and raises
  torch's ``ChildFailedError`` carrying the failed process's message;
- where a GPU is and bitsandbytes is installed: importing it before launching is refused ("Please keep these
  imports inside your training function").

Every launch picks a free port (``use_port="0"``). Run: ``HASTEN_NUM_PROCESSES=2 python <this file>``.
"""
from __future__ import annotations

import importlib.util
import os
import time

import torch
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

from hasten.core.env_aliases import get_setting
from hasten.launchers import notebook_launcher
from hasten.state import PartialState

NUM_PROCESSES = int(get_setting("num_processes", 1))
SLEEP = 100


def describe_state():
    state = PartialState()
    print(f"PartialState:\n{state}")
    return state.num_processes


def fails_until_the_last_try(max_restarts: int):
    """Fails on purpose on every try but the last (torch's elastic agent numbers them in each worker's
    ``TORCHELASTIC_RESTART_COUNT``), where every process builds its state together."""
    restart = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    if restart < max_restarts:
        raise RuntimeError(f"Failing on purpose on try {restart + 1} of {max_restarts + 1}.")
    return describe_state()


def even_fails_odd_sleeps(seconds: int):
    if PartialState().process_index % 2 == 0:
        raise RuntimeError("An even process fails at once.")
    time.sleep(seconds)


def cuda_usable_after_fork():
    if torch.cuda.is_available():
        assert not torch._C._cuda_isInBadFork(), "the worker was forked after CUDA started in the launching process"


def check_runs() -> None:
    result = notebook_launcher(describe_state, (), num_processes=NUM_PROCESSES, use_port="0")
    counts = [result] if NUM_PROCESSES == 1 else list(result.values())
    assert counts == [NUM_PROCESSES] * NUM_PROCESSES, counts


def check_clean_cuda_fork() -> None:
    notebook_launcher(cuda_usable_after_fork, (), num_processes=NUM_PROCESSES, use_port="0")


def check_rendezvous_backends() -> None:
    for backend in ("static", "c10d"):
        result = notebook_launcher(describe_state, (), num_processes=NUM_PROCESSES, rdzv_backend=backend,
                                   use_port="0")
        assert sorted(result.values()) == [NUM_PROCESSES] * NUM_PROCESSES, (backend, result)


def check_restarts(max_restarts: int = 3) -> None:
    result = notebook_launcher(fails_until_the_last_try, (max_restarts,), num_processes=NUM_PROCESSES,
                               max_restarts=max_restarts, use_port="0")
    assert sorted(result.values()) == [NUM_PROCESSES] * NUM_PROCESSES, result


def check_a_failure_stops_the_others() -> None:
    start = time.time()
    try:
        notebook_launcher(even_fails_odd_sleeps, (SLEEP,), num_processes=NUM_PROCESSES, monitor_interval=0.01,
                          use_port="0")
    except ChildFailedError as error:
        assert "An even process fails at once." in str(error), str(error)
    else:
        raise AssertionError("a failed worker did not fail the launch")
    took = time.time() - start
    assert took < SLEEP, f"the sleeping worker was not stopped: the launch took {took:.0f} s"


def check_device_initialising_import_refused() -> None:
    import bitsandbytes  # noqa: F401  (set up the GPU in this process)

    try:
        notebook_launcher(describe_state, (), num_processes=NUM_PROCESSES, use_port="0")
    except RuntimeError as error:
        assert "Please keep these imports" in str(error), str(error)
    else:
        raise AssertionError("a launch after importing bitsandbytes on a GPU machine was not refused")


def main() -> None:
    print(f"notebook_launcher with {NUM_PROCESSES} process(es)")
    checks = [check_runs]
    if NUM_PROCESSES > 1:
        checks += [check_clean_cuda_fork, check_rendezvous_backends, check_restarts, check_a_failure_stops_the_others]
        if torch.cuda.is_available() and importlib.util.find_spec("bitsandbytes") is not None:
            checks.append(check_device_initialising_import_refused)
    for check in checks:
        print(check.__name__)
        check()
    print("NOTEBOOK LAUNCHER PASSED")


if __name__ == "__main__":
    main()
