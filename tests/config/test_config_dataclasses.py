"""Kwargs handlers and configuration dataclasses: defaults, to_kwargs, validation, environment precedence."""
import dataclasses
import datetime

import pytest
import torch

from hasten.config.accumulation import GradientAccumulationPlugin
from hasten.config.dynamo import TorchDynamoPlugin
from hasten.config.enums import DynamoBackend
from hasten.config.kwargs import (AutocastKwargs, DDPCommunicationHookType, DistributedDataParallelKwargs,
                                  GradScalerKwargs, InitProcessGroupKwargs, ProfileKwargs)
from hasten.config.project import ProjectConfiguration
from hasten.config.resolution import ConfigConflictError


def test_to_kwargs_returns_only_changed_options():
    assert DistributedDataParallelKwargs().to_kwargs() == {}
    assert DistributedDataParallelKwargs(find_unused_parameters=True, comm_hook="fp16").to_kwargs() == {
        "find_unused_parameters": True}
    assert GradScalerKwargs(init_scale=1024.0, growth_interval=10).to_kwargs() == {"init_scale": 1024.0,
                                                                                    "growth_interval": 10}
    assert AutocastKwargs(cache_enabled=False).to_kwargs() == {"cache_enabled": False}


def test_ddp_kwargs_are_accepted_by_torch_ddp():
    ddp_parameters = torch.nn.parallel.DistributedDataParallel.__init__.__code__.co_varnames
    handler = DistributedDataParallelKwargs()
    for f in dataclasses.fields(handler):
        if not f.name.startswith("comm_"):
            assert f.name in ddp_parameters, f.name


def test_grad_scaler_kwargs_match_torch():
    torch.amp.GradScaler("cpu", **GradScalerKwargs(init_scale=8.0, enabled=False).to_kwargs())


def test_ddp_comm_hook_validation():
    assert DistributedDataParallelKwargs(comm_hook="BF16").comm_hook == DDPCommunicationHookType.BF16
    with pytest.raises(ValueError, match="comm_hook"):
        DistributedDataParallelKwargs(comm_hook="int4")
    with pytest.raises(ValueError, match="PowerSGD"):
        DistributedDataParallelKwargs(comm_wrapper="fp16")
    DistributedDataParallelKwargs(comm_hook="power_sgd", comm_wrapper="bf16")


def test_init_process_group_timeout():
    assert InitProcessGroupKwargs(timeout=30).timeout == datetime.timedelta(seconds=30)
    assert InitProcessGroupKwargs().backend is None
    with pytest.raises(ValueError, match="timeout"):
        InitProcessGroupKwargs(timeout=-1)


def test_profile_kwargs_builds_a_profiler():
    profiler = ProfileKwargs(activities=["cpu"], record_shapes=True).build()
    with profiler:
        torch.ones(4).sum()
    assert any("aten::sum" in event.name for event in profiler.events())
    with pytest.raises(ValueError, match="activities"):
        ProfileKwargs(activities=["gpu"]).build()


def test_gradient_accumulation_plugin():
    plugin = GradientAccumulationPlugin(num_steps=4)
    # the options that differ from their defaults, as every kwargs handler of the reference answers
    assert plugin.to_kwargs() == {"num_steps": 4}
    assert GradientAccumulationPlugin(num_steps=2, sync_each_batch=True).to_kwargs() == {"num_steps": 2,
                                                                                        "sync_each_batch": True}
    for bad in (0, -2, 1.5, True):
        with pytest.raises(ValueError, match="num_steps"):
            GradientAccumulationPlugin(num_steps=bad)


def test_dynamo_plugin_defaults_environment_and_conflicts(monkeypatch):
    plugin = TorchDynamoPlugin()
    assert plugin.backend == DynamoBackend.NO and not plugin.enabled and plugin.mode == "default"
    monkeypatch.setenv("HASTEN_DYNAMO_BACKEND", "inductor")
    monkeypatch.setenv("HASTEN_DYNAMO_USE_REGIONAL_COMPILATION", "1")
    plugin = TorchDynamoPlugin()
    assert plugin.backend == DynamoBackend.INDUCTOR and plugin.enabled and plugin.use_regional_compilation
    assert plugin.compile_kwargs()["backend"] == "inductor"
    assert plugin.to_kwargs() == {"backend": "inductor", "use_regional_compilation": True}  # what differs from default
    with pytest.raises(ConfigConflictError, match="HASTEN_DYNAMO_BACKEND"):
        TorchDynamoPlugin(backend="eager")
    monkeypatch.delenv("HASTEN_DYNAMO_BACKEND")
    with pytest.raises(ValueError, match="mode"):
        TorchDynamoPlugin(mode="fastest")
    with_options = TorchDynamoPlugin(backend="eager", options={"x": 1}).compile_kwargs()
    assert "mode" not in with_options and with_options["options"] == {"x": 1}
    compiled = torch.compile(torch.nn.Linear(2, 2), **TorchDynamoPlugin(backend="eager", disable=True).compile_kwargs())
    compiled(torch.ones(1, 2))


def test_project_configuration():
    config = ProjectConfiguration(project_dir="runs/a")
    assert config.logging_dir == "runs/a"
    assert ProjectConfiguration(project_dir="a", logging_dir="b").logging_dir == "b"
    empty = ProjectConfiguration()
    empty.set_directories("runs/b")
    assert (empty.project_dir, empty.logging_dir) == ("runs/b", "runs/b")
    with pytest.raises(ValueError, match="total_limit"):
        ProjectConfiguration(total_limit=0)
    with pytest.raises(ValueError, match="iteration"):
        ProjectConfiguration(iteration=-1)
