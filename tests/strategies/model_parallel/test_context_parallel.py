"""Context parallelism (parallel/context_parallel.py, ``Accelerator.maybe_context_parallel``): cp=2, dp_shard=2 x cp=2
and tp=2 x cp=2 on real processes against one process (tests/strategies/model_parallel/check_context_parallel.py), their
checkpoints loaded on one process, the in-place buffer slicing, and the settings refused before any work."""
import sys
from pathlib import Path

import pytest
import torch
from helpers import assert_checkpoint_loads_on_one_process, run_launch

from hasten import Accelerator, FullyShardedDataParallelPlugin, ParallelismConfig
from hasten.strategies.model_parallel.context_parallel import (
    restore_buffers,
    shard_buffers,
)

HERE = Path(__file__).resolve().parent  # the scripts these tests launch live beside them
sys.path.insert(0, str(HERE))
from check_context_parallel import TinyCausalLM  # noqa: E402


@pytest.mark.parametrize("mode, processes, name", [("cp", 2, "cp=2"), ("dp_shard", 4, "dp_shard=2 x cp=2"),
                                                   ("tp", 4, "tp=2 x cp=2")])
def test_context_parallel_training_matches_one_process_and_its_checkpoint_loads_on_one(tmp_path, mode, processes,
                                                                                        name):
    result = run_launch("check_context_parallel.py", tmp_path, mode, num_processes=processes, timeout=400)
    assert "CONTEXT PARALLEL CHECKS PASSED" in result.stdout, result.stdout
    assert f"ok: {name} matches single-process training" in result.stdout
    if mode == "cp":
        assert "ok: transformers Llama cp=2 with activation checkpointing matches single-process training" \
            in result.stdout
    assert_checkpoint_loads_on_one_process(TinyCausalLM(), tmp_path / "cp_checkpoint", tmp_path / "cp_weights.pt")


def test_buffers_are_sliced_in_place_and_restored():
    ids, labels = torch.arange(12).view(2, 6), torch.arange(12).view(2, 6) + 100
    original_ids = ids.clone()
    saved = shard_buffers([ids, labels], [1, 1], cp_size=3, cp_rank=1, no_restore=[labels])
    assert ids.tolist() == [[2, 3], [8, 9]] and labels.tolist() == [[102, 103], [108, 109]]
    restore_buffers(saved)
    assert torch.equal(ids, original_ids) and labels.shape == (2, 2)  # labels were not to be restored


def test_views_are_refused_before_anything_is_sliced():
    from hasten.strategies.model_parallel.context_parallel import _check_buffers

    tokens = torch.arange(20).view(2, 10)
    with pytest.raises(ValueError, match="buffer 0 is a view of another tensor"):
        _check_buffers([tokens[:, :-2]], [1], [], 2)
    with pytest.raises(ValueError, match="requires grad"):
        _check_buffers([torch.ones(2, 4, requires_grad=True)], [1], [], 2)
    assert torch.equal(tokens, torch.arange(20).view(2, 10))
    _check_buffers([tokens[:, :-2].clone()], [1], [], 2)  # a copy is fine


def test_without_context_parallelism_the_block_changes_nothing():
    accelerator = Accelerator(cpu=True)
    ids = torch.arange(8).view(1, 8)
    with accelerator.maybe_context_parallel(buffers=[ids], buffer_seq_dims=[1]):
        assert ids.shape == (1, 8)


def test_layouts_context_parallelism_cannot_take_are_refused():
    from types import SimpleNamespace

    from hasten.parallel import ParallelDims
    from hasten.strategies import select_strategy

    four = SimpleNamespace(num_processes=4)  # refused from the layout and the plugin, before the state is used
    with pytest.raises(ValueError, match="FSDP2"):
        select_strategy(four, None, ParallelDims(cp=2, dp_shard=2, world_size=4),
                        fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=1))
    with pytest.raises(NotImplementedError, match="context parallelism with pipeline parallelism"):
        select_strategy(four, None, ParallelDims(cp=2, pp=2, world_size=4))
    with pytest.raises(ValueError, match="cp"):
        Accelerator(cpu=True, parallelism_config=ParallelismConfig(cp_size=2))  # one process
