"""Process state in one process: facts, splitting, decorators, resets, bad input."""
import collections

import pytest
import torch

from hasten.config.enums import DistributedType
from hasten.config.resolution import ConfigConflictError
from hasten.state import AcceleratorState, GradientState, PartialState, split_for_process


def test_plain_process_is_not_distributed():
    state = PartialState()
    assert state.distributed_type == DistributedType.NO
    assert (state.num_processes, state.process_index, state.local_process_index) == (1, 0, 0)
    assert state.is_main_process and state.is_local_main_process and state.is_last_process
    assert not state.use_distributed
    assert state.backend is None
    assert state.device == torch.device("cpu")
    state.wait_for_everyone()  # no process group: returns at once
    with state.main_process_first(), state.local_main_process_first():
        pass


def test_state_is_shared_and_resettable():
    first = PartialState()
    first.custom_marker = 7
    assert PartialState().custom_marker == 7
    PartialState._reset_state()
    assert not hasattr(PartialState(), "custom_marker")


def test_cpu_flag_and_environment(monkeypatch):
    monkeypatch.setenv("HASTEN_USE_CPU", "true")
    assert PartialState().device.type == "cpu"
    PartialState._reset_state()
    monkeypatch.setenv("HASTEN_USE_CPU", "maybe")
    with pytest.raises(ValueError, match="HASTEN_USE_CPU"):
        PartialState()


def test_a_deepspeed_launch_says_so_before_any_accelerator(monkeypatch):
    """transformers' TrainingArguments(deepspeed=...) sets ACCELERATE_USE_DEEPSPEED and reads the state's type:
    a launched process (LOCAL_RANK set) reports DEEPSPEED; a plain run with the switch, or a launch without it,
    does not. (Two processes: tests/strategies/deepspeed/check_deepspeed.py.)"""
    # an earlier single-process DeepSpeed run in this pytest process leaves its local launch variables set (its
    # process group stays up with them): start from a process that was not launched
    for variable in ("LOCAL_RANK", "RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(variable, raising=False)
    PartialState._reset_state()
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    assert PartialState().distributed_type == DistributedType.NO  # not launched: nothing to say yet
    PartialState._reset_state()
    monkeypatch.setenv("LOCAL_RANK", "0")
    state = PartialState()
    assert state.distributed_type == DistributedType.DEEPSPEED and state.num_processes == 1
    assert not state.use_distributed  # one process: no process group was made for it
    PartialState._reset_state()
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "false")
    assert PartialState().distributed_type == DistributedType.NO
    PartialState._reset_state()


def test_world_size_without_launcher_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    with pytest.raises(ValueError, match="hasten launch"):
        PartialState()


def _shares(inputs, n, pad=False):
    return [split_for_process(inputs, n, i, pad) for i in range(n)]


@pytest.mark.parametrize("length", [0, 1, 2, 5, 7, 8])
@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_split_covers_every_element_once_in_order(length, n):
    data = list(range(length))
    shares = _shares(data, n)
    assert [x for share in shares for x in share] == data
    sizes = [len(s) for s in shares]
    assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)


@pytest.mark.parametrize("length,n", [(5, 2), (7, 3), (1, 3), (8, 4)])
def test_split_with_padding_gives_equal_lengths_padded_with_last(length, n):
    data = list(range(length))
    shares = _shares(data, n, pad=True)
    assert len({len(s) for s in shares}) == 1
    unpadded = _shares(data, n)
    for padded, plain in zip(shares, unpadded):
        assert padded[: len(plain)] == plain
        assert all(x == data[-1] for x in padded[len(plain):])


def test_split_types_tensor_tuple_dict():
    t = torch.arange(10).reshape(5, 2)
    shares = _shares(t, 2, pad=True)
    assert torch.equal(torch.cat(shares)[:5], t) and torch.equal(shares[1][-1], t[-1])
    assert _shares((1, 2, 3), 2) == [(1, 2), (3,)]
    assert _shares((1, 2, 3), 2, pad=True)[1] == (3, 3)
    d = collections.OrderedDict(a=[1, 2, 3], b=torch.arange(3))
    second = _shares(d, 2, pad=True)[1]
    assert isinstance(second, collections.OrderedDict)
    assert second["a"] == [3, 3] and torch.equal(second["b"], torch.tensor([2, 2]))


def test_split_a_datasets_dataset_gives_datasets_of_rows():
    datasets = pytest.importorskip("datasets")
    rows = datasets.Dataset.from_list([{"k": v} for v in range(5)])
    shares = _shares(rows, 2)
    assert all(isinstance(share, datasets.Dataset) for share in shares)
    assert [share["k"] for share in shares] == [[0, 1, 2], [3, 4]]
    assert [share["k"] for share in _shares(rows, 3, pad=True)] == [[0, 1], [2, 3], [4, 4]]


def test_split_bad_input():
    with pytest.raises(ValueError, match="same length"):
        split_for_process({"a": [1, 2], "b": [1]}, 2, 0)
    with pytest.raises(TypeError, match="list, tuple, dict or tensor"):
        split_for_process(42, 2, 0)


def test_split_between_processes_context_single_process():
    with PartialState().split_between_processes(["a", "b"]) as share:
        assert share == ["a", "b"]


def test_decorators_single_process():
    state = PartialState()
    calls = []
    state.on_main_process(lambda: calls.append("main"))()
    state.on_local_main_process(lambda: calls.append("local"))()
    state.on_last_process(lambda: calls.append("last"))()
    state.on_process(lambda: calls.append("p0"), process_index=0)()
    assert state.on_process(lambda: calls.append("p1"), process_index=1)() is None
    state.on_local_process(local_process_index=0)(lambda: calls.append("l0"))()

    @state.on_main_process
    def returns_value():
        return 3

    assert returns_value() == 3
    assert calls == ["main", "local", "last", "p0", "l0"]
    with pytest.raises(ValueError, match="process_index"):
        state.on_process(lambda: None, process_index=-1)


def test_print_only_on_local_main(capsys):
    PartialState().print("hello", 1)
    assert capsys.readouterr().out == "hello 1\n"


def test_missing_attribute_message():
    state = PartialState.__new__(PartialState)
    state.__dict__ = {}
    with pytest.raises(AttributeError, match="create `PartialState"):
        state.device


def test_accelerator_state_mixed_precision_precedence(monkeypatch):
    assert AcceleratorState().mixed_precision == "no"
    AcceleratorState._reset_state(True)
    monkeypatch.setenv("HASTEN_MIXED_PRECISION", "bf16")
    state = AcceleratorState()
    assert state.mixed_precision == "bf16"
    assert state.num_processes == 1 and state.device.type == "cpu"  # process facts answered by PartialState
    AcceleratorState._reset_state(True)
    assert AcceleratorState(mixed_precision="BF16").mixed_precision == "bf16"  # agrees with the launcher
    AcceleratorState._reset_state(True)
    with pytest.raises(ConfigConflictError, match="HASTEN_MIXED_PRECISION"):
        AcceleratorState(mixed_precision="fp16")


def test_accelerator_state_bad_precision_and_frozen():
    with pytest.raises(ValueError, match="mixed_precision"):
        AcceleratorState(mixed_precision="fp12")
    AcceleratorState._reset_state(True)
    AcceleratorState(mixed_precision="bf16")
    with pytest.raises(ValueError, match="cannot be changed"):
        AcceleratorState(mixed_precision="no")


def test_gradient_state_defaults_and_loader_tracking():
    gs = GradientState()
    assert gs.sync_gradients and gs.num_steps == 1 and not gs.in_dataloader
    assert gs.end_of_dataloader is False and gs.remainder == -1

    class Loader:
        end_of_dataloader = True
        remainder = 3

    loader = Loader()
    gs._add_dataloader(loader)
    assert GradientState().in_dataloader and gs.end_of_dataloader and gs.remainder == 3
    gs._remove_dataloader(loader)
    assert not gs.in_dataloader
    gs._set_sync_gradients(False)
    assert GradientState().sync_gradients is False
    GradientState._reset_state()
    assert GradientState().sync_gradients is True


def test_get_logger_needs_state_and_logs_on_main(caplog):
    import logging

    from hasten.logging import get_logger

    logger = get_logger("hasten-test", log_level="INFO")
    with pytest.raises(RuntimeError, match="before the process state exists"):
        logger.info("too early")
    PartialState()
    with caplog.at_level(logging.INFO, logger="hasten-test"):
        logger.info("visible")
        logger.info("also visible", main_process_only=False)
        logger.debug("hidden")
        logger.warning_once("once")
        logger.warning_once("once")
    assert [r.getMessage() for r in caplog.records] == ["visible", "also visible", "once"]


def test_require_extra_names_the_extra_for_submodules():
    from hasten.utils.imports import require_extra

    with pytest.raises(ImportError, match=r"hasten\[megatron\]"):
        require_extra("megatron.core.tensor_parallel")


def test_compatibility_import_paths():
    """Every Accelerate-style import path resolves, and every name of the lazy tables exists."""
    import importlib

    import hasten
    import hasten.utils

    for package in (hasten, hasten.utils):
        for name in package.__all__:
            assert getattr(package, name) is not None, name
    from hasten.utils.modeling import compute_module_sizes, infer_auto_device_map  # noqa: F401
    from hasten.utils.offload import OffloadedWeightsLoader  # noqa: F401

    for module in ("hasten.data_loader", "hasten.big_modeling", "hasten.hooks", "hasten.state", "hasten.logging",
                   "hasten.optimizer", "hasten.scheduler", "hasten.launchers", "hasten.local_sgd"):
        importlib.import_module(module)


def test_an_unknown_attribute_is_said_of_the_accelerator_state_and_a_reset_says_so():
    from hasten import Accelerator

    accelerator = Accelerator(cpu=True)
    with pytest.raises(AttributeError, match="'AcceleratorState' object has no attribute 'someotherthing'") as error:
        accelerator.state.someotherthing
    assert "_reset_state()" not in str(error.value)
    accelerator.state._reset_state()
    with pytest.raises(AttributeError, match=r"`AcceleratorState` object has no attribute.*This happens if "
                                             r"`AcceleratorState._reset_state\(\)`"):
        accelerator.num_processes


def test_an_accelerator_after_a_partial_state_reset_alone_starts_afresh():
    """A test suite resets PartialState only (trackers' tests do): the next Accelerator builds both states again."""
    from hasten import Accelerator

    Accelerator(cpu=True)
    PartialState._reset_state()
    assert PartialState._shared_state == {}
    accelerator = Accelerator(cpu=True)
    assert accelerator.num_processes == 1 and PartialState._shared_state != {}
