"""Pipeline parallelism on 2 processes (gloo, CPU), run by tests/strategies/model_parallel/test_pipeline.py: ``hasten launch -n 2``.

A tiny GPT (token embedding, 4 residual MLP blocks, LayerNorm, head; built here, nothing downloaded) trains
``STEPS`` steps (SGD with momentum, or AdamW; see ``RUNS``) on a fixed dataset under each schedule of ``RUNS`` (GPipe and 1F1B on 2 stages, interleaved
1F1B on 4 virtual stages over the 2 ranks, 4 micro-batches each), and every rank checks against the same training
on one process (which it runs itself, it is tiny):

- the loss of every step, which ``step`` returns on both ranks, within ``TOLERANCE``;
- the final parameters of both stages, gathered, within ``TOLERANCE`` (and no parameter missing or extra);
- ``eval_step`` outputs, half way and at the end, equal to the one-process forward (the pipeline goes from
  training to evaluation and back).

Then every bad input raises ``ValueError`` on one rank alone with every collective and point-to-point call
replaced by one that fails, so the error is proven to come before any communication. Prints one line per check
with ONE os.write (the ranks' lines never interleave) and, on the main rank, ``PIPELINE CHECKS PASSED``.
"""
from __future__ import annotations

import contextlib
import os
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import init_device_mesh

from hasten.strategies.model_parallel.pipeline import build_pipeline, split_model
from hasten.state import PartialState

VOCAB, DIM, SEQ, BATCH, MICRO_BATCHES, STEPS, LR = 32, 16, 8, 8, 4, 20, 1e-2
# float32 on CPU: the pipeline adds the micro-batches' gradients where one process takes the batch's mean at once,
# so only the order of the float additions differs: losses, eval outputs and SGD weights within TOLERANCE. AdamW
# divides by sqrt(v), so for a coordinate whose gradient is near zero a last-bit difference moves the update by a
# fraction of the learning rate (1.6e-6 seen after 20 steps at lr 1e-2): its weights within ADAMW_WEIGHTS.
TOLERANCE = dict(rtol=1e-5, atol=1e-6)
ADAMW_WEIGHTS = dict(rtol=1e-5, atol=1e-5)
OPTIMIZERS = {"sgd": lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9),
              "adamw": lambda params: torch.optim.AdamW(params, lr=LR)}
# name -> (schedule, number of stages, split points or None for an even split by parameter count, optimizer, how
# the pipeline group is given: None for every process, "mesh" for a 1-D DeviceMesh ``pp``, "group" for a new group)
RUNS = {"gpipe": ("gpipe", 2, None, "sgd", None), "1f1b": ("1f1b", 2, ["blocks.2"], "adamw", "group"),
        "interleaved_1f1b": ("interleaved_1f1b", 4, None, "adamw", "mesh")}


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(DIM, 2 * DIM), nn.Linear(2 * DIM, DIM)

    def forward(self, hidden):
        return hidden + self.fc2(F.gelu(self.fc1(hidden)))


class TinyGPT(nn.Module):
    """embedding -> blocks -> norm -> head: a straight chain over its children, as split_model asks."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.blocks = nn.ModuleList(Block() for _ in range(4))
        self.norm = nn.LayerNorm(DIM)
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, tokens):
        hidden = self.embed(tokens)
        for block in self.blocks:
            hidden = block(hidden)
        return self.head(self.norm(hidden))


def make_model() -> TinyGPT:
    torch.manual_seed(0)
    return TinyGPT()


def loss_fn(logits, target):
    return F.cross_entropy(logits.reshape(-1, VOCAB), target.reshape(-1))


def dataset():
    """Four fixed batches of next-token pairs, cycled over the steps."""
    generator = torch.Generator().manual_seed(1234)
    tokens = torch.randint(0, VOCAB, (4, BATCH, SEQ + 1), generator=generator)
    return [(batch[:, :-1], batch[:, 1:]) for batch in tokens]


def say(line: str) -> None:
    os.write(1, (f"[rank {dist.get_rank()}] {line}\n").encode())


def check(condition: bool, what: str) -> None:
    if not condition:
        raise AssertionError(f"[rank {dist.get_rank()}] {what}")


def reference_run(optimizer_name: str):
    """Single-process training: the losses, the eval outputs half way and at the end, the final weights."""
    model, data = make_model(), dataset()
    optimizer = OPTIMIZERS[optimizer_name](model.parameters())
    losses, evals = [], []
    for step in range(STEPS):
        inputs, target = data[step % len(data)]
        loss = loss_fn(model(inputs), target)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
        if step in (STEPS // 2, STEPS - 1):
            with torch.no_grad():
                evals.append(model(data[0][0]))
    return losses, evals, {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}


def pipeline_run(name: str, reference) -> None:
    schedule, num_stages, split_points, optimizer_name, group = RUNS[name]
    rank = dist.get_rank()
    model, data = make_model(), dataset()
    stages = split_model(model, num_stages, split_points, example_input=data[0][0])
    if group == "mesh":
        group = init_device_mesh("cpu", (2,), mesh_dim_names=("pp",))
    elif group == "group":
        group = dist.new_group([0, 1])
    pipe = build_pipeline(stages, rank, group, schedule=schedule, num_micro_batches=MICRO_BATCHES, loss_fn=loss_fn,
                          device="cpu")
    check(pipe.stage_indices == list(range(rank, num_stages, 2)), f"{name}: stages {pipe.stage_indices}")
    named = dict(pipe.named_parameters())
    check(set(named) == set(pipe.state_dict()) and list(named.values()) == list(pipe.parameters()),
          f"{name}: named_parameters {sorted(named)} are not this rank's parameters")
    optimizer = OPTIMIZERS[optimizer_name](pipe.parameters())
    ref_losses, ref_evals, ref_state = reference
    evals = []
    for step in range(STEPS):
        inputs, target = data[step % len(data)]
        loss = pipe.step(inputs, target)  # both ranks pass the batch; each uses what its stages need
        optimizer.step()
        optimizer.zero_grad()
        check(loss is not None and loss.dim() == 0, f"{name}: step {step} returned {loss!r} on rank {rank}")
        check(torch.allclose(loss, torch.tensor(ref_losses[step]), **TOLERANCE),
              f"{name}: step {step} loss {loss.item()} != one process {ref_losses[step]}")
        if step in (STEPS // 2, STEPS - 1):
            evals.append(pipe.eval_step(data[0][0]))
    say(f"ok: {name} ({optimizer_name}) losses of {STEPS} steps match one process (first {ref_losses[0]:.6f}, "
        f"last {ref_losses[-1]:.6f})")
    for got, expected in zip(evals, ref_evals):
        if pipe.is_last:
            check(got is not None and got.shape == expected.shape and torch.allclose(got, expected, **TOLERANCE),
                  f"{name}: eval_step outputs differ from the one-process forward")
        else:
            check(got is None, f"{name}: eval_step returned outputs on a rank without the last stage")
    say(f"ok: {name} eval_step {'outputs match' if pipe.is_last else 'returns None off'} the last stage")
    parts = [None] * dist.get_world_size()
    dist.all_gather_object(parts, {key: value.detach().clone() for key, value in pipe.state_dict().items()})
    gathered = {}
    for part in parts:
        check(not set(part) & set(gathered), f"{name}: a parameter is owned by two ranks: {set(part) & set(gathered)}")
        gathered.update(part)
    check(set(gathered) == set(ref_state), f"{name}: gathered keys {sorted(gathered)} != {sorted(ref_state)}")
    worst = max((gathered[key] - ref_state[key]).abs().max().item() for key in ref_state)
    weights = ADAMW_WEIGHTS if optimizer_name == "adamw" else TOLERANCE
    for key, expected in ref_state.items():
        check(torch.allclose(gathered[key], expected, **weights), f"{name}: final {key} differs from one process")
    say(f"ok: {name} final parameters of both ranks match one process (largest difference {worst:.2e})")


FORBIDDEN = ("broadcast", "all_reduce", "all_gather", "all_gather_object", "broadcast_object_list", "barrier",
             "send", "recv", "isend", "irecv", "batch_isend_irecv", "send_object_list", "recv_object_list",
             "new_group", "reduce", "gather", "scatter")


@contextlib.contextmanager
def no_communication():
    """Every collective / point-to-point call of torch.distributed fails while inside."""
    saved = {name: getattr(dist, name) for name in FORBIDDEN}

    def refuse(*args, **kwargs):
        raise AssertionError("communicated before raising")

    try:
        for name in FORBIDDEN:
            setattr(dist, name, refuse)
        yield
    finally:
        for name, function in saved.items():
            setattr(dist, name, function)


def expect_error(label: str, call, *fragments) -> None:
    with no_communication():
        try:
            call()
        except ValueError as error:
            message = str(error)
        else:
            raise AssertionError(f"[rank {dist.get_rank()}] {label}: no ValueError")
    for fragment in fragments:
        check(fragment in message, f"{label}: {fragment!r} not in {message!r}")
    say(f"ok: {label} raises before any communication")


def loss_on_the_last_stage_only() -> None:
    """``broadcast_loss=False``: the loss stays on the rank of the last stage."""
    inputs, target = dataset()[0]
    pipe = build_pipeline(split_model(make_model(), 2), dist.get_rank(), None, num_micro_batches=MICRO_BATCHES,
                          loss_fn=loss_fn, broadcast_loss=False)
    loss = pipe.step(inputs, target)
    expected = loss_fn(make_model()(inputs), target)
    if pipe.is_last:
        check(loss is not None and torch.allclose(loss, expected, **TOLERANCE), f"loss {loss} != {expected}")
    else:
        check(loss is None, f"broadcast_loss=False returned {loss!r} off the last stage")
    say(f"ok: broadcast_loss=False gives {'the loss' if pipe.is_last else 'None'} on this rank")


def bad_inputs() -> None:
    rank = dist.get_rank()
    two_d = init_device_mesh("cpu", (2, 1), mesh_dim_names=("pp", "tp"))
    stages2, stages3, stages4 = (split_model(make_model(), n) for n in (2, 3, 4))
    inputs, target = dataset()[0]
    uneven = build_pipeline(stages2, rank, None, schedule="gpipe", num_micro_batches=3, loss_fn=loss_fn)
    expect_error("a batch of 8 in 3 micro-batches", lambda: uneven.step(inputs, target),
                 "num_micro_batches=3", "multiple of 3")
    if uneven.is_first:
        expect_error("eval_step on a batch of 8 in 3 micro-batches", lambda: uneven.eval_step(inputs),
                     "num_micro_batches=3")
    expect_error("1f1b with fewer micro-batches than stages",
                 lambda: build_pipeline(stages2, rank, None, schedule="1f1b", num_micro_batches=1, loss_fn=loss_fn),
                 "num_micro_batches=1 < 2")
    expect_error("an unknown schedule",
                 lambda: build_pipeline(stages2, rank, None, schedule="zero_bubble", num_micro_batches=4),
                 "'zero_bubble'", "['1f1b', 'gpipe', 'interleaved_1f1b']")
    expect_error("3 stages on 2 ranks", lambda: build_pipeline(stages3, rank, None, num_micro_batches=4),
                 "3 stage(s)", "2 pipeline rank(s) x 1 virtual")
    expect_error("4 stages for 2 ranks x 3 virtual stages",
                 lambda: build_pipeline(stages4, rank, None, schedule="interleaved_1f1b", num_micro_batches=4,
                                        virtual_stages=3), "4 stage(s)", "= 6")
    expect_error("a wrong rank_in_pp", lambda: build_pipeline(stages2, 1 - rank, None, num_micro_batches=4),
                 f"this process is rank {rank}")
    missing = build_pipeline(stages2, rank, None, schedule="1f1b", num_micro_batches=4, loss_fn=loss_fn)
    if missing.is_first:
        expect_error("step without inputs on the first stage", lambda: missing.step(None, target), "inputs")
    if missing.is_last:
        expect_error("step without a target on the last stage", lambda: missing.step(inputs, None), "target")
    expect_error("a 2-D mesh as pipeline group", lambda: build_pipeline(stages2, rank, two_d, num_micro_batches=4),
                 "2-D mesh", "mesh['pp']")
    no_loss = build_pipeline(stages2, rank, None, schedule="gpipe", num_micro_batches=4)
    if no_loss.is_last:
        expect_error("step without a loss_fn", lambda: no_loss.step(inputs, target), "loss_fn")
    shape_changes(rank, inputs, target)


def shape_changes(rank: int, inputs, target) -> None:
    """torch sets the stages' shapes from the first batch of a run of steps: another shape in the same run raises;
    switching between step and eval_step starts a new run with a new shape."""
    model = make_model()
    pipe = build_pipeline(split_model(model, 2), rank, None, schedule="1f1b", num_micro_batches=4, loss_fn=loss_fn)
    pipe.step(inputs, target)
    expect_error("a training batch of another shape", lambda: pipe.step(inputs[:4], target[:4]),
                 "shape [4, 8]", "from a batch of [8, 8]")
    for batch in (inputs[:4], inputs[:4]):
        outputs = pipe.eval_step(batch)
        if pipe.is_last:
            check(outputs.shape == (4, SEQ, VOCAB) and torch.allclose(outputs, model(batch), **TOLERANCE),
                  "eval_step after training on another batch shape")
    say("ok: eval_step takes a new batch shape after step")
    if pipe.is_first:
        expect_error("an eval batch of another shape", lambda: pipe.eval_step(torch.cat([inputs, inputs[:4]])),
                     "shape [12, 8]", "from a batch of [4, 8]")
    loss = pipe.step(inputs, target)
    check(torch.allclose(loss, loss_fn(model(inputs), target), **TOLERANCE), "step after eval_step")
    say("ok: step takes the training shape again after eval_step")


def main() -> None:
    PartialState()
    check(dist.get_world_size() == 2, f"run on 2 processes, not {dist.get_world_size()}")
    references = {name: reference_run(name) for name in OPTIMIZERS}
    for name, run in RUNS.items():
        began = time.perf_counter()
        pipeline_run(name, references[run[3]])
        say(f"time: {name} {time.perf_counter() - began:.2f}s")
    loss_on_the_last_stage_only()
    bad_inputs()
    dist.barrier()
    if dist.get_rank() == 0:
        os.write(1, b"PIPELINE CHECKS PASSED\n")


if __name__ == "__main__":
    main()
