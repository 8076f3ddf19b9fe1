"""Run with `hasten launch -n 2`: the Accelerator's training loop across real processes.

Checks that a DDP run with accumulation, clipping and a scheduler ends at the parameters plain single-process
PyTorch reaches on the same samples; gather_for_metrics counts each evaluation sample once; no_sync keeps
gradients local; triggers, Join with uneven inputs, token-level loss normalisation and LocalSGD work.
"""
import copy
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from hasten import Accelerator, LocalSGD
from hasten.config.kwargs import DistributedDataParallelKwargs
from hasten.state import AcceleratorState, GradientState

SAMPLES, BATCH, ACCUMULATION, CLIP = 48, 3, 2, 0.5


def reset():
    AcceleratorState._reset_state()
    GradientState._reset_state()


def make_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Dropout(0.0), nn.Linear(16, 1))


def dataset():
    g = torch.Generator().manual_seed(123)
    return TensorDataset(torch.randn(SAMPLES, 4, generator=g), torch.randn(SAMPLES, 1, generator=g))


def make_optimizer(model):
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.05, weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (1 + step))
    return optimizer, scheduler


def reference_training(n, precision):
    """Single-process PyTorch: each optimizer step sees the batches the n processes saw in one cycle."""
    model = make_model()
    optimizer, scheduler = make_optimizer(model)
    data = dataset()
    batches = [data[i:i + BATCH] for i in range(0, SAMPLES, BATCH)]
    per_step = n * ACCUMULATION
    for start in range(0, len(batches), per_step):
        group = batches[start:start + per_step]
        x = torch.cat([b[0] for b in group])
        y = torch.cat([b[1] for b in group])
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            out = model(x)
        nn.functional.mse_loss(out.float(), y).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        optimizer.step()
        for _ in range(n):  # the prepared scheduler advances once per process
            scheduler.step()
        optimizer.zero_grad()
    return model, scheduler.get_last_lr()[0]


def check_training_matches_reference(precision):
    reset()
    accelerator = Accelerator(gradient_accumulation_steps=ACCUMULATION, mixed_precision=precision)
    model = make_model()
    optimizer, scheduler = make_optimizer(model)
    loader = DataLoader(dataset(), batch_size=BATCH)
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    for x, y in loader:
        with accelerator.accumulate(model):
            loss = nn.functional.mse_loss(model(x), y)
            accelerator.backward(loss)
            if accelerator.sync_gradients:
                accelerator.clip_grad_norm_(model.parameters(), CLIP)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
    expected, expected_lr = reference_training(accelerator.num_processes, precision)
    tolerance = dict(rtol=1e-4, atol=1e-5) if precision == "no" else dict(rtol=2e-2, atol=2e-3)
    for a, b in zip(expected.parameters(), accelerator.unwrap_model(model).parameters()):
        torch.testing.assert_close(b, a, **tolerance)
    assert abs(scheduler.get_last_lr()[0] - expected_lr) < 1e-12, (scheduler.get_last_lr(), expected_lr)
    # every process holds the same parameters
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    everyone = [torch.empty_like(flat) for _ in range(accelerator.num_processes)]
    dist.all_gather(everyone, flat)
    assert all(torch.equal(everyone[0], other) for other in everyone[1:])


def check_gather_for_metrics():
    reset()
    accelerator = Accelerator()
    for length, batch in ((13, 4), (5, 4), (16, 4), (1, 3)):
        loader = accelerator.prepare(DataLoader(list(range(length)), batch_size=batch))
        seen, names = [], []
        for values in loader:
            seen.append(accelerator.gather_for_metrics(values))
            names.extend(accelerator.gather_for_metrics([f"s{int(v)}" for v in values]))
        assert torch.cat(seen).tolist() == list(range(length)), (length, torch.cat(seen).tolist())
        assert names == [f"s{i}" for i in range(length)], names


def check_no_sync_keeps_gradients_local():
    reset()
    accelerator = Accelerator(gradient_accumulation_steps=2)
    model = accelerator.prepare(make_model())
    rank = accelerator.process_index
    x = torch.full((2, 4), float(rank + 1))
    grads = []
    for _ in range(2):
        with accelerator.accumulate(model):
            accelerator.backward(model(x).sum())
            grads.append((accelerator.sync_gradients, model.module[0].weight.grad.clone()))
    (first_sync, local), (second_sync, synced) = grads
    assert not first_sync and second_sync
    gathered = [torch.empty_like(local) for _ in range(accelerator.num_processes)]
    dist.all_gather(gathered, local)
    assert not torch.allclose(gathered[0], gathered[1]), "accumulating batches must not all-reduce"
    dist.all_gather(gathered, synced)
    assert torch.allclose(gathered[0], gathered[1]), "the last batch of a cycle must all-reduce"


def check_evaluation_mode_and_state_dict():
    reset()
    accelerator = Accelerator()
    model = make_model()
    evaluated = accelerator.prepare_model(model, evaluation_mode=True)
    assert not isinstance(evaluated, nn.parallel.DistributedDataParallel)
    trained = accelerator.prepare(make_model())
    assert isinstance(trained, nn.parallel.DistributedDataParallel)
    state = accelerator.get_state_dict(trained)
    assert set(state) == set(make_model().state_dict()) and not any(k.startswith("module.") for k in state)
    assert all(k.startswith("module.") for k in accelerator.get_state_dict(trained, unwrap=False))


def check_trigger():
    reset()
    accelerator = Accelerator()
    assert not accelerator.check_trigger()
    if accelerator.process_index == accelerator.num_processes - 1:
        accelerator.set_trigger()
    assert accelerator.check_trigger()
    assert not accelerator.check_trigger()


def check_join_uneven_inputs():
    reset()
    accelerator = Accelerator()
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    model, optimizer = accelerator.prepare(model, optimizer)
    steps = 3 + 2 * accelerator.process_index  # different numbers of batches per process
    with accelerator.join_uneven_inputs([model]):
        for _ in range(steps):
            accelerator.backward(model(torch.randn(2, 4)).sum())
            optimizer.step()
            optimizer.zero_grad()
    loader = accelerator.prepare(DataLoader(list(range(5)), batch_size=1))
    with accelerator.join_uneven_inputs([model], even_batches=False):
        counts = len(list(loader))
    assert loader.batch_sampler.even_batches is True
    everyone = [None] * accelerator.num_processes
    dist.all_gather_object(everyone, counts)
    assert sum(everyone) == 5, everyone


def check_token_level_loss_across_processes():
    reset()
    accelerator = Accelerator(gradient_accumulation_steps=2)
    vocab, rank, n = 5, accelerator.process_index, accelerator.num_processes
    torch.manual_seed(7)
    labels_all = []
    for _ in range(n * 2):
        length = int(torch.randint(1, 6, ()))
        labels = torch.full((2, 6), -100)
        labels[:, :length] = torch.randint(0, vocab, (2, length))
        labels_all.append(labels)
    torch.manual_seed(0)
    embedding = nn.Embedding(vocab, vocab)
    big = copy.deepcopy(embedding)
    flat = torch.cat([m.reshape(-1) for m in labels_all])
    nn.functional.cross_entropy(big(flat.clamp(min=0)), flat, ignore_index=-100).backward()
    model = accelerator.prepare(copy.deepcopy(embedding))
    mine = labels_all[rank::n]
    total = accelerator.reduce(torch.tensor(sum(int((m != -100).sum()) for m in mine)), "sum")
    assert int(total) == int((flat != -100).sum())
    for labels in mine:
        with accelerator.accumulate(model):
            logits = model(labels.clamp(min=0))
            loss = nn.functional.cross_entropy(logits.reshape(-1, vocab), labels.reshape(-1), ignore_index=-100,
                                               reduction="sum")
            accelerator.backward(loss, num_items_in_batch=total)
    torch.testing.assert_close(model.module.weight.grad, big.weight.grad)


def check_local_sgd_and_comm_hook():
    reset()
    accelerator = Accelerator(kwargs_handlers=[DistributedDataParallelKwargs(comm_hook="fp16")])
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    rank = accelerator.process_index
    accelerator.backward(model(torch.full((2, 4), float(rank))).sum())  # fp16-compressed all-reduce (bf16 needs NCCL)
    optimizer.step()
    optimizer.zero_grad()
    with LocalSGD(accelerator, model, local_sgd_steps=2) as local_sgd:
        for step in range(3):
            accelerator.backward(model(torch.full((2, 4), float(rank + step))).sum())
            optimizer.step()
            optimizer.zero_grad()
            local_sgd.step()
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    everyone = [torch.empty_like(flat) for _ in range(accelerator.num_processes)]
    dist.all_gather(everyone, flat)
    torch.testing.assert_close(everyone[0], everyone[1])  # averaged when the block ended


def main():
    check_training_matches_reference("no")
    check_training_matches_reference("bf16")
    check_gather_for_metrics()
    check_no_sync_keeps_gradients_local()
    check_trigger()
    check_evaluation_mode_and_state_dict()
    check_join_uneven_inputs()
    check_token_level_loss_across_processes()
    check_local_sgd_and_comm_hook()
    AcceleratorState().print(f"check_training OK on {AcceleratorState().num_processes} processes")


if __name__ == "__main__":
    sys.exit(main())
