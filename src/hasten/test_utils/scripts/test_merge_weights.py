"""Merging a sharded FSDP checkpoint into one weights file (Accelerate's multi-device suite launches this file,
``test_utils/scripts/test_merge_weights.py``), on two or more processes.

A small model is trained for a few steps under FSDP (FULL_SHARD, ``SHARDED_STATE_DICT``, wrapped by size), saved
with ``save_fsdp_model`` (one ``torch.distributed.checkpoint`` folder, ``pytorch_model_fsdp_0``), then merged four
ways: ``merge_fsdp_weights`` and the ``merge-weights`` command, each to ``model.safetensors`` and to
``pytorch_model.bin``. Each merged file, loaded into a fresh model, must give exactly the trained weights (and the
fresh model must differ before, so the comparison means something). Both FSDP versions are checked (FSDP1's sharded
state dict and FSDP2's DTensor one); ``--fsdp_version 1`` or ``2`` checks one. Run: ``hasten launch -n 2 <this file>``.
"""
from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file
from torch.utils.data import DataLoader

from hasten.accelerator import Accelerator
from hasten.collectives.operations import broadcast_object_list
from hasten.commands.merge import merge_command, merge_command_parser
from hasten.config.fsdp import FullyShardedDataParallelPlugin
from hasten.state import AcceleratorState, PartialState
from hasten.strategies.fsdp.checkpoint_files import save_fsdp_model
from hasten.strategies.fsdp.functions import merge_fsdp_weights
from hasten.test_utils.training import RegressionDataset


class TwoLayers(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear1 = torch.nn.Linear(16, 16)
        self.activation = torch.nn.ReLU()
        self.linear2 = torch.nn.Linear(16, 16)

    def forward(self, x):
        return self.linear2(self.activation(self.linear1(x)))


def train_briefly(accelerator: Accelerator, model) -> None:
    """Three epochs of regression on ``x`` broadcast to 16 features, so the weights leave their initial values."""
    loader = DataLoader(RegressionDataset(length=128, seed=42), batch_size=16)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader, model, optimizer = accelerator.prepare(loader, model, optimizer)
    for _ in range(3):
        for batch in loader:
            optimizer.zero_grad()
            inputs = batch["x"][:, None].expand(-1, 16)
            loss = torch.nn.functional.mse_loss(model(inputs), batch["y"][:, None].expand(-1, 16))
            accelerator.backward(loss)
            optimizer.step()


def expect_trained_weights(weights: dict, trained: dict, how: str) -> None:
    fresh = TwoLayers()
    assert any(not torch.equal(fresh.state_dict()[name], trained[name]) for name in trained), (
        f"{how}: a fresh model already has the trained weights; the check would mean nothing")
    fresh.load_state_dict(weights)
    for name, value in fresh.state_dict().items():
        torch.testing.assert_close(value, trained[name], rtol=0, atol=0, msg=f"{how}: {name} differs")


def check_version(fsdp_version: int, folder: Path) -> None:
    plugin = FullyShardedDataParallelPlugin(
        fsdp_version=fsdp_version, state_dict_type="SHARDED_STATE_DICT",  # FULL_SHARD by default
        auto_wrap_policy="size_based_wrap", min_num_params=100)
    accelerator = Accelerator(fsdp_plugin=plugin)
    model = accelerator.prepare(TwoLayers())
    train_briefly(accelerator, model)
    trained = [{name: value.cpu() for name, value in accelerator.get_state_dict(model).items()}]
    broadcast_object_list(trained)  # the full weights as the main process gathered them
    trained = trained[0]
    save_fsdp_model(plugin, accelerator, model, folder)
    accelerator.wait_for_everyone()
    shards = folder / "pytorch_model_fsdp_0"
    safetensors_file, bin_file = folder / "model.safetensors", folder / "pytorch_model.bin"
    parser = merge_command_parser()
    for how, merge, target, read in (
        ("merge_fsdp_weights -> safetensors", lambda: merge_fsdp_weights(shards, folder, safe_serialization=True),
         safetensors_file, load_file),
        ("merge-weights command -> safetensors", lambda: merge_command(parser.parse_args([str(shards), str(folder)])),
         safetensors_file, load_file),
        ("merge_fsdp_weights -> bin", lambda: merge_fsdp_weights(shards, folder, safe_serialization=False),
         bin_file, lambda path: torch.load(path, weights_only=True)),
        ("merge-weights command -> bin",
         lambda: merge_command(parser.parse_args([str(shards), str(folder), "--unsafe_serialization"])),
         bin_file, lambda path: torch.load(path, weights_only=True)),
    ):
        accelerator.wait_for_everyone()  # every process has read the file the last merge wrote
        if accelerator.is_main_process:
            target.unlink(missing_ok=True)
        accelerator.wait_for_everyone()
        merge()  # every process calls it: the main one writes, the others wait
        expect_trained_weights(read(target), trained, f"FSDP{fsdp_version}, {how}")
        accelerator.print(f"FSDP{fsdp_version}: {how}: the trained weights")
    accelerator.wait_for_everyone()


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description="Merge sharded FSDP checkpoints and compare with the model.")
    parser.add_argument("--fsdp_version", type=int, choices=(1, 2), nargs="+", default=[1, 2])
    parser.add_argument("--output_dir", type=Path, default=Path("test_merge_weights_fsdp_weights"),
                        help="a folder every process sees (removed at the end)")
    args = parser.parse_args(argv)
    state = PartialState()
    if state.num_processes < 2:
        raise SystemExit("test_merge_weights needs two or more processes: hasten launch -n 2 test_merge_weights.py")
    try:
        for fsdp_version in args.fsdp_version:
            if AcceleratorState._shared_state:
                AcceleratorState._reset_state()
            check_version(fsdp_version, args.output_dir / f"fsdp{fsdp_version}")
    finally:
        state.wait_for_everyone()
        if state.is_main_process:
            shutil.rmtree(args.output_dir, ignore_errors=True)
    state.print("MERGE WEIGHTS PASSED")
    state.destroy_process_group()


if __name__ == "__main__":
    main()
