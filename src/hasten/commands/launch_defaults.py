"""The defaults ``hasten launch``'s parser shows, and how the launch tells them from flags given.

Accelerate's parser fills many flags with its own defaults (``--fsdp_sync_module_states`` reads ``"true"``,
``--rdzv_backend`` ``"static"``, ``--cpu`` ``False`` ...), and scripts and tests that parse a command line read
them back. hasten's parser fills the same values. They are not settings: a setting comes from a flag given, else
the config file, else hasten's default (``launch_plan.resolve_settings``). So every step of a launch first takes
``given_flags(args)``: the namespace with each value that is only the parser's default set back to None ("not
given"). What was given is in the namespace's ``nondefault`` set (``flags.add_flag`` records it).
"""
from __future__ import annotations

import argparse
from typing import Any

from .flags import was_given

__all__ = ["SHOWN_DEFAULTS", "shown_default", "given_flags"]

_FSDP = {"fsdp_version": "1", "fsdp_offload_params": "false", "fsdp_min_num_params": 100_000_000,
         "fsdp_sharding_strategy": "FULL_SHARD", "fsdp_reshard_after_forward": "true",
         "fsdp_forward_prefetch": "false", "fsdp_use_orig_params": "true", "fsdp_cpu_ram_efficient_loading": "true",
         "fsdp_sync_module_states": "true", "fsdp_activation_checkpointing": "false",
         "fsdp_activation_checkpointing_offload": "false"}
_MEGATRON = {"megatron_lm_tp_degree": 1, "megatron_lm_pp_degree": 1, "megatron_lm_gradient_clipping": 1.0,
             **{f"megatron_lm_{name}": False for name in (
                 "use_custom_fsdp", "no_load_optim", "eod_mask_loss", "overlap_cpu_optimizer_d2h_h2d", "no_save_optim",
                 "optimizer_cpu_offload", "use_precision_aware_optimizer")}}
_FP8 = {"fp8_use_autocast_during_eval": False, "fp8_margin": 0, "fp8_interval": 1, "fp8_format": "HYBRID",
        "fp8_amax_history_len": 1024, "fp8_amax_compute_algo": "most_recent",
        "fp8_override_linear_precision": (False, False, False), "fp8_opt_level": "O2",
        "fp8_enable_fsdp_float8_all_gather": True, "fp8_pad_inner_dim": True}
_PARALLELISM = {**{f"parallelism_config_{name}_size": 1 for name in ("dp_replicate", "dp_shard", "tp", "cp", "sp")},
                "parallelism_config_cp_backend": "torch", "parallelism_config_cp_comm_strategy": "allgather",
                "parallelism_config_sp_backend": "deepspeed", "parallelism_config_sp_seq_length_is_variable": True,
                "parallelism_config_sp_attn_implementation": "sdpa"}
_SWITCHES = ("cpu", "multi_gpu", "tpu", "enable_cpu_affinity", "dynamo_use_fullgraph", "dynamo_use_dynamic",
             "dynamo_use_regional_compilation", "use_deepspeed", "use_fsdp", "use_parallelism_config",
             "use_megatron_lm", "same_network", "tpu_use_cluster", "tpu_use_sudo", "downcast_bf16")

# dest -> the value Accelerate's launch parser gives a flag that is not on the command line
SHOWN_DEFAULTS = {**dict.fromkeys(_SWITCHES, False),
                  "dynamo_mode": "default", "tee": "0", "role": "default", "rdzv_backend": "static", "rdzv_conf": "",
                  "max_restarts": 0, "monitor_interval": 0.1,
                  **_FSDP, **_MEGATRON, **_FP8, **_PARALLELISM}


def shown_default(dest: str) -> Any:
    """The parser's default for ``dest`` (None for a flag without one)."""
    return SHOWN_DEFAULTS.get(dest)


def given_flags(args: argparse.Namespace) -> argparse.Namespace:
    """A copy of ``args`` in which every value that only repeats the parser's default is None: what the launch
    reads as "not given". ``args`` itself is left as it is; a copy of a copy is the same."""
    view = argparse.Namespace(**vars(args))
    for dest, default in SHOWN_DEFAULTS.items():
        if hasattr(view, dest) and not was_given(args, dest, default):
            setattr(view, dest, None)
    return view
