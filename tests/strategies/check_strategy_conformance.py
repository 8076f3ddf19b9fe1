"""Strategy conformance: one training script, every strategy, the same numbers as single-process PyTorch.

Run by tests/strategies/test_strategy_conformance.py as ``hasten launch -n <world> check_strategy_conformance.py <strategy>
<work folder> [checkpoint to load]``. For the strategy named (see ``STRATEGIES``):

1. trains a small MLP with AdamW, gradient accumulation, gradient clipping and a scheduler on a sharded loader,
   and checks every step's loss (gathered over the data-parallel ranks) and the final parameters against the same
   loop in plain PyTorch on one process (``reference_run``) within ``TOLERANCE``;
2. evaluates with ``gather_for_metrics``: every sample exactly once;
3. saves a checkpoint (``<work>/<strategy>``) and, given another strategy's checkpoint, loads it into fresh objects
   and checks that the weights, the optimizer state and the schedule are those of that run.

Prints ``CONFORMANCE PASSED <strategy>``.
"""
from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from hasten import Accelerator, DeepSpeedPlugin, FullyShardedDataParallelPlugin, ParallelismConfig
from hasten.utils import TorchTensorParallelConfig
from hasten.strategies.deepspeed.checkpoint_reader import deepspeed_parameter_names, read_deepspeed_checkpoint
from hasten.checkpointing.optimizer_names import by_name, by_position
from hasten.checkpointing.sharded_files import model_weights_from_shards, optimizer_state_from_shards
from hasten.utils import set_seed

# name -> (processes, Accelerator arguments, the strategy class they must select). A new backend adds its line.
STRATEGIES = {
    "single": (1, {}, "SingleDeviceStrategy"),
    "ddp": (2, {}, "DDPStrategy"),
    "ddp_mesh": (2, {"parallelism_config": ParallelismConfig(dp_replicate_size=2)}, "DDPStrategy"),  # on the mesh
    "fsdp2": (2, {"fsdp_plugin": FullyShardedDataParallelPlugin(fsdp_version=2)}, "FSDP2Strategy"),  # sharded files
    "fsdp2_full": (2, {"fsdp_plugin": FullyShardedDataParallelPlugin(fsdp_version=2,
                                                                      state_dict_type="FULL_STATE_DICT")},
                   "FSDP2Strategy"),  # full files gathered to the main process
    "fsdp2_bf16": (2, {"fsdp_plugin": FullyShardedDataParallelPlugin(fsdp_version=2, mixed_precision_policy="bf16")},
                   "FSDP2Strategy"),  # bf16 compute and reductions, fp32 master weights: BF16_TOLERANCE
    "fsdp2_config": (2, {"parallelism_config": ParallelismConfig(dp_shard_size=2)}, "FSDP2Strategy"),
    "fsdp1": (2, {"fsdp_plugin": FullyShardedDataParallelPlugin(fsdp_version=1)}, "FSDP1Strategy"),  # full files
    "fsdp1_sharded": (2, {"fsdp_plugin": FullyShardedDataParallelPlugin(
        fsdp_version=1, use_orig_params=True, state_dict_type="SHARDED_STATE_DICT")}, "FSDP1Strategy"),
    "hsdp": (4, {"parallelism_config": ParallelismConfig(dp_replicate_size=2, dp_shard_size=2)}, "FSDP2Strategy"),
}
# Tensor parallelism (DTensor): the MLP's first Linear split by output features, the second by input features;
# alone on 2 processes, then with FSDP2 (2 x 2) and with data-parallel replication (DDP x TP, 2 x 2).
MLP_PLAN = {"0": "colwise", "2": "rowwise"}
for _name, _sizes in (("tp", {}), ("fsdp_tp", {"dp_shard_size": 2}), ("ddp_tp", {"dp_replicate_size": 2})):
    STRATEGIES[_name] = (2 * (2 if _sizes else 1), {"parallelism_config": ParallelismConfig(
        tp_size=2, tp_handler=TorchTensorParallelConfig(tp_plan=MLP_PLAN), **_sizes)}, "ModelParallelStrategy")
# DeepSpeed ZeRO 0-3, fp32 and bf16 (16-bit weights, fp32 master weights and moments), optimizer and parameter
# offload to the CPU (DeepSpeedCPUAdam); each engine writes its own checkpoint (pytorch_model/). Only with the
# deepspeed extra installed (make test installs it).
if importlib.util.find_spec("deepspeed"):
    for _stage in (0, 1, 2, 3):
        STRATEGIES[f"zero{_stage}"] = (2, {"deepspeed_plugin": DeepSpeedPlugin(zero_stage=_stage)},
                                       "DeepSpeedStrategy")
    for _stage in (0, 1, 2, 3):
        STRATEGIES[f"zero{_stage}_bf16"] = (2, {"deepspeed_plugin": DeepSpeedPlugin(zero_stage=_stage),
                                                "mixed_precision": "bf16"}, "DeepSpeedStrategy")
    STRATEGIES["zero2_offload"] = (2, {"deepspeed_plugin": DeepSpeedPlugin(
        zero_stage=2, offload_optimizer_device="cpu")}, "DeepSpeedStrategy")
    # no "ds_sp2": DeepSpeed sequence parallelism (Ulysses) splits attention heads of a transformers model, not this
    # MLP; tests/strategies/deepspeed/check_sequence_parallel.py compares it with one process within TOLERANCE
    STRATEGIES["zero3_offload"] = (2, {"deepspeed_plugin": DeepSpeedPlugin(
        zero_stage=3, offload_optimizer_device="cpu", offload_param_device="cpu")}, "DeepSpeedStrategy")
TOLERANCE = dict(rtol=1e-5, atol=1e-6)  # float32 on CPU; only the reduction order differs between strategies
# bf16 compute and gradient reduction (8 bits of mantissa), 6 AdamW steps: losses within 2% of fp32 PyTorch's;
# weights within lr x steps / 2, because AdamW moves a coordinate whose gradient is near zero by up to lr per
# step whichever way rounding tips its sign.
BF16_LOSSES, BF16_WEIGHTS = dict(rtol=2e-2, atol=2e-3), dict(rtol=0.0, atol=0.02 * 6 / 2)
TOLERANCES = {"fsdp2_bf16": (BF16_LOSSES, BF16_WEIGHTS),
              **{f"zero{stage}_bf16": (BF16_LOSSES, BF16_WEIGHTS) for stage in (0, 1, 2, 3)}}
SAMPLES, MICRO_BATCH, ACCUMULATION, MAX_NORM = 96, 4, 2, 0.5


def data():
    generator = torch.Generator().manual_seed(1234)
    inputs = torch.randn(SAMPLES, 8, generator=generator)
    targets = inputs @ torch.randn(8, 2, generator=generator) + 0.1 * torch.randn(SAMPLES, 2, generator=generator)
    return inputs, targets


def fresh_objects():
    set_seed(7)
    model = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.02, weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.7)
    return model, optimizer, scheduler


def reference_run(dp_size: int):
    """The same training in plain PyTorch on one process: each optimizer step sees the samples that the
    ``dp_size`` data-parallel ranks together see in one accumulation cycle (contiguous, unshuffled)."""
    inputs, targets = data()
    model, optimizer, scheduler = fresh_objects()
    per_step = MICRO_BATCH * dp_size * ACCUMULATION
    losses = []
    for start in range(0, SAMPLES, per_step):
        x, y = inputs[start:start + per_step], targets[start:start + per_step]
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
        optimizer.step()
        # the prepared scheduler steps once per process per optimizer step (a schedule in single-process steps)
        for _ in range(dp_size):
            scheduler.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return model, losses


def check(condition: bool, what: str, accelerator) -> None:
    if not condition:
        raise AssertionError(f"[process {accelerator.process_index}] {what}")


def close(a: torch.Tensor, b: torch.Tensor, tolerance: dict = TOLERANCE) -> bool:
    return torch.allclose(a, b, **tolerance)


def train(accelerator, model, optimizer, scheduler, loader):
    """The user's loop: accumulate, backward, clip, step; returns the mean loss of each optimizer step."""
    losses, cycle = [], []
    model.train()
    for x, y in loader:
        with accelerator.accumulate(model):
            loss = nn.functional.mse_loss(model(x), y)
            accelerator.backward(loss)
            cycle.append(loss.detach())
            if accelerator.sync_gradients:
                accelerator.clip_grad_norm_(model.parameters(), MAX_NORM)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
        if accelerator.sync_gradients:
            local = torch.stack(cycle).mean()
            losses.append(accelerator.reduce(local, reduction="mean").item())
            cycle = []
    return losses


def main(strategy: str, work: Path, load_from: str | None) -> None:
    world, kwargs, expected = STRATEGIES[strategy]
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=ACCUMULATION, **kwargs)
    check(accelerator.num_processes == world, f"{strategy} runs on {world} processes", accelerator)
    chosen = type(accelerator.strategy).__name__
    check(chosen == expected, f"{strategy} selected {chosen}, not {expected}", accelerator)
    dp_size = accelerator.strategy.data_parallel_size

    inputs, targets = data()
    model, optimizer, scheduler = fresh_objects()
    loader = DataLoader(TensorDataset(inputs, targets), batch_size=MICRO_BATCH)
    model, optimizer, scheduler, loader = accelerator.prepare(model, optimizer, scheduler, loader)
    losses = train(accelerator, model, optimizer, scheduler, loader)

    reference, reference_losses = reference_run(dp_size)
    check(len(losses) == len(reference_losses), f"{len(losses)} optimizer steps, reference {len(reference_losses)}",
          accelerator)
    tolerance, weight_tolerance = TOLERANCES.get(strategy, (TOLERANCE, TOLERANCE))
    check(all(math.isclose(a, b, rel_tol=tolerance["rtol"], abs_tol=tolerance["atol"])
              for a, b in zip(losses, reference_losses)),
          f"losses {losses} differ from single-process PyTorch's {reference_losses}", accelerator)
    trained = accelerator.get_state_dict(model)
    if accelerator.is_main_process:
        for name, value in reference.state_dict().items():
            check(close(trained[name].cpu().float(), value, weight_tolerance),
                  f"parameter {name} differs from single-process PyTorch's by "
                  f"{(trained[name].cpu().float() - value).abs().max().item():.2e}", accelerator)
    print(f"ok: {strategy} matches single-process PyTorch ({len(losses)} steps)", flush=True)

    # evaluation: every sample exactly once, in order
    eval_loader = accelerator.prepare(DataLoader(TensorDataset(torch.arange(SAMPLES - 3)), batch_size=5))
    seen = torch.cat([accelerator.gather_for_metrics(batch[0]) for batch in eval_loader])
    check(sorted(seen.tolist()) == list(range(SAMPLES - 3)), f"gather_for_metrics saw {seen.tolist()}", accelerator)

    saved = accelerator.save_state(work / strategy)
    accelerator.wait_for_everyone()

    if load_from is not None:
        check_loads(accelerator, work / load_from, strategy, load_from)
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        print(f"CONFORMANCE PASSED {strategy} (saved {saved})", flush=True)


def saved_weights(folder: Path) -> dict:
    """Model 0's full weights in a checkpoint: full files, or the shards a sharded strategy wrote."""
    if (folder / "model.safetensors").is_file():
        return load_file(str(folder / "model.safetensors"))
    if (folder / "pytorch_model").is_dir():  # a DeepSpeed engine's own checkpoint (fp32 master weights)
        return read_deepspeed_checkpoint(folder / "pytorch_model", with_optimizer=False)[0]
    return model_weights_from_shards(folder / "pytorch_model_fsdp_0")


def saved_optimizer(folder: Path, names: list) -> dict:
    """Optimizer 0's full state in a checkpoint, laid out as ``optimizer.state_dict()`` (``names``: its parameters')."""
    if (folder / "optimizer.bin").is_file():
        return torch.load(folder / "optimizer.bin", weights_only=True)
    if (folder / "pytorch_model").is_dir():
        state = read_deepspeed_checkpoint(folder / "pytorch_model")[1]
        return by_position(by_name(state, deepspeed_parameter_names(folder / "pytorch_model")), names,
                           state["param_groups"])
    return optimizer_state_from_shards(folder / "optimizer_0", names)


def check_loads(accelerator, folder: Path, strategy: str, other: str) -> None:
    """Load another strategy's checkpoint into fresh objects and compare, on the main process, the full weights,
    optimizer state and schedule with those the checkpoint holds (full files or shards, whichever it has)."""
    accelerator.free_memory()  # forget the objects trained above: the fresh ones take their places
    model, optimizer, scheduler = fresh_objects()
    # a loader too: the checkpoint holds one loader's position (and DeepSpeed sizes its batches from it)
    model, optimizer, scheduler, _ = accelerator.prepare(
        model, optimizer, scheduler, DataLoader(TensorDataset(*data()), batch_size=MICRO_BATCH))
    accelerator.load_state(folder)
    # DeepSpeed: the fp32 master weights (the module's own may be 16-bit copies of them)
    master = getattr(accelerator.strategy, "master_model_state_dict", None)
    weights = master(model) if master is not None else accelerator.get_state_dict(model)
    live_optimizer = accelerator.strategy.optimizer_state_dict(model, optimizer)  # full, on the main process
    if accelerator.is_main_process:
        saved = saved_weights(folder)
        check(saved.keys() == weights.keys(), f"model keys {sorted(saved)} vs {sorted(weights)}", accelerator)
        for name, value in saved.items():
            check(torch.equal(weights[name].cpu(), value), f"{name} not loaded from {other}'s checkpoint", accelerator)
        before = saved_optimizer(folder, accelerator.strategy.optimizer_parameter_names(model, optimizer))
        check(before["state"].keys() == live_optimizer["state"].keys(), "optimizer state keys", accelerator)
        for key, entry in before["state"].items():
            for field, value in entry.items():
                check(torch.equal(torch.as_tensor(live_optimizer["state"][key][field]).cpu(), torch.as_tensor(value)),
                      f"optimizer state {key}/{field} not loaded from {other}'s checkpoint", accelerator)
        # every saved hyperparameter is restored (an optimizer may have more: DeepSpeedCPUAdam's bias_correction)
        hyper = [{k: v for k, v in g.items() if k != "params"} for g in before["param_groups"]]
        live = [{k: g.get(k) for k in saved} for g, saved in zip(live_optimizer["param_groups"], hyper)]
        check(hyper == live, f"optimizer hyperparameters {hyper} vs {live}", accelerator)
    check(scheduler.state_dict() == torch.load(folder / "scheduler.bin", weights_only=True), "scheduler state",
          accelerator)
    if accelerator.is_main_process:
        print(f"ok: {strategy} loaded {other}'s checkpoint", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]), sys.argv[3] if len(sys.argv) > 3 else None)
