"""Writes the checkpoint-format fixtures that tests/checkpointing/test_format_fixtures.py loads: one ``save_state``
folder per format hasten writes, kept in the repository so that a change to a format's code that stops reading the
folders already on users' disks fails a test.

    python tests/checkpointing/make_format_fixtures.py OUT                          # one process: the full-state files
    hasten launch -n 2 tests/checkpointing/make_format_fixtures.py OUT fsdp         # FSDP2 SHARDED_STATE_DICT (DCP)
    hasten launch -n 2 tests/checkpointing/make_format_fixtures.py OUT deepspeed    # DeepSpeed ZeRO-2 engine folders

Each run trains ``tiny_model()`` two steps with SGD and writes ``OUT/<format>/checkpoint`` and the full weights it
holds, ``OUT/<format>/weights.pt``. DeepSpeed copies its recovery scripts (``zero_to_fp32.py`` ...) into every
checkpoint; they are DeepSpeed's code, not a format, so they are taken out of the fixture and of its marker. Run
again only to add a new format: the folders already there are the formats of their day (their date is in the folder
name the test reads).
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch import nn


def tiny_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def main(out: Path, kind: str) -> None:
    from hasten import Accelerator
    from hasten.utils import DeepSpeedPlugin, FullyShardedDataParallelPlugin

    plugins = {"full": {},
               "fsdp": {"fsdp_plugin": FullyShardedDataParallelPlugin(fsdp_version=2,
                                                                      state_dict_type="SHARDED_STATE_DICT")},
               "deepspeed": {"deepspeed_plugin": DeepSpeedPlugin(zero_stage=2, gradient_accumulation_steps=1)}}
    accelerator = Accelerator(cpu=True, **plugins[kind])
    model = tiny_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(16, 8), torch.randn(16, 4)),
                                         batch_size=4)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for step, (inputs, targets) in enumerate(loader):
        if step == 2:
            break
        loss = nn.functional.mse_loss(model(inputs), targets)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
    folder = out / kind
    accelerator.save_state(folder / "checkpoint")
    weights = accelerator.get_state_dict(model)
    if accelerator.is_main_process:
        torch.save({name: tensor.detach().clone() for name, tensor in weights.items()}, folder / "weights.pt")
        _drop_copied_scripts(folder / "checkpoint")
    accelerator.wait_for_everyone()


def _drop_copied_scripts(checkpoint: Path) -> None:
    """Remove the ``.py`` files a library copied into ``checkpoint`` (and their lines in its completion marker)."""
    import json

    scripts = sorted(path.name for path in checkpoint.glob("*.py"))
    if not scripts:
        return
    marker_path = checkpoint / "hasten_checkpoint.json"
    marker = json.loads(marker_path.read_text())
    marker["files"] = {name: size for name, size in marker["files"].items() if name not in scripts}
    marker["checksums"] = {name: value for name, value in marker["checksums"].items() if name not in scripts}
    marker_path.write_text(json.dumps(marker, indent=1, sort_keys=True))
    for name in scripts:
        (checkpoint / name).unlink()


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else "full")
