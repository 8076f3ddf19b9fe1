"""Tensor parallelism (strategies/model_parallel.py, parallel/tp_plan.py): the multi-process checks of
tests/strategies/model_parallel/check_model_parallel.py (TP + sequence parallelism, a model's own plan, a transformers Llama, bad
plans), a TP=2 checkpoint loaded on one process, and the layouts refused before any process group. FSDP x TP and
DDP x TP against single-process PyTorch, and their checkpoints across layouts, are the conformance suite's."""
import sys
from pathlib import Path

import pytest
import torch
from helpers import assert_checkpoint_loads_on_one_process, run_launch
from torch import nn

from hasten import Accelerator, FullyShardedDataParallelPlugin, ParallelismConfig
from hasten.strategies.model_parallel.tp_plan import STYLE_NAMES, plan_of, resolve_plan
from hasten.utils import (
    TorchPipelineParallelConfig,
    TorchTensorParallelConfig,
    TorchTensorParallelPlugin,
)

HERE = Path(__file__).resolve().parent  # the scripts these tests launch live beside them
sys.path.insert(0, str(HERE))
from check_model_parallel import TinyGPT  # noqa: E402


def test_tensor_and_sequence_parallelism_and_a_llama_match_one_process_and_the_checkpoint_loads_with_tp_1(tmp_path):
    result = run_launch("check_model_parallel.py", tmp_path, num_processes=2, timeout=400)
    assert "MODEL PARALLEL CHECKS PASSED" in result.stdout, result.stdout
    assert "ok: TP=2 with a loss-parallel head matches single-process training" in result.stdout
    # the TP=2 checkpoint (DCP shards) on one process, without tensor parallelism
    assert_checkpoint_loads_on_one_process(TinyGPT(), tmp_path / "tp_checkpoint", tmp_path / "tp_weights.pt")


def test_pipeline_parallelism_trains_like_one_process_alone_with_tp_and_with_fsdp_and_its_checkpoint_loads(tmp_path):
    result = run_launch("check_pipeline_training.py", tmp_path, num_processes=2, timeout=400)
    assert "PIPELINE TRAINING PASSED" in result.stdout, result.stdout
    for schedule in ("gpipe", "1f1b", "interleaved_1f1b"):
        assert f"ok: pp=2 {schedule} matches single-process training" in result.stdout
    result = run_launch("check_pipeline_training.py", tmp_path / "tp", "tp", num_processes=4, timeout=400)
    assert "ok: pp=2 x tp=2 1f1b matches single-process training" in result.stdout, result.stdout
    result = run_launch("check_pipeline_training.py", tmp_path / "fsdp", "fsdp", num_processes=4, timeout=400)
    assert "ok: pp=2 x dp_shard=2 1f1b matches single-process training" in result.stdout, result.stdout
    result = run_launch("check_pipeline_training.py", tmp_path / "3d", "3d", num_processes=8, timeout=400)
    assert "ok: pp=2 x dp_shard=2 x tp=2 1f1b matches single-process training" in result.stdout, result.stdout
    # each rank wrote its stages (DCP): the whole model loads on one process
    assert_checkpoint_loads_on_one_process(TinyGPT(), tmp_path / "pp_checkpoint", tmp_path / "pp_weights.pt")


def test_pipeline_settings_are_checked_when_made():
    with pytest.raises(ValueError, match="schedule"):
        TorchPipelineParallelConfig(schedule="zigzag")
    with pytest.raises(ValueError, match="interleaved_1f1b"):
        TorchPipelineParallelConfig(virtual_stages=3)
    with pytest.raises(TypeError, match="loss_fn must be callable"):
        TorchPipelineParallelConfig(loss_fn="mse")
    assert TorchPipelineParallelConfig(schedule="interleaved_1f1b").virtual_stages == 2
    config = ParallelismConfig(pp_size=2, tp_size=2)
    assert config.total_size == 4 and isinstance(config.pp_handler, TorchPipelineParallelConfig)


def test_plans_expand_layer_patterns_and_accept_transformers_names():
    model = TinyGPT()
    resolved = resolve_plan(model, {"layers.*.fc1": "colwise", "layers.*.fc2": "rowwise", "embed": "embedding_rowwise",
                                    "head": "colwise_gather_output", "norm": "replicate"}, tp_size=2)
    assert sorted(resolved) == ["embed", "head", "layers.0.fc1", "layers.0.fc2", "layers.1.fc1", "layers.1.fc2"]
    assert "colwise" in STYLE_NAMES and plan_of(model) == model._tp_plan
    assert plan_of(model, {"head": "colwise"}) == {"head": "colwise"}  # a given plan wins over the model's


def test_a_plan_naming_nothing_lists_the_models_modules():
    with pytest.raises(ValueError, match=r"'mlp\.\*\.up'.*matches no module.*layers\.0\.fc1"):
        resolve_plan(TinyGPT(), {"mlp.*.up": "colwise"}, tp_size=2)


def test_a_split_the_tp_size_does_not_divide_is_refused():
    with pytest.raises(ValueError, match=r"'0' \(Linear\) has 5 output features, which tp_size=2 does not divide"):
        resolve_plan(nn.Sequential(nn.Linear(4, 5)), {"0": "colwise"}, tp_size=2)
    with pytest.raises(ValueError, match=r"style for '0' is 'diagonal'"):
        resolve_plan(nn.Sequential(nn.Linear(4, 4)), {"0": "diagonal"}, tp_size=2)


def test_the_plan_option_must_be_a_dict():
    with pytest.raises(TypeError, match="tp_plan must be a dict"):
        TorchTensorParallelConfig(tp_plan=["colwise"])


def test_layouts_that_cannot_work_are_refused_before_any_process_group():
    with pytest.raises(ValueError, match=r"TorchTensorParallelPlugin\(tp_size=3\) does not divide the 1 processes"):
        Accelerator(cpu=True, torch_tp_plugin=TorchTensorParallelPlugin(tp_size=3))
    assert not torch.distributed.is_initialized()
    with pytest.raises(ValueError, match="tp_size=2"):
        Accelerator(cpu=True, parallelism_config=ParallelismConfig(tp_size=2))  # 2 ranks asked, 1 process


def test_a_tp_plugin_of_size_1_trains_as_before():
    accelerator = Accelerator(cpu=True, torch_tp_plugin=TorchTensorParallelPlugin(tp_size=1))
    assert type(accelerator.strategy).__name__ == "SingleDeviceStrategy"


def test_tensor_parallelism_with_fsdp1_is_refused_naming_fsdp2(monkeypatch):
    from hasten.parallel import ParallelDims
    from hasten.strategies import select_strategy

    state = Accelerator(cpu=True).state
    dims = ParallelDims(dp_shard=2, tp=2, world_size=4, rank=0)
    with pytest.raises(ValueError, match="fsdp_version=2"):
        select_strategy(state, None, dims, fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=1))
