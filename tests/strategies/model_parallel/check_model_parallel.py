"""Tensor parallelism on real processes, run by tests/strategies/model_parallel/test_model_parallel.py as
``hasten launch -n 2 check_model_parallel.py <work>``.

1. A tiny GPT-style model (shipped here) trained 20 steps with TP=2 and sequence parallelism (norms on a slice of
   the sequence), from a plan given in the ParallelismConfig: every loss and the final weights match the same
   training on one process;
2. the same model with its own ``_tp_plan`` (no plan given), TP=2;
3. a "loss_parallel" head: the logits stay split over the vocabulary and the loss runs on the shares, matching;
4. a transformers Llama built from a tiny config (no download), split with its own ``base_model_tp_plan``, TP=2,
   matching single-process training, with its layers wrapped for activation checkpointing before ``prepare`` (the
   plan sees through the wrappers) and a ``foreach=True`` AdamW (its groups mix DTensors and plain tensors: they
   step tensor by tensor, with a warning);
5. a checkpoint saved with TP=2 loads on one process (the test reads it with TP=1 afterwards);
6. invalid plans and layouts refused with the reason, before any work;
7. ``TorchTensorParallelPlugin(torch_device_mesh=...)``: the user's mesh is the one the model is split over, and a
   mesh of another layout is refused before any work (the reference ignores the mesh).

Prints ``MODEL PARALLEL CHECKS PASSED``.
"""
from __future__ import annotations

import copy
import os
import sys
import warnings
from pathlib import Path

import torch
from torch import nn

from hasten import Accelerator, ParallelismConfig
from hasten.state import AcceleratorState
from hasten.utils import TorchTensorParallelConfig, set_seed

VOCAB, WIDTH, SEQUENCE, BATCH, STEPS = 32, 16, 8, 4, 20
LOSSES = dict(rtol=1e-4, atol=1e-6)  # fp32; the tp all-reduces sum partial products in another order
WEIGHTS = dict(rtol=1e-4, atol=2e-5)


def say(accelerator, line: str) -> None:
    if accelerator.is_main_process:
        os.write(1, (line + "\n").encode())


def check(condition: bool, what: str) -> None:
    if not condition:
        raise AssertionError(f"[rank {torch.distributed.get_rank()}] {what}")


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(WIDTH)
        self.fc1 = nn.Linear(WIDTH, 4 * WIDTH)
        self.fc2 = nn.Linear(4 * WIDTH, WIDTH)

    def forward(self, x):
        return x + self.fc2(nn.functional.gelu(self.fc1(self.norm(x))))


class TinyGPT(nn.Module):
    """Token embedding, two pre-norm MLP blocks with residuals, a final norm and a head."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.layers = nn.ModuleList([Block(), Block()])
        self.norm = nn.LayerNorm(WIDTH)
        self.head = nn.Linear(WIDTH, VOCAB, bias=False)
        self._tp_plan = {"layers.*.fc1": "colwise", "layers.*.fc2": "rowwise"}  # transformers' convention

    def forward(self, ids):
        x = self.embed(ids)
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x))


def sequence_parallel_plan() -> dict:
    """Megatron-style TP + SP: the embedding and the head split too, norms on a slice of the sequence."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel

    return {"embed": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
            "layers.*.norm": SequenceParallel(),
            "layers.*.fc1": ColwiseParallel(input_layouts=Shard(1)),
            "layers.*.fc2": RowwiseParallel(output_layouts=Shard(1)),
            "norm": SequenceParallel(),
            "head": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate())}


def batches():
    generator = torch.Generator().manual_seed(5)
    return [torch.randint(0, VOCAB, (BATCH, SEQUENCE + 1), generator=generator) for _ in range(STEPS)]


def lm_loss(logits, tokens):
    return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))


def single_process(model) -> tuple:
    model = copy.deepcopy(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for tokens in batches():
        loss = lm_loss(forward_logits(model, tokens[:, :-1]), tokens)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses, {k: v.detach().clone() for k, v in model.state_dict().items()}


def forward_logits(model, ids):
    out = model(ids)
    return out.logits if hasattr(out, "logits") else out


def train_tp(model, plan=None, checkpointed: tuple = (), foreach=None) -> tuple:
    """``checkpointed``: blocks (by name) wrapped for activation checkpointing before ``prepare``, as a user may;
    ``foreach``: the optimizer's."""
    AcceleratorState._reset_state()
    handler = TorchTensorParallelConfig(tp_plan=plan) if plan is not None else None
    accelerator = Accelerator(cpu=True, parallelism_config=ParallelismConfig(tp_size=2, tp_handler=handler))
    model = copy.deepcopy(model)
    if checkpointed:
        from hasten.strategies.fsdp.wrapping import apply_activation_checkpointing

        apply_activation_checkpointing(model, [model.get_submodule(name) for name in checkpointed])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, foreach=foreach)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model, optimizer = accelerator.prepare(model, optimizer)
    if foreach:  # split layers are DTensors, the norms plain tensors: one list cannot take both
        check(any("foreach=True" in str(w.message) for w in caught) and not optimizer.param_groups[0]["foreach"],
              "a foreach optimizer over DTensors and plain tensors steps tensor by tensor, with a warning")
    check(type(accelerator.strategy).__name__ == "ModelParallelStrategy", f"strategy {accelerator.strategy}")
    losses, norms = [], []
    for tokens in batches():
        loss = lm_loss(forward_logits(model, tokens[:, :-1]), tokens)
        accelerator.backward(loss)
        norms.append(float(accelerator.clip_grad_norm_(model.parameters(), 1.0)))
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return accelerator, model, optimizer, losses, accelerator.get_state_dict(model)


def compare(accelerator, name: str, ours: tuple, reference: tuple) -> None:
    (losses, weights), (expected_losses, expected_weights) = ours, reference
    check(all(abs(a - b) <= LOSSES["atol"] + LOSSES["rtol"] * abs(b) for a, b in zip(losses, expected_losses)),
          f"{name}: losses {losses} vs single-process {expected_losses}")
    if accelerator.is_main_process:
        check(weights.keys() == expected_weights.keys(), f"{name}: keys {sorted(weights)}")
        for key, value in expected_weights.items():
            check(torch.allclose(weights[key].float(), value.float(), **WEIGHTS),
                  f"{name}: {key} differs by {(weights[key].float() - value.float()).abs().max():.2e}")
    say(accelerator, f"ok: {name} matches single-process training ({len(losses)} steps)")


def check_tiny_gpt(work: Path) -> None:
    set_seed(3)
    model = TinyGPT()
    reference = single_process(model)
    accelerator, prepared, optimizer, losses, weights = train_tp(model, sequence_parallel_plan())
    from torch.distributed.tensor import DTensor

    check(isinstance(prepared.layers[0].fc1.weight, DTensor), "fc1 is split")
    check(prepared.layers[0].fc1.weight.to_local().shape == (2 * WIDTH, WIDTH), "each rank holds half of fc1")
    compare(accelerator, "TP=2 + sequence parallelism (plan in the config)", (losses, weights), reference)
    accelerator.save_state(work / "tp_checkpoint")
    if accelerator.is_main_process:
        torch.save(weights, work / "tp_weights.pt")
    accelerator.wait_for_everyone()

    accelerator, prepared, _, losses, weights = train_tp(model)  # the model's own _tp_plan
    compare(accelerator, "TP=2 from the model's _tp_plan", (losses, weights), reference)


def check_loss_parallel() -> None:
    """A "loss_parallel" head: the logits stay split over the vocabulary, the loss runs on the shares."""
    from torch.distributed.tensor import DTensor, Shard

    set_seed(5)
    model = TinyGPT()
    reference = single_process(model)
    AcceleratorState._reset_state()
    plan = {"layers.*.fc1": "colwise", "layers.*.fc2": "rowwise", "head": "loss_parallel"}
    accelerator = Accelerator(cpu=True, parallelism_config=ParallelismConfig(
        tp_size=2, tp_handler=TorchTensorParallelConfig(tp_plan=plan)))
    prepared = copy.deepcopy(model)
    prepared, optimizer = accelerator.prepare(prepared, torch.optim.AdamW(prepared.parameters(), lr=1e-2))
    losses = []
    for tokens in batches():
        logits = prepared(tokens[:, :-1])
        check(isinstance(logits, DTensor) and logits.placements[0] == Shard(2) and
              logits.to_local().shape[-1] == VOCAB // 2, f"the logits stay split: {type(logits).__name__}")
        with accelerator.loss_parallel():
            loss = lm_loss(logits, tokens)
        accelerator.backward(loss)  # in loss_parallel by itself
        accelerator.clip_grad_norm_(prepared.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.full_tensor().item() if isinstance(loss, DTensor) else loss.item())
    compare(accelerator, "TP=2 with a loss-parallel head", (losses, accelerator.get_state_dict(prepared)), reference)


def check_llama() -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=VOCAB * 2, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    set_seed(4)
    model = LlamaForCausalLM(config)
    reference = single_process(model)
    accelerator, prepared, _, losses, weights = train_tp(model, checkpointed=("model.layers.0", "model.layers.1"),
                                                         foreach=True)
    from torch.distributed.tensor import DTensor

    check(isinstance(prepared.model.layers[0].self_attn.q_proj.weight, DTensor), "q_proj is split")
    compare(accelerator, "transformers Llama TP=2 from its base_model_tp_plan (its layers checkpointed before "
            "prepare; a foreach AdamW)", (losses, weights), reference)


def expect_error(function, *fragments) -> None:
    try:
        function()
    except (ValueError, TypeError, NotImplementedError) as error:
        missing = [f for f in fragments if f not in str(error)]
        check(not missing, f"the error {error} does not say {missing}")
        return
    check(False, f"no error; expected one saying {fragments}")


def check_bad_plans() -> None:
    def prepare_with(plan, model=None):
        AcceleratorState._reset_state()
        config = ParallelismConfig(tp_size=2, tp_handler=TorchTensorParallelConfig(tp_plan=plan))
        accelerator = Accelerator(cpu=True, parallelism_config=config)
        target = model if model is not None else TinyGPT()
        return accelerator.prepare(target, torch.optim.SGD(target.parameters(), lr=0.1))

    expect_error(lambda: prepare_with({"blocks.*.fc1": "colwise"}), "'blocks.*.fc1'", "matches no module",
                 "layers.0.fc1")
    expect_error(lambda: prepare_with({"layers.*.fc1": "diagonal"}), "'diagonal'", "colwise")
    odd = nn.Sequential(nn.Linear(4, 3), nn.Linear(3, 2))
    expect_error(lambda: prepare_with({"0": "colwise"}, odd), "3 output features", "tp_size=2")
    plain = nn.Sequential(nn.Linear(4, 4))
    AcceleratorState._reset_state()
    accelerator = Accelerator(cpu=True, parallelism_config=ParallelismConfig(tp_size=2))
    expect_error(lambda: accelerator.prepare(plain, torch.optim.SGD(plain.parameters(), lr=0.1)),
                 "no tensor-parallel plan", "tp_plan")
    say(accelerator, "ok: bad plans are refused with the reason")


def check_tp_plugin_mesh() -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor

    from hasten.utils import TorchTensorParallelPlugin

    mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("tp",))
    AcceleratorState._reset_state()
    accelerator = Accelerator(cpu=True, torch_tp_plugin=TorchTensorParallelPlugin(tp_size=2, torch_device_mesh=mesh))
    weight = accelerator.prepare(TinyGPT()).layers[0].fc1.weight  # split by the model's own _tp_plan
    check(accelerator.strategy.layout.built_mesh is mesh, "the plugin's mesh is the run's")
    check(isinstance(weight, DTensor) and weight.device_mesh == mesh, "the plugin's mesh splits the model")
    rows = init_device_mesh("cpu", (2,), mesh_dim_names=("rows",))
    AcceleratorState._reset_state()
    expect_error(lambda: Accelerator(cpu=True, torch_tp_plugin=TorchTensorParallelPlugin(tp_size=2,
                                                                                         torch_device_mesh=rows)),
                 "torch_device_mesh has dimensions ('rows',)", "('tp',)")
    AcceleratorState._reset_state()
    expect_error(lambda: Accelerator(cpu=True, torch_tp_plugin=TorchTensorParallelPlugin(tp_size=1,
                                                                                         torch_device_mesh=mesh)),
                 "tp_size=1", "size 2")
    AcceleratorState._reset_state()  # the refused plugin stays in the state (issue 38: register the run once valid)
    say(Accelerator(cpu=True), "ok: the tp plugin's mesh is used, and one of another layout is refused")


def main(work: Path) -> None:
    check_tiny_gpt(work)
    check_loss_parallel()
    check_llama()
    check_bad_plans()
    check_tp_plugin_mesh()
    say(Accelerator(cpu=True), "MODEL PARALLEL CHECKS PASSED")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
