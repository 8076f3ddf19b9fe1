"""``fsdp2_prepare_model`` given any object that looks like an Accelerator, the fp32 master weights FSDP2 needs for
mixed-dtype models under mixed precision, and the plugin's precision filled from the Accelerator's.

``fully_shard`` is replaced by a recorder here (what is sharded, in which order, with which options); the real
sharding of the same code path is covered by the launched FSDP tests (test_fsdp.py)."""
from types import SimpleNamespace

import pytest
import torch
from torch.distributed.fsdp import MixedPrecision, MixedPrecisionPolicy, OffloadPolicy

from hasten import Accelerator, FullyShardedDataParallelPlugin
from hasten.state import AcceleratorState
from hasten.strategies.fsdp.sharding import upcast_mixed_master_weights
from hasten.utils.fsdp_utils import fsdp2_prepare_model


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)
        self.norm = torch.nn.LayerNorm(4)


class Net(torch.nn.Module):
    _no_split_modules = ["Block"]

    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList([Block(), Block()])
        self.head = torch.nn.Linear(4, 2)


@pytest.fixture
def sharded(monkeypatch):
    calls = []
    monkeypatch.setattr("torch.distributed.fsdp.fully_shard", lambda module, **options: calls.append((module, options)))
    return calls


def lookalike(plugin, mixed_precision="no", mesh=None):
    """Only what a duck-typed Accelerator offers: no hasten strategy."""
    return SimpleNamespace(state=SimpleNamespace(fsdp_plugin=plugin), mixed_precision=mixed_precision,
                           torch_device_mesh=mesh, device=torch.device("cpu"), is_main_process=True)


def test_a_lookalike_accelerator_shards_the_plugins_units_then_the_root(sharded, monkeypatch):
    monkeypatch.setenv("FSDP_AUTO_WRAP_POLICY", "TRANSFORMER_BASED_WRAP")
    plugin = FullyShardedDataParallelPlugin(fsdp_version=2, reshard_after_forward=False)
    model = Net()
    assert fsdp2_prepare_model(lookalike(plugin), model) is model
    modules = [module for module, _ in sharded]
    assert modules == [model.blocks[0], model.blocks[1], model]  # every Block (as prepare makes them), then the root
    options = sharded[-1][1]
    assert options["mesh"] is None and options["reshard_after_forward"] is False
    assert options["mp_policy"] == MixedPrecisionPolicy() and isinstance(options["offload_policy"], OffloadPolicy)


def test_mixed_dtypes_become_fp32_master_weights_under_mixed_precision(sharded):
    model = Net()
    model.blocks[0].linear.to(torch.bfloat16)
    plugin = FullyShardedDataParallelPlugin(fsdp_version=2, mixed_precision_policy="bf16")
    fsdp2_prepare_model(lookalike(plugin, "bf16"), model)
    assert {p.dtype for p in model.parameters()} == {torch.float32}


def test_dtypes_are_kept_without_mixed_precision_and_for_4bit_models():
    model = Net()
    model.blocks[0].linear.to(torch.bfloat16)
    assert not upcast_mixed_master_weights(model, "no")
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16, torch.float32}
    frozen = Net()
    frozen.blocks[0].linear.to(torch.bfloat16).requires_grad_(False)  # only trainable dtypes must agree
    assert not upcast_mixed_master_weights(frozen, "bf16")
    quantized = Net()
    quantized.blocks[0].linear.to(torch.bfloat16)
    quantized.blocks[0].linear.weight.__class__ = type("Params4bit", (torch.nn.Parameter,), {})
    assert not upcast_mixed_master_weights(quantized, "bf16")
    assert quantized.blocks[0].linear.weight.dtype == torch.bfloat16


def test_a_real_accelerator_without_fsdp_is_refused_naming_its_strategy():
    with pytest.raises(ValueError, match="prepared with FSDP"):
        fsdp2_prepare_model(Accelerator(cpu=True), Net())


def _reset():
    """The state, and the process group of one FSDP starts on one process (so later tests start clean)."""
    AcceleratorState._reset_state(True)
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


@pytest.mark.parametrize("version, policy", [
    (2, MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16, output_dtype=torch.bfloat16)),
    (1, MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16, buffer_dtype=torch.bfloat16)),
])
def test_the_accelerators_mixed_precision_fills_an_unset_fsdp_policy(version, policy):
    try:
        plugin = FullyShardedDataParallelPlugin(fsdp_version=version)
        accelerator = Accelerator(cpu=True, mixed_precision="bf16", fsdp_plugin=plugin)
        assert accelerator.state.fsdp_plugin.mixed_precision_policy == policy
    finally:
        _reset()
    try:
        given = FullyShardedDataParallelPlugin(fsdp_version=2, mixed_precision_policy={
            "param_dtype": torch.float32, "reduce_dtype": torch.float32, "output_dtype": torch.float32})
        Accelerator(cpu=True, mixed_precision="bf16", fsdp_plugin=given)
        assert given.mixed_precision_policy.param_dtype == torch.float32  # a policy the user set is kept
    finally:
        _reset()


def test_a_second_accelerator_without_plugins_joins_the_runs_fsdp():
    try:
        plugin = FullyShardedDataParallelPlugin(fsdp_version=2)
        Accelerator(cpu=True, fsdp_plugin=plugin)
        second = Accelerator(cpu=True)
        assert type(second.strategy).__name__ == "FSDP2Strategy" and second.state.fsdp_plugin is plugin
        model = second.prepare(torch.nn.Linear(2, 2))
        assert type(model).__name__.startswith("FSDP")  # sharded (a world of one), not a plain module
    finally:
        _reset()
