"""``hasten config``'s DeepSpeed questions; the answers become the ``deepspeed_config`` section (Accelerate's keys,
checked and exported by ``hasten launch``, see ``config/deepspeed_launch.py``)."""
from __future__ import annotations

import json
import os

from .questions import ask_bool, ask_choice, ask_float, ask_int, ask_text

__all__ = ["ask_deepspeed"]

_OFFLOAD = [("none: keep them on the GPU", "none"), ("cpu", "cpu"), ("nvme", "nvme")]


def _json_config(text: str) -> str:
    """The path of an existing DeepSpeed JSON config file with a ``zero_optimization`` section."""
    path = os.path.expanduser(text)
    if not os.path.isfile(path):
        raise ValueError(f"{path!r} does not exist (looked from {os.getcwd()}).")
    try:
        with open(path, encoding="utf-8") as handle:
            config = json.load(handle)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{path!r} is not a JSON file ({error}).") from None
    if not isinstance(config, dict) or not isinstance(config.get("zero_optimization"), dict):
        raise ValueError(f"{path!r} has no 'zero_optimization' section; DeepSpeed config files look like "
                         '{"zero_optimization": {"stage": 2}, ...}.')
    return os.path.abspath(path)


def _offload(deepspeed: dict, part: str, what: str) -> None:
    device = ask_choice(f"Where should {what} be offloaded?", _OFFLOAD)
    deepspeed[f"offload_{part}_device"] = device
    if device == "nvme":
        deepspeed[f"offload_{part}_nvme_path"] = ask_text(f"Folder on the NVMe drive for {what}")


def _zero(deepspeed: dict) -> None:
    stage = ask_choice("Which ZeRO stage? (each one shards more: 1 optimizer states, 2 + gradients, 3 + parameters)",
                       [(str(stage), stage) for stage in (0, 1, 2, 3)], default=2)
    deepspeed["zero_stage"] = stage
    if stage >= 2:
        _offload(deepspeed, "optimizer", "the optimizer states")
    if stage == 3:
        _offload(deepspeed, "param", "the parameters")
    deepspeed["gradient_accumulation_steps"] = ask_int("How many steps should gradients be accumulated over?", 1,
                                                       minimum=1)
    if ask_bool("Clip gradients by their norm?", False):
        deepspeed["gradient_clipping"] = ask_float("Largest gradient norm?", 1.0, minimum=0.0)
    if stage == 3:
        deepspeed["zero3_save_16bit_model"] = ask_bool("Gather and save 16-bit model weights when saving?", False)


def _machines(deepspeed: dict) -> None:
    launcher = ask_choice("How should the other machines be started?", [
        ("standard: run `hasten launch` on each machine yourself", "standard"),
        ("pdsh: DeepSpeed's runner starts them over ssh from this one", "pdsh"),
        ("openmpi", "openmpi"), ("mvapich", "mvapich"), ("mpich", "mpich"), ("slurm", "slurm"), ("nossh", "nossh")])
    deepspeed["deepspeed_multinode_launcher"] = launcher
    if launcher != "standard":
        deepspeed["deepspeed_hostfile"] = ask_text("Path of the DeepSpeed hostfile ('HOST slots=N' lines)")


def ask_deepspeed(num_machines: int) -> dict:
    """The ``deepspeed_config`` section. With a DeepSpeed JSON file, its own settings (stage, accumulation,
    clipping, precision) stay in that file: ``hasten launch`` refuses them twice."""
    deepspeed = {}
    if ask_bool("Do you have a DeepSpeed JSON config file to use?", False):
        deepspeed["deepspeed_config_file"] = ask_text("Path of the DeepSpeed config file", check=_json_config)
    else:
        _zero(deepspeed)
    if deepspeed.get("zero_stage", 3) == 3:
        deepspeed["zero3_init_flag"] = ask_bool("Build the model directly sharded with deepspeed.zero.Init (ZeRO-3, "
                                                "for models too large for one device)?", False)
    if num_machines > 1:
        _machines(deepspeed)
    return deepspeed
