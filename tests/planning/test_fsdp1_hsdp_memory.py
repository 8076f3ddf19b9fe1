"""FSDP1 and HSDP traced as they run, and the forward every strategy wraps under mixed precision: each trace on fake
tensors equals the same steps on real tensors (over the same fake process group: the collectives move nothing, the
memory is the run's), and the plan of a bf16 run equals what a real ``Accelerator`` holds."""
import dataclasses
import sys
from pathlib import Path

import pytest
import torch

from hasten.planning import MemoryBreakdown, fsdp1_step_memory, fsdp2_step_memory, training_step_memory
from hasten.planning.launch_config import FSDP1_OPTIONS, launch_config
from hasten.planning.layouts import Layout
from hasten.planning.model_source import transformers_source
from hasten.planning.sharded_memory import fake_process_group
from hasten.planning.step_memory import highest
from hasten.planning.traces import STEPS, StepShape, Tracer

pytest.importorskip("transformers")
sys.path.insert(0, str(Path(__file__).resolve().parent))
from check_fsdp2_memory import CONFIG, batch, build  # noqa: E402  a two-block Llama and its batch

SOURCE = transformers_source(CONFIG)


@pytest.mark.parametrize("precision, checkpointing", [("no", False), ("bf16", True)])
def test_fsdp1_traced_on_fake_tensors_is_the_run_on_real_ones(precision, checkpointing):
    tracer = Tracer(SOURCE, StepShape(2, 32, precision, "adamw", checkpointing))
    plugin = tracer.fsdp_plugin(checkpointing, version=1)
    arguments = dict(world_size=4, fsdp_plugin=plugin, mixed_precision=precision, steps=STEPS)
    traced = fsdp1_step_memory(build, batch, **arguments)
    with fake_process_group(4):
        torch.manual_seed(0)
        measured = fsdp1_step_memory(build, batch, fake=False, **arguments)
    assert traced == measured
    peak = highest(traced)
    shards = sum(p.numel() for p in build().parameters()) * 4 / 4  # float32 flat parameters over 4 ranks
    assert peak.parameters == pytest.approx(shards, rel=0.02) and peak.gathered_parameters > 0
    assert peak.peak == sum(getattr(peak, field.name) for field in dataclasses.fields(MemoryBreakdown))
    # the trace runs the options the written config sets (FSDP1 gathers the next unit ahead in backward)
    assert str(plugin.backward_prefetch).endswith(FSDP1_OPTIONS["backward_prefetch"])
    assert plugin.use_orig_params is True and plugin.fsdp_version == 1
    section = launch_config(Layout("fsdp1", 4), mixed_precision=precision, gradient_accumulation_steps=1,
                            activation_checkpointing=checkpointing, blocks=tracer.block_names())["fsdp_config"]
    assert {name: section[f"fsdp_{name}"] for name in FSDP1_OPTIONS} == FSDP1_OPTIONS
    with pytest.raises(ValueError, match="process group of 4"):
        fsdp1_step_memory(build, batch, fake=False, **arguments)  # measuring needs the job's group


def test_hsdp_traced_as_shards_replicated_is_the_run_on_real_ones():
    arguments = dict(world_size=2, replicas=2, mixed_precision="bf16", steps=STEPS)
    traced = fsdp2_step_memory(build, batch, **arguments)
    with fake_process_group(4):
        torch.manual_seed(0)
        measured = fsdp2_step_memory(build, batch, fake=False, **arguments)
    assert traced == measured
    sharded_only = fsdp2_step_memory(build, batch, world_size=2, mixed_precision="bf16", steps=STEPS)
    assert traced.parameters == sharded_only.parameters  # the same shards: replicas add none
    with pytest.raises(ValueError, match="replicas"):
        fsdp2_step_memory(build, batch, world_size=2, replicas=0)


def test_a_bf16_plan_counts_the_float32_outputs_prepare_returns():
    from hasten import Accelerator

    tracer = Tracer(SOURCE, StepShape(2, 32, "bf16", "adamw", False))
    accelerator = Accelerator(cpu=True, mixed_precision="bf16")
    measured = training_step_memory(lambda: accelerator.prepare_model(build()), batch, mixed_precision="bf16",
                                    optimizer_kwargs={"foreach": True}, steps=STEPS, fake=False)
    assert tracer.single().peak == measured.peak
    plain = training_step_memory(build, batch, mixed_precision="bf16", optimizer_kwargs={"foreach": True},
                                 steps=STEPS)
    assert plain.peak != measured.peak  # without prepare()'s float32 outputs the trace would miss the run
