"""FSDP on 2 CPU processes: the plugin's wrapping options, bad input, fp16, state dicts, sharded checkpoints,
cpu_ram_efficient_loading (FSDP2) and FSDP1's wrapper.

Run by tests/strategies/fsdp/test_fsdp.py under ``hasten launch -n 2``. Each check builds a fresh Accelerator (the shared state is
reset between them). Prints FSDP CHECKS PASSED.
"""
import copy
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file
from torch import nn
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor

from hasten import Accelerator, FullyShardedDataParallelPlugin
from hasten.state import AcceleratorState
from hasten.utils import set_seed


class Block(nn.Module):
    def __init__(self, width: int = 16):
        super().__init__()
        self.up, self.down = nn.Linear(width, 2 * width), nn.Linear(2 * width, width)

    def forward(self, x):
        return x + self.down(torch.relu(self.up(x)))


class TinyTransformer(nn.Module):
    _no_split_modules = ["Block"]

    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(4, 16)
        self.blocks = nn.ModuleList([Block(), Block()])
        self.head = nn.Linear(16, 2)

    def forward(self, x):
        x = self.embed(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def check(condition: bool, what: str) -> None:
    if not condition:
        raise AssertionError(f"[rank {torch.distributed.get_rank()}] {what}")


def fresh(**plugin_options):
    AcceleratorState._reset_state()
    mixed_precision = plugin_options.pop("mixed_precision", None)
    plugin_options.setdefault("fsdp_version", 2)
    accelerator = Accelerator(cpu=True, mixed_precision=mixed_precision,
                              fsdp_plugin=FullyShardedDataParallelPlugin(**plugin_options))
    set_seed(0)
    model = TinyTransformer()
    return accelerator, model, torch.optim.AdamW(model.parameters(), lr=0.01)


def train_steps(accelerator, model, optimizer, steps: int = 3) -> list:
    generator = torch.Generator().manual_seed(accelerator.process_index)
    losses = []
    for _ in range(steps):
        x = torch.randn(8, 4, generator=generator)
        loss = model(x).pow(2).mean()
        accelerator.backward(loss)
        accelerator.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def raises(error_type, words, function):
    try:
        function()
    except error_type as error:
        check(all(word in str(error) for word in words), f"{error_type.__name__} without {words}: {error}")
        return
    check(False, f"no {error_type.__name__} ({words})")


def wrapping_policies() -> None:
    accelerator, model, optimizer = fresh(auto_wrap_policy="transformer_based_wrap")
    model, optimizer = accelerator.prepare(model, optimizer)
    check(isinstance(model, FSDPModule) and all(isinstance(b, FSDPModule) for b in model.blocks),
          "transformer_based_wrap through _no_split_modules shards each Block and the root")
    check(not isinstance(model.head, FSDPModule), "the head is part of the root unit")
    check(all(isinstance(p, DTensor) for p in model.parameters()), "every parameter is sharded")
    addresses = accelerator._get_named_parameters(model, drop_refs=True)
    check(addresses == {n: p._local_tensor.data_ptr() for n, p in model.named_parameters()} and "head.weight" in addresses,
          f"_get_named_parameters(drop_refs=True): the local shards' addresses by plain name: {list(addresses)[:3]}")
    train_steps(accelerator, model, optimizer)

    accelerator, model, optimizer = fresh(auto_wrap_policy="size_based_wrap", min_num_params=1000)
    model, optimizer = accelerator.prepare(model, optimizer)
    check(all(isinstance(b, FSDPModule) for b in model.blocks) and not isinstance(model.embed, FSDPModule),
          "size_based_wrap makes units of the modules with >= min_num_params parameters")

    accelerator, model, optimizer = fresh(auto_wrap_policy="transformer_based_wrap",
                                          transformer_cls_names_to_wrap=["Decoder"])
    raises(ValueError, ["Decoder", "Block", "TinyTransformer"], lambda: accelerator.prepare(model, optimizer))
    print("ok: wrap policies", flush=True)


def ignored_modules_and_checkpointing() -> None:
    accelerator, model, optimizer = fresh(ignored_modules=r"head")
    model, optimizer = accelerator.prepare(model, optimizer)
    check(not isinstance(model.head.weight, DTensor) and isinstance(model.embed.weight, DTensor),
          "ignored_modules (a regex of names) keeps the head unsharded")
    train_steps(accelerator, model, optimizer, 2)
    accelerator, model, optimizer = fresh(ignored_modules=r"decoder\..*")
    raises(ValueError, ["matches no submodule"], lambda: accelerator.prepare(model, optimizer))

    accelerator, model, optimizer = fresh(auto_wrap_policy="transformer_based_wrap")
    model, optimizer = accelerator.prepare(model, optimizer)
    plain = train_steps(accelerator, model, optimizer)
    accelerator, model, optimizer = fresh(auto_wrap_policy="transformer_based_wrap", activation_checkpointing=True)
    model, optimizer = accelerator.prepare(model, optimizer)
    names = [name for name, _ in model.named_modules()]
    check(any("_checkpoint_wrapped_module" in name for name in names), "blocks wrapped for activation checkpointing")
    checkpointed = train_steps(accelerator, model, optimizer)
    check(all(abs(a - b) < 1e-6 for a, b in zip(plain, checkpointed)),
          f"activation checkpointing changes no number: {plain} vs {checkpointed}")
    state = accelerator.get_state_dict(model)
    if accelerator.is_main_process:
        check(all("_checkpoint_wrapped_module" not in key for key in state), f"clean names: {list(state)[:3]}")
    print("ok: ignored modules and activation checkpointing", flush=True)


def preparation_errors() -> None:
    accelerator, model, optimizer = fresh()
    raises(ValueError, ["together", "accelerator.prepare(model, optimizer)"], lambda: accelerator.prepare(optimizer))
    model(torch.ones(1, 4)).sum().backward()
    optimizer.step()
    raises(ValueError, ["before the first optimizer step"], lambda: accelerator.prepare(model, optimizer))
    print("ok: preparation errors", flush=True)


def fp16_and_state_dicts(work: Path) -> None:
    accelerator, model, optimizer = fresh(mixed_precision="fp16")
    model, optimizer = accelerator.prepare(model, optimizer)
    losses = train_steps(accelerator, model, optimizer)
    check(all(torch.isfinite(torch.tensor(losses))), f"fp16 losses {losses}")
    check(type(accelerator.scaler).__name__ == "ShardedGradScaler", f"scaler {type(accelerator.scaler)}")

    state = accelerator.get_state_dict(model)
    if accelerator.is_main_process:
        check(all(type(value) is torch.Tensor and value.device.type == "cpu" for value in state.values()),
              "get_state_dict: plain CPU tensors on the main process")
        check(state["embed.weight"].shape == (16, 4), "full (unsharded) shapes")
    else:
        check(state == {}, "get_state_dict keeps no full copy on the other processes")
    check(accelerator.unwrap_model(model) is model, "unwrap_model: the user's module, sharded in place")
    accelerator.save_model(model, work / "saved_model")
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        written = load_file(str(work / "saved_model" / "model.safetensors"))
        check(written.keys() == state.keys() and all(torch.equal(written[k], state[k]) for k in state),
              "save_model writes the full weights")
    print("ok: fp16 with the sharded scaler, get_state_dict, save_model", flush=True)


def sharded_checkpoints(work: Path) -> None:
    """SHARDED_STATE_DICT (FSDP2's default): per-rank DCP files, async save, a refused load of another model."""
    from hasten.checkpointing import CheckpointError

    accelerator, model, optimizer = fresh(auto_wrap_policy="transformer_based_wrap")
    model, optimizer = accelerator.prepare(model, optimizer)
    train_steps(accelerator, model, optimizer)
    folder = Path(accelerator.save_state(work / "sharded"))
    check((folder / "pytorch_model_fsdp_0" / "__1_0.distcp").is_file(), "rank 1 wrote its own shard file")
    accelerator.save_model(model, work / "full_weights")  # what merge-weights must reproduce (test_fsdp.py)

    at_save = accelerator.get_state_dict(model)
    accelerator.save_state(work / "async", async_save=True)
    train_steps(accelerator, model, optimizer, 2)  # training goes on while the shards are written
    accelerator.wait_for_checkpoint()
    accelerator.load_state(work / "async")
    after_load = accelerator.get_state_dict(model)
    if accelerator.is_main_process:
        check(all(torch.equal(at_save[k], after_load[k]) for k in at_save),
              "an asynchronous sharded save holds the weights of the moment it was called")

    class FailsOnProcessOne:  # a snapshot that fails on one process: save_state returns on the others
        def state_dict(self):
            if accelerator.process_index == 1:
                raise RuntimeError("no state on process 1")
            return {"calls": 1}

        def load_state_dict(self, state):
            pass

    accelerator.register_for_checkpointing(FailsOnProcessOne())
    if accelerator.process_index == 1:  # raises at once, once the others' background threads know
        raises(RuntimeError, ["no state on process 1"],
               lambda: accelerator.save_state(work / "failed", async_save=True))
    else:  # returns without waiting for process 1; its next wait raises
        accelerator.save_state(work / "failed", async_save=True)
        raises(CheckpointError, ["process 1", "no state on process 1"], accelerator.wait_for_checkpoint)
    accelerator._custom_objects.pop()
    accelerator.wait_for_everyone()
    check(not any("failed" in path.name for path in work.iterdir()), "a failed async save leaves no folder")
    train_steps(accelerator, model, optimizer)
    at_save = accelerator.get_state_dict(model)
    hook = accelerator.register_save_state_pre_hook(  # with save hooks: staged and run before save_state returns
        lambda models, weights, folder: Path(folder, f"hook_{accelerator.process_index}.txt").write_text("ran"))
    accelerator.save_state(work / "async", async_save=True)  # the next one completes, over the same group
    hook.remove()
    accelerator.wait_for_checkpoint()
    check((work / "async" / f"hook_{accelerator.process_index}.txt").read_text() == "ran",
          "an async save runs the save hooks into its folder, then completes in the background")
    accelerator.load_state(work / "async")  # complete: every file in its marker, checksums and all
    after_load = accelerator.get_state_dict(model)
    if accelerator.is_main_process:  # the same layout saved again: DCP's kept plans, this save's values
        check(all(torch.equal(at_save[k], after_load[k]) for k in at_save), "the second async save's weights")

    other = nn.Sequential(nn.Linear(4, 3))
    AcceleratorState._reset_state()
    accelerator = Accelerator(cpu=True, fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=2))
    other_optimizer = torch.optim.AdamW(other.parameters(), lr=0.01)
    other, other_optimizer = accelerator.prepare(other, other_optimizer)
    raises(CheckpointError, ["0.weight", "Nothing was loaded"], lambda: accelerator.load_state(folder))
    print(f"ok: sharded checkpoints, async, refused model ({folder})", flush=True)


def ram_efficient_loading() -> None:
    """cpu_ram_efficient_loading: only the main process holds real weights (the other builds on meta)."""
    from hasten import init_empty_weights

    AcceleratorState._reset_state()
    accelerator = Accelerator(cpu=True, fsdp_plugin=FullyShardedDataParallelPlugin(
        fsdp_version=2, cpu_ram_efficient_loading=True, auto_wrap_policy="transformer_based_wrap"))
    set_seed(0)
    if accelerator.is_main_process:
        model = TinyTransformer()
        model.register_buffer("scale", torch.full((3,), 2.0), persistent=False)
        original = {k: v.clone() for k, v in model.state_dict().items()}
    else:
        with init_empty_weights(include_buffers=True):
            model = TinyTransformer()
            model.register_buffer("scale", torch.zeros(3), persistent=False)
        original = None
    check(accelerator.is_main_process or model.embed.weight.device.type == "meta", "non-main processes on meta")
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    model, optimizer = accelerator.prepare(model, optimizer)
    check(torch.equal(model.scale, torch.full((3,), 2.0)), f"non-persistent buffers broadcast: {model.scale}")
    state = accelerator.get_state_dict(model)
    if accelerator.is_main_process:
        check(all(torch.equal(state[k], original[k]) for k in original), "every rank got the main process's weights")
    train_steps(accelerator, model, optimizer, 2)
    print("ok: cpu_ram_efficient_loading", flush=True)


def fsdp1() -> None:
    """fsdp_version=1: FullyShardedDataParallel units, parameter groups, activation checkpointing, ignored modules."""
    from torch.distributed.fsdp import FullyShardedDataParallel

    accelerator, model, optimizer = fresh(fsdp_version=1, auto_wrap_policy="transformer_based_wrap",
                                          activation_checkpointing=True, ignored_modules="head")
    model, optimizer = accelerator.prepare(model, optimizer)
    units = [m for m in model.modules() if isinstance(m, FullyShardedDataParallel)]
    check(len(units) == 3, f"FSDP1 wraps the root and each Block: {len(units)} units")
    check(model._ignored_modules == {model.module.head}, "FSDP1 is given the ignored modules themselves")
    check(any("_checkpoint_wrapped_module" in name for name, _ in model.named_modules()), "blocks checkpointed")
    losses = train_steps(accelerator, model, optimizer)
    check(all(torch.isfinite(torch.tensor(losses))), f"FSDP1 trains: {losses}")

    AcceleratorState._reset_state()
    accelerator = Accelerator(cpu=True, fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=1))
    model = TinyTransformer()
    groups = [{"params": model.embed.parameters()}, {"params": list(model.blocks.parameters()) +
                                                     list(model.head.parameters()), "lr": 0.1}]
    raises(ValueError, ["use_orig_params=True"], lambda: accelerator.prepare(model, torch.optim.SGD(groups, lr=0.01)))

    AcceleratorState._reset_state()
    accelerator = Accelerator(cpu=True, fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=1,
                                                                                   use_orig_params=True))
    model = TinyTransformer()
    groups = [{"params": model.embed.parameters()}, {"params": list(model.blocks.parameters()) +
                                                     list(model.head.parameters()), "lr": 0.1}]
    model, optimizer = accelerator.prepare(model, torch.optim.SGD(groups, lr=0.01))
    train_steps(accelerator, model, optimizer, 2)
    check([g["lr"] for g in optimizer.param_groups] == [0.01, 0.1], "use_orig_params keeps the parameter groups")
    print("ok: FSDP1", flush=True)


def accelerate_file_functions(work: Path) -> None:
    """Accelerate's save_fsdp_model / load_fsdp_model / ..._optimizer, fsdp2_prepare_model and
    fsdp2_load_full_state_dict on hasten's FSDP strategy."""
    from hasten.utils.fsdp_utils import (fsdp2_load_full_state_dict, fsdp2_prepare_model, load_fsdp_model,
                                         load_fsdp_optimizer, save_fsdp_model, save_fsdp_optimizer)

    for kind, files in (("FULL_STATE_DICT", ("pytorch_model_fsdp.bin", "optimizer.bin")),
                        ("SHARDED_STATE_DICT", ("pytorch_model_fsdp_0/.metadata", "optimizer_0/.metadata"))):
        accelerator, model, optimizer = fresh(state_dict_type=kind)
        model, optimizer = accelerator.prepare(model, optimizer)
        train_steps(accelerator, model, optimizer, 2)
        plugin, folder = accelerator.strategy.plugin, work / kind
        save_fsdp_model(plugin, accelerator, model, folder)
        save_fsdp_optimizer(plugin, accelerator, optimizer, model, folder)
        check(all((folder / name).is_file() for name in files), f"{kind} files {files}")
        weights = accelerator.get_state_dict(model)
        state = copy.deepcopy(accelerator.strategy.optimizer_state_dict(model, optimizer))  # (holds live tensors)
        train_steps(accelerator, model, optimizer, 2)  # move away from the saved state
        load_fsdp_model(plugin, accelerator, model, folder)
        load_fsdp_optimizer(plugin, accelerator, optimizer, model, folder)
        again, state_again = accelerator.get_state_dict(model), accelerator.strategy.optimizer_state_dict(model, optimizer)
        if accelerator.is_main_process:
            check(all(torch.equal(weights[k], again[k]) for k in weights), f"{kind}: weights back")
            check(all(torch.equal(torch.as_tensor(v), torch.as_tensor(state_again["state"][i][f]))
                      for i, entry in state["state"].items() for f, v in entry.items()), f"{kind}: optimizer back")

    accelerator, _, _ = fresh()
    set_seed(1)
    model = fsdp2_prepare_model(accelerator, TinyTransformer())
    check(isinstance(model, FSDPModule), "fsdp2_prepare_model shards in place")
    set_seed(2)
    source = TinyTransformer().state_dict()
    fsdp2_load_full_state_dict(accelerator, model, source)
    loaded = accelerator.get_state_dict(model)
    if accelerator.is_main_process:
        check(all(torch.equal(loaded[k], source[k]) for k in source), "fsdp2_load_full_state_dict")
    print("ok: Accelerate's FSDP file functions", flush=True)


def main(work: Path) -> None:
    wrapping_policies()
    ignored_modules_and_checkpointing()
    preparation_errors()
    fp16_and_state_dicts(work)
    sharded_checkpoints(work)
    ram_efficient_loading()
    fsdp1()
    accelerate_file_functions(work)
    torch.distributed.barrier()
    if torch.distributed.get_rank() == 0:
        print("FSDP CHECKS PASSED", flush=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
