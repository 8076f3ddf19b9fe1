"""``hasten config``'s FSDP questions; the answers become the ``fsdp_config`` section (Accelerate's keys, read by
``hasten launch`` and ``FullyShardedDataParallelPlugin``)."""
from __future__ import annotations

import re

from .questions import ask_bool, ask_choice, ask_int, ask_text

__all__ = ["ask_fsdp", "SHARDING_STRATEGIES", "WRAP_POLICIES"]

SHARDING_STRATEGIES = ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD", "HYBRID_SHARD_ZERO2")
WRAP_POLICIES = ("TRANSFORMER_BASED_WRAP", "SIZE_BASED_WRAP", "NO_WRAP")
_CLASS_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _class_names(text: str) -> str:
    """``GPT2Block, GPT2MLP`` -> ``GPT2Block,GPT2MLP``; each name must be a Python class name."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    bad = [name for name in names if not _CLASS_NAME.match(name)]
    if bad or not names:
        raise ValueError(f"{', '.join(bad) or text!r} is not a class name: give names such as GPT2Block or "
                         "LlamaDecoderLayer, separated by commas.")
    return ",".join(names)


def _wrapping(fsdp: dict) -> None:
    policy = ask_choice("Which modules should become their own FSDP unit (auto wrap policy)?", [
        ("TRANSFORMER_BASED_WRAP: each transformer layer (by class name)", "TRANSFORMER_BASED_WRAP"),
        ("SIZE_BASED_WRAP: each module above a number of parameters", "SIZE_BASED_WRAP"),
        ("NO_WRAP: the whole model as one unit", "NO_WRAP")])
    fsdp["fsdp_auto_wrap_policy"] = policy
    if policy == "TRANSFORMER_BASED_WRAP":
        names = ask_text("Layer class names to wrap, comma-separated (e.g. GPT2Block); 'auto' takes a Hugging Face"
                         " Transformers model's _no_split_modules", default="auto",
                         check=lambda text: text if text.lower() == "auto" else _class_names(text))
        if names.lower() != "auto":
            fsdp["fsdp_transformer_layer_cls_to_wrap"] = names
    elif policy == "SIZE_BASED_WRAP":
        fsdp["fsdp_min_num_params"] = ask_int("Smallest number of parameters of a wrapped module (1e8 = 100 "
                                              "million)?", 100_000_000, minimum=1)


def ask_fsdp() -> dict:
    """The ``fsdp_config`` section."""
    fsdp = {"fsdp_version": ask_choice("Which FSDP version?", [("2 (fully_shard, per-parameter sharding)", 2),
                                                               ("1 (FullyShardedDataParallel wrapper)", 1)])}
    version = fsdp["fsdp_version"]
    if version == 1:
        fsdp["fsdp_reshard_after_forward"] = ask_choice(
            "What should be sharded (sharding strategy)?", [(name, name) for name in SHARDING_STRATEGIES])
    else:
        fsdp["fsdp_reshard_after_forward"] = ask_bool(
            "Shard the parameters again after forward (saves memory, all-gathers them again in backward)?", True)
    fsdp["fsdp_offload_params"] = ask_bool("Offload parameters and gradients to the CPU?", False)
    _wrapping(fsdp)
    if version == 1:
        fsdp["fsdp_backward_prefetch"] = ask_choice("Which backward prefetch policy?", [
            ("BACKWARD_PRE (more overlap, more memory)", "BACKWARD_PRE"), ("BACKWARD_POST", "BACKWARD_POST"),
            ("NO_PREFETCH", "NO_PREFETCH")])
        fsdp["fsdp_forward_prefetch"] = ask_bool("Prefetch the next all-gather during forward?", False)
        fsdp["fsdp_use_orig_params"] = ask_bool("Keep the original parameters (needed for frozen and trainable "
                                                "parameters in one unit, and for torch.compile)?", True)
    state_dicts = ["SHARDED_STATE_DICT", "FULL_STATE_DICT"] + (["LOCAL_STATE_DICT"] if version == 1 else [])
    fsdp["fsdp_state_dict_type"] = ask_choice(
        "How should checkpoints be saved (state dict type)? SHARDED: one file per process, FULL: one file",
        [(name, name) for name in state_dicts])
    fsdp["fsdp_cpu_ram_efficient_loading"] = ask_bool(
        "Load pretrained weights on the first process only and broadcast them (CPU RAM efficient loading, for "
        "Hugging Face Transformers from_pretrained models)?", False)
    if version == 1:
        fsdp["fsdp_sync_module_states"] = fsdp["fsdp_cpu_ram_efficient_loading"] or ask_bool(
            "Broadcast the module states of rank 0 to the others at the start?", True)
    fsdp["fsdp_activation_checkpointing"] = ask_bool("Recompute activations in backward instead of keeping them "
                                                     "(activation checkpointing)?", False)
    return fsdp
