"""``hasten.test_utils``: Accelerate's testing helpers (decorators, subprocesses, launching, regression fixtures)."""
from __future__ import annotations

import importlib.util
import os
import signal
import sys
import unittest
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
import torch

import hasten.test_utils as tu
from hasten.state import AcceleratorState, PartialState
from hasten.test_utils import testing, training
from helpers import one_multiprocess_job_at_a_time, clean_env


def skipped(decorated) -> bool:
    return bool(getattr(decorated, "__unittest_skip__", False))


def a_test():
    pass


# ---------------------------------------------------------------- regression fixtures


def test_regression_dataset_fields_length_and_seed():
    data = training.RegressionDataset(length=50, seed=7)
    assert len(data) == 50 and data.x.shape == data.y.shape == (50,)
    assert data.x.dtype == data.y.dtype == np.float32
    item = data[3]
    assert set(item) == {"x", "y"} and item["x"] == data.x[3] and item["y"] == data.y[3]
    again = training.RegressionDataset(length=50, seed=7)
    assert np.array_equal(data.x, again.x) and np.array_equal(data.y, again.y)
    other = training.RegressionDataset(length=50, seed=8)
    assert not np.array_equal(data.x, other.x)


def test_regression_dataset_is_a_line_with_a_little_noise():
    data = training.RegressionDataset(a=-1.5, b=4, length=2000, seed=0)
    slope, intercept = np.polyfit(data.x, data.y, 1)
    assert abs(slope + 1.5) < 0.02 and abs(intercept - 4) < 0.02
    residual = data.y - (-1.5 * data.x + 4)
    assert 0.08 < residual.std() < 0.12


def test_regression_dataset_matches_the_reference_for_a_seed():
    reference = pytest.importorskip("accelerate.test_utils.training")
    ours, theirs = training.RegressionDataset(a=3, b=1, length=32, seed=11), reference.RegressionDataset(
        a=3, b=1, length=32, seed=11)
    assert np.array_equal(ours.x, theirs.x) and np.array_equal(ours.y, theirs.y)


def test_regression_model_forward_parameters_and_first_batch_print():
    model = training.RegressionModel(a=2, b=3)
    assert [name for name, _ in model.named_parameters()] == ["a", "b"]
    assert model.a.dtype == torch.float32 and model.first_batch
    x = torch.tensor([0.0, 1.0, 2.0])
    printed = tu.capture_call_output(model, x)
    assert "Model dtype: torch.float32, torch.float32. Input dtype: torch.float32" in printed
    assert not model.first_batch
    assert torch.equal(model(x), torch.tensor([3.0, 5.0, 7.0]))
    assert tu.capture_call_output(model, x) == ""  # printed once


def test_regression_model_learns_the_dataset():
    data = training.RegressionDataset(length=256, seed=1)
    model = training.RegressionModel()
    model.first_batch = False
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = torch.utils.data.DataLoader(data, batch_size=16, shuffle=True)
    for _ in range(5):
        for batch in loader:
            loss = torch.nn.functional.mse_loss(model(batch["x"]), batch["y"])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    assert abs(model.a.item() - 2) < 0.1 and abs(model.b.item() - 3) < 0.1


def test_mocked_dataloaders_say_what_to_install():
    if importlib.util.find_spec("datasets") and importlib.util.find_spec("transformers"):
        pytest.skip("the Hugging Face suite is installed")
    with pytest.raises(ImportError, match="pip install"):
        training.mocked_dataloaders(None)


# ---------------------------------------------------------------- device and decorators


def test_backend_matches_torch():
    device, count, allocated = testing.get_backend()
    assert (device, count) == (tu.torch_device, tu.device_count)
    if torch.cuda.is_available():
        assert device == "cuda" and count == torch.cuda.device_count()
    elif device == "cpu":
        assert count == 1 and tu.memory_allocated_func() == 0
    assert isinstance(allocated(), int)


def test_device_decorators_follow_the_machine():
    on_cpu = tu.torch_device == "cpu"
    assert skipped(tu.require_cpu(a_test)) is not on_cpu
    assert skipped(tu.require_non_cpu(a_test)) is on_cpu
    assert skipped(tu.require_cuda(a_test)) is not torch.cuda.is_available()
    assert skipped(tu.require_multi_device(a_test)) is not (tu.device_count > 1)
    assert skipped(tu.require_single_device(a_test)) is not (not on_cpu and tu.device_count == 1)
    assert skipped(tu.require_multi_gpu(a_test)) is not (torch.cuda.device_count() > 1)
    assert skipped(tu.require_non_torch_xla(a_test)) is bool(importlib.util.find_spec("torch_xla"))
    assert skipped(tu.require_fp16(a_test)) is False


def test_package_decorators_follow_what_is_installed():
    for decorator, module in [(tu.require_bnb, "bitsandbytes"), (tu.require_torchvision, "torchvision"),
                              (tu.require_torchao, "torchao"), (testing.require_deepspeed, "deepspeed"),
                              (testing.require_pandas, "pandas"), (testing.require_triton, "triton")]:
        assert skipped(decorator(a_test)) is (importlib.util.find_spec(module) is None), decorator.__name__


def test_torch_min_version_with_and_without_arguments():
    assert not skipped(tu.require_torch_min_version(version="1.0")(a_test))
    assert skipped(tu.require_torch_min_version(a_test, version="99.0"))
    with pytest.raises(ValueError, match="version"):
        tu.require_torch_min_version(a_test)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnknownMarkWarning")  # pytest-order is not installed here
def test_skip_slow_and_run_first():
    assert skipped(tu.skip(a_test))
    assert skipped(tu.slow(a_test)) is not testing._run_slow_tests
    def first():
        pass

    marked = tu.run_first(first)
    assert [mark.name for mark in marked.pytestmark] == ["order"] and marked.pytestmark[0].args == (1,)


def test_every_decorator_decides_like_the_reference():
    """On this machine each require_* skips exactly when Accelerate's does."""
    reference = pytest.importorskip("accelerate.test_utils.testing")
    names = [name for name in dir(reference) if name.startswith("require_")]
    differing = []
    for name in names:
        kwargs = {"version": "2.0"} if name == "require_torch_min_version" else {}
        ours = getattr(testing, name)(a_test, **kwargs)
        try:
            theirs = getattr(reference, name)(a_test, **kwargs)
        except Exception:  # the reference's require_tp raises when transformers is not installed; ours skips
            assert skipped(ours), name
            continue
        if skipped(ours) != skipped(theirs):
            differing.append(f"{name}: hasten skips={skipped(ours)}, reference skips={skipped(theirs)}")
    assert len(names) > 50 and not differing, differing


def test_decorators_work_on_unittest_classes():
    @tu.require_cuda
    class NeedsCuda(unittest.TestCase):
        def test_nothing(self):
            pass

    result = unittest.TestResult()
    unittest.defaultTestLoader.loadTestsFromTestCase(NeedsCuda).run(result)
    assert len(result.skipped) == (0 if torch.cuda.is_available() else 1)


def test_parse_flag_from_env(monkeypatch):
    monkeypatch.setenv("HASTEN_TEST_FLAG", "yes")
    assert testing.parse_flag_from_env("HASTEN_TEST_FLAG") is True
    monkeypatch.setenv("HASTEN_TEST_FLAG", "perhaps")
    with pytest.raises(ValueError, match="HASTEN_TEST_FLAG must be yes or no"):
        testing.parse_flag_from_env("HASTEN_TEST_FLAG")
    assert testing.parse_flag_from_env("HASTEN_TEST_UNSET", default=True) is True


# ---------------------------------------------------------------- launching and subprocesses


def test_get_launch_command():
    assert tu.get_launch_command(num_processes=2, monitor_interval=0.1, cpu=True, debug=False, config_file=None) \
        == ["hasten", "launch", "--num_processes=2", "--monitor_interval=0.1", "--cpu"]
    assert tu.DEFAULT_LAUNCH_COMMAND == ["hasten", "launch", f"--num_processes={tu.device_count}",
                                         "--monitor_interval=0.1"]


def test_execute_subprocess_async_streams_and_returns_lines(capsys):
    result = tu.execute_subprocess_async(
        [Path(sys.executable), "-c", "import sys; print('one'); print('two'); print('oops', file=sys.stderr)"])
    assert result.returncode == 0 and result.stdout == ["one", "two"] and result.stderr == ["oops"]
    printed = capsys.readouterr()
    assert "Running:" in printed.out and "stdout: one" in printed.out and "stderr: oops" in printed.err
    tu.execute_subprocess_async([sys.executable, "-c", "print('quiet')"], quiet=True, echo=False)
    assert capsys.readouterr().out == ""


def test_execute_subprocess_async_passes_env_and_stdin(tmp_path):
    source = tmp_path / "input.txt"
    source.write_text("from stdin\n")
    code = "import os, sys; print(os.environ['HASTEN_TEST_VALUE']); print(sys.stdin.read().strip())"
    with open(source) as stdin:
        result = tu.execute_subprocess_async([sys.executable, "-c", code], env={**os.environ, "HASTEN_TEST_VALUE": "42"},
                                             stdin=stdin, quiet=True, echo=False)
    assert result.stdout == ["42", "from stdin"]


def test_execute_subprocess_async_failure_shows_stdout_and_stderr():
    code = "import sys; print('progress so far'); print('the real error', file=sys.stderr); sys.exit(3)"
    with pytest.raises(RuntimeError) as caught:
        tu.execute_subprocess_async([sys.executable, "-c", code], quiet=True, echo=False)
    message = str(caught.value)
    assert "failed with returncode 3" in message and "the real error" in message and "progress so far" in message


def test_execute_subprocess_async_signal_and_timeout_are_failures():
    with pytest.raises(RuntimeError, match=f"killed by signal {int(signal.SIGTERM)}"):
        tu.execute_subprocess_async([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGTERM)"],
                                    quiet=True, echo=False)
    with pytest.raises(RuntimeError, match="did not finish within 1 seconds") as caught:
        tu.execute_subprocess_async([sys.executable, "-c", "import time; print('started', flush=True); time.sleep(60)"],
                                    timeout=1, quiet=True, echo=False)
    assert "started" in str(caught.value)


def test_run_command(tmp_path):
    assert testing.run_command([sys.executable, "-c", "print('hi')"], return_stdout=True) == "hi\n"
    assert testing.run_command([sys.executable, "-c", "pass"]) is None
    with pytest.raises(testing.SubprocessCallException, match="boom"):
        testing.run_command([sys.executable, "-c", "import sys; sys.exit('boom')"])


def test_a_bare_program_name_is_found_beside_the_running_python(tmp_path):
    beside = Path(sys.executable).parent / "hasten"
    if not beside.exists():
        pytest.skip("no hasten console script beside this interpreter")
    env = {**clean_env(), "PATH": str(tmp_path)}  # `hasten` is not on this PATH
    assert "launch" in testing.run_command(["hasten", "--help"], return_stdout=True, env=env)


LAUNCHED = """
import torch
from hasten import PartialState
from hasten.test_utils import are_the_same_tensors

state = PartialState()
assert state.num_processes == 2, state.num_processes
assert are_the_same_tensors(torch.arange(4.0))
assert not are_the_same_tensors(torch.tensor([float(state.process_index)]))
import os
os.write(1, f"rank {state.process_index} ok\\n".encode())  # one write: the two processes' lines never interleave
"""


def test_launch_command_runs_a_two_process_job(tmp_path):
    script = tmp_path / "check_same.py"
    script.write_text(LAUNCHED)
    command = tu.get_launch_command(num_processes=2, monitor_interval=0.1) + [script]
    with one_multiprocess_job_at_a_time():
        result = tu.execute_subprocess_async(command, env=clean_env(), timeout=240, quiet=True)
    assert sum("ok" in line for line in result.stdout) == 2


def test_are_the_same_tensors_in_one_process():
    assert tu.are_the_same_tensors(torch.ones(3))


def test_xdist_worker_id_and_port(monkeypatch):
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    assert tu.pytest_xdist_worker_id() == 0 and tu.get_torch_dist_unique_port() == 29500
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw3")
    assert tu.pytest_xdist_worker_id() == 3 and tu.get_torch_dist_unique_port() == 29503


# ---------------------------------------------------------------- small helpers


def test_paths_in_the_package():
    assert tu.path_in_accelerate_package("state.py") == tu.path_in_hasten_package("state.py")
    assert tu.path_in_hasten_package("state.py").is_file()
    assert tu.sanity_script_path().is_file()
    import hasten.test_utils.scripts  # noqa: F401 - still a package


def test_assert_exception():
    with tu.assert_exception(ValueError, "bad"):
        raise ValueError("a bad value")
    with tu.assert_exception(LookupError):
        raise KeyError("subclasses count")
    with pytest.raises(AssertionError, match="ran without issue"):
        with tu.assert_exception(ValueError):
            pass
    with pytest.raises(AssertionError, match="but got"):
        with tu.assert_exception(ValueError):
            raise TypeError("wrong kind")
    with pytest.raises(AssertionError, match="Expected message 'other'"):
        with tu.assert_exception(ValueError, "other"):
            raise ValueError("a bad value")


def test_capture_call_output():
    def talk(word, *, times):
        print(word * times)

    assert tu.capture_call_output(talk, "ab", times=2) == "abab\n"
    with pytest.raises(ZeroDivisionError):
        tu.capture_call_output(lambda: 1 / 0)


def test_test_case_classes():
    seen = {}

    class UsesState(testing.AccelerateTestCase):
        def test_state(self):
            AcceleratorState(mixed_precision="bf16")

    class UsesFolder(testing.TempDirTestCase):
        def test_a(self):
            (self.tmpdir / "left.txt").write_text("x")
            seen["dir"] = self.tmpdir

        def test_b(self):
            seen["b"] = list(self.tmpdir.iterdir())

    class UsesMocks(testing.MockingTestCase):
        def setUp(self):
            super().setUp()
            self.add_mocks(mock.patch.dict(os.environ, {"HASTEN_TEST_MOCKED": "1"}))

        def test_mocked(self):
            seen["mocked"] = os.environ.get("HASTEN_TEST_MOCKED")

    result = unittest.TestResult()
    for case in (UsesState, UsesFolder, UsesMocks):
        unittest.defaultTestLoader.loadTestsFromTestCase(case).run(result)
    assert result.wasSuccessful(), result.errors + result.failures
    assert not AcceleratorState._shared_state and not PartialState._shared_state
    assert seen["b"] == [] and not seen["dir"].exists() and seen["mocked"] == "1"
    assert "HASTEN_TEST_MOCKED" not in os.environ
    assert testing.HastenTestCase is testing.AccelerateTestCase


def test_the_cli_check_script_runs_under_the_launcher():
    """hasten.test_utils.scripts.test_cli: the script Accelerate's CLI tests launch (with and without config files)."""
    from helpers import run_launch

    from hasten.test_utils import path_in_hasten_package

    result = run_launch(path_in_hasten_package("test_utils", "scripts", "test_cli.py"), num_processes=2)
    assert "Successfully ran on 2 CPUs (2 process(es), MULTI_CPU)" in result.stdout, result.stdout
