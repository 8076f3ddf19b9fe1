"""Run with `hasten launch -n 2 check_async_save.py WORKDIR`: async saves while training continues with collectives.

Rank 1's background writer is slowed down, so the background threads agree on completion (on their own gloo
group) while the training loop's DDP all-reduces and `reduce` calls run on the default group. The async
checkpoint must hold the state of the moment save_state was called, byte for byte what a synchronous save
of that moment wrote, and load back to it.
"""
import sys
import time
from pathlib import Path

import torch
from safetensors.torch import load_file
from torch import nn

from hasten import Accelerator
from hasten.checkpointing import async_save, checkpoint_io


def main(work: Path) -> None:
    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.05)
    model, optimizer = accelerator.prepare(model, optimizer)
    if accelerator.process_index == 1:
        original = checkpoint_io.write_process_files

        def slow(*args, **kwargs):
            time.sleep(0.4)
            return original(*args, **kwargs)

        checkpoint_io.write_process_files = slow
    generator = torch.Generator().manual_seed(accelerator.process_index)

    def step():
        loss = model(torch.randn(8, 4, generator=generator)).pow(2).mean()
        accelerator.backward(loss)  # DDP all-reduce on the default group
        optimizer.step()
        optimizer.zero_grad()
        accelerator.reduce(loss.detach(), reduction="mean")  # one more collective

    expected = None
    for index in range(8):
        step()
        if index == 2:
            accelerator.save_state(work / "sync")
            accelerator.save_state(work / "async", async_save=True)
            expected = [p.detach().clone() for p in model.parameters()]
            assert async_save.pending() is not None, "the save returned only once written"
        if index in (3, 5, 6):
            accelerator.save_state(work / f"later_{index}", async_save=True)  # waits for the previous one first
    assert accelerator.wait_for_checkpoint() is not None
    accelerator.wait_for_everyone()

    sync, written = load_file(work / "sync" / "model.safetensors"), load_file(work / "async" / "model.safetensors")
    assert all(torch.equal(sync[key], written[key]) for key in sync)
    for name in ("optimizer.bin", f"random_states_{accelerator.process_index}.pkl"):
        a = torch.load(work / "sync" / name, weights_only=False)
        b = torch.load(work / "async" / name, weights_only=False)
        assert repr(a) == repr(b), name
    accelerator.load_state(work / "async")
    assert all(torch.equal(p, e) for p, e in zip(model.parameters(), expected))
    assert all((work / f"later_{index}" / "hasten_checkpoint.json").is_file() for index in (3, 5, 6))
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        print("ASYNC SAVE OK")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
