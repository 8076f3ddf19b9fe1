"""``MegatronLMPlugin`` on the torch-native engine, run by tests/strategies/model_parallel/test_megatron.py as
``hasten launch -n 4 check_megatron.py <work>``.

The tiny GPT of check_model_parallel.py trained with the plugin alone choosing the layout, each run against the same
training on one process (whose optimizer step clips the gradient norm to 0.3, as Megatron's ``clip_grad`` does; the
Megatron runs never call ``clip_grad_norm_`` themselves):

1. tp_degree=2 x 2 data-parallel ranks sharded by the distributed optimizer (FSDP2), sequence parallelism from a
   Megatron-style plan, every block's activations recomputed;
2. tp_degree=2 x 2 replicated data-parallel ranks, the model's own ``_tp_plan``, recompute_method="block" with one
   layer (only the first block checkpointed);
3. pp_degree=2 x tp_degree=2, 4 micro-batches through the pipeline, the loss from ``custom_loss_function``.

Each checks ``distributed_type == MEGATRON_LM``, the layout, the loss of every step and the final weights. The first
run's checkpoint is saved for the test to load on one process; sequence parallelism without a sequence-parallel
plan is refused. Prints
``MEGATRON CHECKS PASSED``.
"""
from __future__ import annotations

import copy
import os
import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(__file__))
from check_model_parallel import VOCAB, TinyGPT, check, lm_loss, say, sequence_parallel_plan  # noqa: E402

from hasten import Accelerator, DistributedType, ParallelismConfig  # noqa: E402
from hasten.state import AcceleratorState  # noqa: E402
from hasten.utils import MegatronLMPlugin, TorchTensorParallelConfig, set_seed  # noqa: E402

BATCH, SEQUENCE, STEPS = 8, 8, 10
TOLERANCE = dict(rtol=1e-4, atol=2e-5)  # fp32: reductions in another order
CLIP = 0.3  # below the reference's gradient norms (about 0.5-0.65), so clipping changes every step


def token_loss(logits, target):
    return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))


def batches():
    generator = torch.Generator().manual_seed(11)
    return [torch.randint(0, VOCAB, (BATCH, SEQUENCE + 1), generator=generator) for _ in range(STEPS)]


def reference(model):
    model = copy.deepcopy(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses, norms = [], []
    for tokens in batches():
        loss = lm_loss(model(tokens[:, :-1]), tokens)
        loss.backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)))
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    check(min(norms) > 1.5 * CLIP, f"the reference's gradient norms {norms} must exceed the clipping, to test it")
    return losses, {k: v.detach().clone() for k, v in model.state_dict().items()}


def run(model, plugin, plan=None, pipeline=False):
    AcceleratorState._reset_state()
    config = ParallelismConfig(tp_handler=TorchTensorParallelConfig(tp_plan=plan)) if plan else None
    accelerator = Accelerator(cpu=True, megatron_lm_plugin=plugin, parallelism_config=config)
    check(accelerator.distributed_type == DistributedType.MEGATRON_LM,
          f"distributed_type {accelerator.distributed_type}")
    check(accelerator.state.megatron_lm_plugin is plugin, "the state keeps the plugin")
    model = copy.deepcopy(model)
    model, optimizer = accelerator.prepare(model, torch.optim.AdamW(model.parameters(), lr=1e-2))
    strategy = accelerator.strategy
    check(plugin.data_parallel_size == strategy.data_parallel_size, "the plugin's data_parallel_size")
    losses = []
    for tokens in batches():
        mine = tokens.chunk(strategy.data_parallel_size)[strategy.data_parallel_rank]
        if pipeline:
            loss = model(mine[:, :-1], target=mine[:, 1:])
        else:
            loss = lm_loss(model(mine[:, :-1]), mine)
        accelerator.backward(loss)
        optimizer.step()  # clips to gradient_clipping first
        optimizer.zero_grad()
        losses.append(accelerator.reduce(loss.detach(), reduction="mean").item())
    return accelerator, model, losses, accelerator.get_state_dict(model)


def compare(accelerator, name, ours, expected) -> None:
    losses, weights = ours
    expected_losses, expected_weights = expected
    check(all(abs(a - b) <= TOLERANCE["atol"] + TOLERANCE["rtol"] * abs(b) for a, b in zip(losses, expected_losses)),
          f"{name}: losses {losses} vs single-process {expected_losses}")
    if accelerator.is_main_process:
        check(weights.keys() == expected_weights.keys(), f"{name}: keys {sorted(weights)}")
        for key, value in expected_weights.items():
            check(torch.allclose(weights[key].float(), value.float(), **TOLERANCE),
                  f"{name}: {key} differs by {(weights[key].float() - value.float()).abs().max():.2e}")
    say(accelerator, f"ok: {name} matches single-process training ({len(losses)} steps)")


def is_checkpointed(module) -> bool:
    return "CheckpointWrapper" in type(module).__name__


def main(work: Path) -> None:
    set_seed(0)
    model = TinyGPT()
    expected = reference(model)

    plugin = MegatronLMPlugin(tp_degree=2, use_distributed_optimizer=True, sequence_parallelism=True,
                              recompute_activations=True, gradient_clipping=CLIP)
    accelerator, prepared, losses, weights = run(model, plugin, plan=sequence_parallel_plan())
    layout = accelerator.strategy.layout
    check((layout.tp, layout.dp_shard, layout.dp_replicate) == (2, 2, 1), f"layout {layout}")
    layers = accelerator.unwrap_model(prepared).layers
    check(all(is_checkpointed(layer) for layer in layers), f"every block recomputed: {layers}")
    compare(accelerator, "tp_degree=2 x distributed optimizer (dp_shard=2), sequence parallel, recompute",
            (losses, weights), expected)
    accelerator.save_state(work / "megatron_checkpoint")  # DCP shards: the test loads them on one process
    if accelerator.is_main_process:
        torch.save(weights, work / "megatron_weights.pt")
    accelerator.wait_for_everyone()

    AcceleratorState._reset_state()  # sequence parallelism asked, and the model's own plan has no such entries
    accelerator = Accelerator(cpu=True, megatron_lm_plugin=MegatronLMPlugin(tp_degree=2, sequence_parallelism=True))
    try:
        accelerator.prepare(copy.deepcopy(model))
    except ValueError as error:
        check("sequence_parallelism=True" in str(error) and "sequence_parallel" in str(error), str(error))
    else:
        raise AssertionError("sequence_parallelism=True with a plan without sequence-parallel entries was accepted")
    say(accelerator, "ok: sequence_parallelism without a sequence-parallel plan refused")

    plugin = MegatronLMPlugin(tp_degree=2, recompute_activations=True, recompute_method="block",
                              recompute_num_layers=1, gradient_clipping=CLIP)
    accelerator, prepared, losses, weights = run(model, plugin)
    layout = accelerator.strategy.layout
    check((layout.tp, layout.dp_shard, layout.dp_replicate) == (2, 1, 2), f"layout {layout}")
    layers = accelerator.unwrap_model(prepared).layers
    check([is_checkpointed(layer) for layer in layers] == [True, False], f"only the first block: {layers}")
    compare(accelerator, "tp_degree=2 x dp_replicate=2, recompute_method=block", (losses, weights), expected)

    plugin = MegatronLMPlugin(tp_degree=2, pp_degree=2, num_micro_batches=4, custom_loss_function=token_loss,
                              gradient_clipping=CLIP)
    accelerator, prepared, losses, weights = run(model, plugin, pipeline=True)
    layout = accelerator.strategy.layout
    check((layout.pp, layout.tp, layout.dp_size) == (2, 2, 1), f"layout {layout}")
    compare(accelerator, "pp_degree=2 x tp_degree=2, 4 micro-batches", (losses, weights), expected)
    say(accelerator, "MEGATRON CHECKS PASSED")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
