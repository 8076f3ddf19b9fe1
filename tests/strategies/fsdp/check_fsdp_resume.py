"""FSDP2 with a real Transformers model and exact resume from a sharded checkpoint (2 processes).

Run by tests/strategies/fsdp/test_fsdp.py under ``hasten launch -n 2``:

1. a GPT-2 built from a tiny config (no download) is wrapped by ``transformer_based_wrap`` through the model's own
   ``_no_split_modules`` (every GPT2Block its own unit) and trains;
2. exact resume: train 3 steps, ``save_state`` (sharded), train 3 more and record their losses; then, with fresh
   objects (a new Accelerator), ``load_state`` and train the same 3 steps: the losses are bitwise equal, and so are
   the final weights.

Prints FSDP RESUME CHECKS PASSED.
"""
import sys
from pathlib import Path

import torch
from torch.distributed.fsdp import FSDPModule
from torch.utils.data import DataLoader

from hasten import Accelerator, FullyShardedDataParallelPlugin
from hasten.state import AcceleratorState
from hasten.utils import set_seed


def check(condition: bool, what: str) -> None:
    if not condition:
        raise AssertionError(f"[rank {torch.distributed.get_rank()}] {what}")


def build():
    from transformers import GPT2Config, GPT2LMHeadModel

    AcceleratorState._reset_state()
    accelerator = Accelerator(cpu=True, fsdp_plugin=FullyShardedDataParallelPlugin(
        fsdp_version=2, auto_wrap_policy="transformer_based_wrap"))
    set_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=32,
                                       bos_token_id=0, eos_token_id=0))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    tokens = torch.randint(0, 100, (48, 16), generator=torch.Generator().manual_seed(3))
    loader = DataLoader(tokens, batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(5))
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    return accelerator, model, optimizer, loader


def train(accelerator, model, optimizer, batches, steps: int) -> list:
    losses = []
    for _ in range(steps):
        ids = next(batches)
        loss = model(input_ids=ids, labels=ids).loss
        accelerator.backward(loss)
        accelerator.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.detach().clone())
    return losses


def save_pretrained_everywhere_and_on_the_main_process(accelerator, model, expected: dict, work: Path) -> None:
    """unwrap_model(model).save_pretrained(folder) with DTensor parameters (strategies/fsdp/save_pretrained.py)."""
    import os

    from transformers import GPT2LMHeadModel

    from hasten.strategies.fsdp.save_pretrained import SavePretrainedOnOneProcessError

    unwrapped = accelerator.unwrap_model(model)
    unwrapped.save_pretrained(work / "pretrained")  # every process: gathered, written by the main process
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        loaded = GPT2LMHeadModel.from_pretrained(work / "pretrained").state_dict()
        check(all(torch.equal(loaded[k], expected[k]) for k in expected), "save_pretrained wrote the full weights")
        os.environ["HASTEN_SAVE_PRETRAINED_JOIN_TIMEOUT"] = "0.5"
        try:
            unwrapped.save_pretrained(work / "main-only")  # the others never call it: they hold the other shards
        except SavePretrainedOnOneProcessError as error:
            check("every process must call it" in str(error), str(error))
        else:
            check(False, "a save_pretrained on the main process only of a sharded model did not stop")
        unwrapped.save_pretrained(work / "given", state_dict=expected)  # the library's own method, on one process
        check((work / "given" / "model.safetensors").is_file() and not (work / "main-only").exists(),
              "save_pretrained(state_dict=...) writes as the library does; the refused call wrote nothing")
    accelerator.wait_for_everyone()
    print("ok: save_pretrained of the FSDP2 model, on every process and on the main process only", flush=True)


def main(work: Path) -> None:
    accelerator, model, optimizer, loader = build()
    blocks = list(model.transformer.h)  # the GPT2Block layers
    check(len(blocks) == 2 and all(isinstance(block, FSDPModule) for block in blocks),
          "transformer_based_wrap through _no_split_modules: each GPT2Block is a unit")
    batches = iter(loader)
    train(accelerator, model, optimizer, batches, 3)
    accelerator.save_state(work / "resume")
    expected = train(accelerator, model, optimizer, batches, 3)
    expected_weights = accelerator.get_state_dict(model)
    print("ok: GPT-2 wrapped by its _no_split_modules trains", flush=True)
    save_pretrained_everywhere_and_on_the_main_process(accelerator, model, expected_weights, work)

    accelerator, model, optimizer, loader = build()  # a fresh run: new objects, new random state
    torch.manual_seed(1234)
    accelerator.load_state(work / "resume")
    resumed = train(accelerator, model, optimizer, iter(loader), 3)
    check(all(torch.equal(a, b) for a, b in zip(expected, resumed)),
          f"resumed losses {[x.item() for x in resumed]} differ from {[x.item() for x in expected]}")
    weights = accelerator.get_state_dict(model)
    if accelerator.is_main_process:
        check(all(torch.equal(weights[k], expected_weights[k]) for k in expected_weights), "final weights differ")
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        print("FSDP RESUME CHECKS PASSED", flush=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
