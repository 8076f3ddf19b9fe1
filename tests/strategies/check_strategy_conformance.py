"""Strategy conformance: one training script, every strategy, the same numbers as single-process PyTorch.

Run by tests/strategies/test_strategy_conformance.py as ``hasten launch -n <world> check_strategy_conformance.py <strategy>
<work folder> [checkpoint to load]``. For the strategy named (see ``STRATEGIES``):

1. trains a model (the strategy's workload, ``WORKLOADS``: a small MLP, or a tiny causal language model for the
   strategies that need attention heads) with AdamW, gradient accumulation, gradient clipping and a scheduler on a
   sharded loader, and checks every step's loss (gathered over the data-parallel ranks) and the final parameters
   against the same loop in plain PyTorch on one process (the workload's ``reference_run``) within ``TOLERANCE``;
2. evaluates with ``gather_for_metrics``: every sample exactly once;
3. saves a checkpoint (``<work>/<strategy>``) and, given another strategy's checkpoint (of the same workload),
   loads it into fresh objects and checks that the weights, the optimizer state and the schedule are those of that
   run.

Prints ``CONFORMANCE PASSED <strategy>``.

``check_strategy_conformance.py pipeline_inference <work folder> <checkpoint>`` is the pipeline-inference line: the
MLP with the weights of another strategy's checkpoint, cut into one stage per process by ``prepare_pippy``, gives
the outputs of the whole model on one process within ``TOLERANCE`` (prints ``PIPELINE INFERENCE PASSED``).
"""
from __future__ import annotations

import importlib.util
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from safetensors.torch import load_file
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import conformance_language_model as language_model  # beside this script
from hasten import Accelerator, DeepSpeedPlugin, FullyShardedDataParallelPlugin, ParallelismConfig
from hasten.utils import DeepSpeedSequenceParallelConfig, TorchTensorParallelConfig
from hasten.checkpointing.deepspeed_files import deepspeed_parameter_names, read_deepspeed_checkpoint
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
    # FSDP2 from a ParallelismConfig on 4 processes: it loads the 2-process fsdp2_bf16's shards (2 -> 4) and the
    # 2-process FSDP runs load its own (4 -> 2: test_strategy_conformance.CROSS_LOADS)
    "fsdp2_config": (4, {"parallelism_config": ParallelismConfig(dp_shard_size=4)}, "FSDP2Strategy"),
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
    STRATEGIES["zero3_offload"] = (2, {"deepspeed_plugin": DeepSpeedPlugin(
        zero_stage=3, offload_optimizer_device="cpu", offload_param_device="cpu")}, "DeepSpeedStrategy")
# The language-model workload (conformance_language_model.py): one process, FSDP2, then DeepSpeed sequence
# parallelism (ALST / Ulysses: each sequence split over 2 ranks, sdpa attention) at ZeRO-3 and ZeRO-2; their
# checkpoints cross.
STRATEGIES["lm_single"] = (1, {}, "SingleDeviceStrategy")
STRATEGIES["lm_fsdp2"] = (2, {"fsdp_plugin": FullyShardedDataParallelPlugin(fsdp_version=2)}, "FSDP2Strategy")
if importlib.util.find_spec("deepspeed"):
    for _name, _stage in (("ds_sp2", 3), ("ds_sp2_zero2", 2)):
        STRATEGIES[_name] = (2, {"deepspeed_plugin": DeepSpeedPlugin(zero_stage=_stage), "parallelism_config":
                                 ParallelismConfig(sp_backend="deepspeed", sp_size=2, sp_handler=(
                                     DeepSpeedSequenceParallelConfig(sp_seq_length_is_variable=True,
                                                                     sp_attn_implementation="sdpa")))},
                             "DeepSpeedStrategy")
LANGUAGE_MODEL_LINES = ("lm_single", "lm_fsdp2", "ds_sp2", "ds_sp2_zero2")
TOLERANCE = dict(rtol=1e-5, atol=1e-6)  # float32 on CPU; only the reduction order differs between strategies
# bf16 compute and gradient reduction (8 bits of mantissa), 6 AdamW steps: losses within 2% of fp32 PyTorch's;
# weights within lr x steps / 2, because AdamW moves a coordinate whose gradient is near zero by up to lr per
# step whichever way rounding tips its sign.
BF16_LOSSES, BF16_WEIGHTS = dict(rtol=2e-2, atol=2e-3), dict(rtol=0.0, atol=0.02 * 6 / 2)
# Sequence parallelism sums each weight's gradient from the two halves of every sequence (one process: from whole
# sequences), a float32 reordering; AdamW divides every coordinate's step by its own gradient's running size, so
# where a gradient is near zero that noise moves the weight visibly: 6.7e-6 (ZeRO-3) and 5.3e-6 (ZeRO-2) at most,
# measured, while the losses stay within TOLERANCE, and the same runs with SGD end within 6e-8 of one process's.
SEQUENCE_PARALLEL_WEIGHTS = dict(rtol=1e-5, atol=2e-5)
TOLERANCES = {"fsdp2_bf16": (BF16_LOSSES, BF16_WEIGHTS),
              **{f"zero{stage}_bf16": (BF16_LOSSES, BF16_WEIGHTS) for stage in (0, 1, 2, 3)},
              **{name: (TOLERANCE, SEQUENCE_PARALLEL_WEIGHTS) for name in ("ds_sp2", "ds_sp2_zero2")}}
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


def mlp_loader() -> DataLoader:
    return DataLoader(TensorDataset(*data()), batch_size=MICRO_BATCH)


def mlp_loss(accelerator, model, batch) -> torch.Tensor:
    x, y = batch
    return nn.functional.mse_loss(model(x), y)


def reference_run(batches_per_step: int, scheduler_steps: int, accumulation: int = ACCUMULATION,
                  max_norm: float = MAX_NORM):
    """The same training in plain PyTorch on one process: each optimizer step sees the samples that the
    ``batches_per_step`` data-parallel ranks together see in one accumulation cycle (contiguous, unshuffled), and
    the scheduler advances ``scheduler_steps`` (the prepared scheduler steps once per data-parallel process per
    optimizer step: a schedule in single-process steps)."""
    inputs, targets = data()
    model, optimizer, scheduler = fresh_objects()
    per_step = MICRO_BATCH * batches_per_step * accumulation
    losses = []
    for start in range(0, SAMPLES, per_step):
        x, y = inputs[start:start + per_step], targets[start:start + per_step]
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        optimizer.step()
        for _ in range(scheduler_steps):
            scheduler.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return model, losses


@dataclass(frozen=True)
class Workload:
    """What a strategy trains: fresh (model, optimizer, scheduler), the training loader, the user's loss of one
    batch, and the plain single-process PyTorch run it is checked against."""

    fresh_objects: Callable
    loader: Callable
    loss: Callable
    reference_run: Callable


WORKLOADS = {
    "mlp": Workload(fresh_objects, mlp_loader, mlp_loss, reference_run),
    "language_model": Workload(language_model.fresh_objects, language_model.loader, language_model.loss,
                               language_model.reference_run),
}


def workload_of(strategy: str) -> str:
    return "language_model" if strategy in LANGUAGE_MODEL_LINES else "mlp"


def check(condition: bool, what: str, accelerator) -> None:
    if not condition:
        raise AssertionError(f"[process {accelerator.process_index}] {what}")


def close(a: torch.Tensor, b: torch.Tensor, tolerance: dict = TOLERANCE) -> bool:
    return torch.allclose(a, b, **tolerance)


def train(accelerator, model, optimizer, scheduler, loader, loss_of):
    """The user's loop: accumulate, backward, clip, step; returns the mean loss of each optimizer step."""
    losses, cycle = [], []
    model.train()
    for batch in loader:
        with accelerator.accumulate(model):
            loss = loss_of(accelerator, model, batch)
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
    workload = WORKLOADS[workload_of(strategy)]
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=ACCUMULATION, **kwargs)
    check(accelerator.num_processes == world, f"{strategy} runs on {world} processes", accelerator)
    chosen = type(accelerator.strategy).__name__
    check(chosen == expected, f"{strategy} selected {chosen}, not {expected}", accelerator)
    # the prepared scheduler steps once per data-parallel process; under sequence parallelism each group of sp_size
    # processes trains one batch after the other, so an optimizer step sees dp_size / sp_size batches
    dp_size = accelerator.strategy.data_parallel_size
    sp_size = accelerator.parallelism_config.sp_size if accelerator.parallelism_config is not None else 1
    # before prepare: DeepSpeed's Ulysses replaces transformers' attention for the whole process
    reference, reference_losses = workload.reference_run(dp_size // sp_size, dp_size, ACCUMULATION, MAX_NORM)

    model, optimizer, scheduler = workload.fresh_objects()
    model, optimizer, scheduler, loader = accelerator.prepare(model, optimizer, scheduler, workload.loader())
    losses = train(accelerator, model, optimizer, scheduler, loader, workload.loss)

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
        check_loads(accelerator, work / load_from, strategy, load_from, workload)
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


def check_loads(accelerator, folder: Path, strategy: str, other: str, workload: Workload) -> None:
    """Load another strategy's checkpoint into fresh objects and compare, on the main process, the full weights,
    optimizer state and schedule with those the checkpoint holds (full files or shards, whichever it has)."""
    accelerator.free_memory()  # forget the objects trained above: the fresh ones take their places
    model, optimizer, scheduler = workload.fresh_objects()
    # a loader too: the checkpoint holds one loader's position (and DeepSpeed sizes its batches from it)
    model, optimizer, scheduler, _ = accelerator.prepare(model, optimizer, scheduler, workload.loader())
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


def pipeline_inference(work: Path, load_from: str) -> None:
    """The MLP with the weights of ``load_from``'s checkpoint, cut at its second Linear into one stage per process
    (``prepare_pippy``, 2 processes), gives the whole model's outputs on one process; every process receives them."""
    from hasten import PartialState
    from hasten.inference import prepare_pippy

    state = PartialState(cpu=True)
    model = fresh_objects()[0].eval()
    model.load_state_dict(saved_weights(work / load_from))
    inputs = data()[0]
    with torch.no_grad():
        expected = model(inputs)
    chunks = state.num_processes
    pipelined = prepare_pippy(model, split_points=["2"], example_args=(inputs[: len(inputs) // chunks],),
                              gather_output=True)
    with torch.no_grad():
        output = pipelined(inputs)
    if output is None or not close(output, expected):
        raise AssertionError(f"[process {state.process_index}] the pipeline's output differs from the whole model's "
                             f"on {load_from}'s weights" + ("" if output is None else
                                                            f" by {(output - expected).abs().max().item():.2e}"))
    state.wait_for_everyone()
    if state.is_main_process:
        print(f"PIPELINE INFERENCE PASSED on {load_from}'s weights ({state.num_processes} stages)", flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "pipeline_inference":
        pipeline_inference(Path(sys.argv[2]), sys.argv[3])
    else:
        main(sys.argv[1], Path(sys.argv[2]), sys.argv[3] if len(sys.argv) > 3 else None)
