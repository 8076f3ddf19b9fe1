"""Pipeline parallelism through the Accelerator, run by tests/strategies/model_parallel/test_model_parallel.py as
``hasten launch -n 2 check_pipeline_training.py <work>`` (pp=2), ``-n 4 ... <work> tp`` (pp=2 x tp=2) and
``-n 4 ... <work> fsdp`` (pp=2 x FSDP2 over dp_shard=2: each data-parallel rank trains on half of every batch) and
``-n 8 ... <work> 3d`` (pp=2 x dp_shard=2 x tp=2).

With 2 processes: the tiny GPT of check_model_parallel.py trained 12 steps with GPipe, 1F1B and interleaved 1F1B
(4 micro-batches) matches the same training on one process (losses and final weights); evaluation through the
pipeline gives the single-process outputs on every rank; the 1F1B run is saved (each rank its stages, DCP) for the
test to load on one process; bad settings are refused with the reason. With ``tp``: the same with pp=2 x tp=2.

Prints ``PIPELINE TRAINING PASSED``.
"""
from __future__ import annotations

import copy
import os
import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(__file__))
from check_model_parallel import VOCAB, TinyGPT, check, expect_error, lm_loss, say  # noqa: E402

from hasten import Accelerator, ParallelismConfig  # noqa: E402
from hasten.state import AcceleratorState  # noqa: E402
from hasten.utils import TorchPipelineParallelConfig, set_seed  # noqa: E402

BATCH, SEQUENCE, STEPS = 8, 8, 12
TOLERANCE = dict(rtol=1e-4, atol=2e-5)  # fp32: micro-batch gradients are summed in another order


def token_loss(logits, target):
    """The mean next-token loss of one micro-batch (``target``: the tokens after the inputs)."""
    return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))


def batches():
    generator = torch.Generator().manual_seed(9)
    return [torch.randint(0, VOCAB, (BATCH, SEQUENCE + 1), generator=generator) for _ in range(STEPS)]


def reference(model):
    model = copy.deepcopy(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for tokens in batches():
        loss = lm_loss(model(tokens[:, :-1]), tokens)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return model, losses


def train(model, schedule: str, mode, **options):
    AcceleratorState._reset_state()
    sizes = {"tp": {"tp_size": 2}, "fsdp": {"dp_shard_size": 2}, "3d": {"dp_shard_size": 2, "tp_size": 2}}.get(mode, {})
    config = ParallelismConfig(pp_size=2, **sizes, pp_handler=TorchPipelineParallelConfig(
        schedule=schedule, num_micro_batches=2 if "dp_shard_size" in sizes else 4, loss_fn=token_loss, **options))
    accelerator = Accelerator(cpu=True, parallelism_config=config)
    model = copy.deepcopy(model)
    model, optimizer = accelerator.prepare(model, torch.optim.AdamW(model.parameters(), lr=1e-2))
    dp_size, dp_rank = accelerator.strategy.data_parallel_size, accelerator.strategy.data_parallel_rank
    losses = []
    for tokens in batches():
        mine = tokens.chunk(dp_size)[dp_rank]  # what a loader sharded over the data-parallel ranks gives
        loss = model(mine[:, :-1], target=mine[:, 1:])
        accelerator.backward(loss)  # the schedule ran the backward already
        accelerator.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(accelerator.reduce(loss, reduction="mean").item())  # the whole batch's mean
    return accelerator, model, losses


def check_schedule(work: Path, model, expected_model, expected_losses, schedule: str, mode, **options) -> None:
    accelerator, prepared, losses = train(model, schedule, mode, **options)
    name = f"pp=2{ {'tp': ' x tp=2', 'fsdp': ' x dp_shard=2', '3d': ' x dp_shard=2 x tp=2'}.get(mode, '')} {schedule}"
    check(all(abs(a - b) <= TOLERANCE["atol"] + TOLERANCE["rtol"] * abs(b) for a, b in zip(losses, expected_losses)),
          f"{name}: losses {losses} vs single-process {expected_losses}")
    weights = accelerator.get_state_dict(prepared)  # every stage's, gathered
    for key, value in expected_model.state_dict().items():
        check(key in weights and torch.allclose(weights[key].float(), value, **TOLERANCE),
              f"{name}: {key} differs from single-process training by "
              f"{(weights[key].float() - value).abs().max().item() if key in weights else 'missing'}")
    probe = batches()[0][:, :-1]
    prepared.eval()
    outputs = prepared(probe)  # every rank of the pipeline gets the last stage's outputs
    with torch.no_grad():
        check(torch.allclose(outputs, expected_model(probe), **TOLERANCE), f"{name}: evaluation outputs differ")
    prepared.train()
    if schedule == "1f1b" and mode is None:
        accelerator.save_state(work / "pp_checkpoint")
        if accelerator.is_main_process:
            torch.save(weights, work / "pp_weights.pt")
    say(accelerator, f"ok: {name} matches single-process training ({len(losses)} steps) and evaluation")


def check_bad_settings() -> None:
    def prepare(accumulation=1, loss_fn=token_loss):
        AcceleratorState._reset_state()
        config = ParallelismConfig(pp_size=2, pp_handler=TorchPipelineParallelConfig(loss_fn=loss_fn))
        accelerator = Accelerator(cpu=True, parallelism_config=config, gradient_accumulation_steps=accumulation)
        model = TinyGPT()
        return accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))

    expect_error(lambda: prepare(accumulation=2), "num_micro_batches", "gradient_accumulation_steps")
    expect_error(lambda: prepare(loss_fn=None), "loss_fn")
    expect_error(lambda: TorchPipelineParallelConfig(schedule="zigzag"), "zigzag", "gpipe")
    expect_error(lambda: TorchPipelineParallelConfig(schedule="gpipe", virtual_stages=2), "interleaved_1f1b")
    say(Accelerator(cpu=True), "ok: bad pipeline settings are refused with the reason")


def main(work: Path, mode) -> None:
    set_seed(21)
    model = TinyGPT()
    expected_model, expected_losses = reference(model)
    schedules = ["1f1b"] if mode else ["gpipe", "1f1b", "interleaved_1f1b"]
    for schedule in schedules:
        check_schedule(work, model, expected_model, expected_losses, schedule, mode)
    if mode is None:
        check_bad_settings()
    say(Accelerator(cpu=True), "PIPELINE TRAINING PASSED")


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else None)
