"""notebook_launcher / debug_launcher start real processes from Python."""
import pytest

from hasten.launchers import debug_launcher, notebook_launcher
from helpers import one_multiprocess_job_at_a_time


def _report(offset):
    from hasten.state import PartialState
    from hasten.core.env_vars import env_name
    import os

    state = PartialState()
    state.wait_for_everyone()
    return (state.process_index + offset, state.num_processes, state.distributed_type.value,
            os.environ.get(env_name("mixed_precision")), os.environ.get(env_name("use_cpu")))


def test_debug_launcher_runs_two_cpu_processes():
    with one_multiprocess_job_at_a_time():
        results = debug_launcher(_report, args=(10,), num_processes=2)
    assert sorted(results.values()) == [(10, 2, "MULTI_CPU", "no", "true"), (11, 2, "MULTI_CPU", "no", "true")]


def test_notebook_launcher_single_process_runs_inline():
    assert notebook_launcher(lambda a, b: a + b, args=(2, 3), num_processes=1, mixed_precision="bf16") == 5


def test_notebook_launcher_passes_mixed_precision_and_rejects_bad_input():
    with one_multiprocess_job_at_a_time():
        results = notebook_launcher(_report, args=(0,), num_processes=2, mixed_precision="bf16", use_port="0")
    assert {value[3] for value in results.values()} == {"bf16"}
    with pytest.raises(ValueError, match="mixed_precision"):
        notebook_launcher(_report, num_processes=2, mixed_precision="fp12")
    with pytest.raises(ValueError, match="num_processes"):
        notebook_launcher(_report, num_processes=0)


def test_notebook_launcher_refuses_a_busy_port():
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        with pytest.raises(RuntimeError, match="already in use"):
            notebook_launcher(_report, num_processes=2, use_port=str(port))


def test_notebook_launcher_after_a_state_exists_starts_workers_with_their_own():
    """A notebook (or a test before) made a PartialState: the workers do not inherit it (a forked copy would
    describe one process); each starts its own, of two processes."""
    from hasten.state import PartialState

    PartialState(cpu=True)
    with one_multiprocess_job_at_a_time():
        results = notebook_launcher(_report, args=(0,), num_processes=2, use_port="0")
    assert sorted(value[:3] for value in results.values()) == [(0, 2, "MULTI_CPU"), (1, 2, "MULTI_CPU")]
    assert PartialState().num_processes == 1  # this process's own state is left as it was


def test_notebook_launcher_refuses_to_fork_after_a_device_initialising_import_where_a_gpu_is(monkeypatch):
    """bitsandbytes sets up the GPU when imported: forked workers would start with a device they cannot use. The
    refusal keeps the reference's phrase and comes before any process starts; without a GPU the import touches no
    device and the launch goes on; start_method='spawn' does not fork, so it is not refused."""
    import sys
    import types

    import torch

    import hasten.launchers as launchers

    started = []
    monkeypatch.setattr("torch.distributed.launcher.api.elastic_launch",
                        lambda config, entrypoint: lambda *args: started.append(config.start_method) or {0: None})
    monkeypatch.setitem(sys.modules, "bitsandbytes", types.ModuleType("bitsandbytes"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    with pytest.raises(RuntimeError, match="Please keep these imports inside your training function") as raised:
        launchers.notebook_launcher(_report, num_processes=2, use_port="0")
    assert "bitsandbytes" in str(raised.value) and started == []
    launchers.notebook_launcher(_report, num_processes=2, use_port="0", start_method="spawn")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    launchers.notebook_launcher(_report, num_processes=2, use_port="0")
    assert started == ["spawn", "fork"]
