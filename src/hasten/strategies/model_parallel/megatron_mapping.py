"""How a ``MegatronLMPlugin`` maps onto the torch-native engine, and which of its fields that engine cannot honour.

The torch-native engine trains the user's own model (it does not build Megatron's GPT/BERT/T5), so the plugin's
fields fall in three groups:

- **mapped**: ``tp_degree`` / ``pp_degree`` (the ``tp`` / ``pp`` mesh dimensions), the processes left over are data
  parallel, sharded with FSDP2 when ``use_distributed_optimizer`` (parameters, gradients and optimizer state split
  over them) and replicated otherwise; ``num_micro_batches`` (the pipeline's micro-batches), ``sequence_parallelism``
  (the tensor-parallel plan's sequence-parallel entries), ``recompute_activations`` with ``recompute_method`` /
  ``recompute_num_layers`` (activation checkpointing of the transformer blocks), ``gradient_clipping`` (every
  optimizer step clips the global norm first), ``custom_loss_function`` (the pipeline's loss on the last stage),
  and the schedule fields read by ``MegatronLMDummyScheduler``;
- **inert**: fields with no effect on this engine at their defaults (``return_logits``, ``is_train_batch_min``,
  ``consumed_samples`` ...);
- **refused**: a field asking for something only Megatron-LM does (its own model builder, datasets, train-step
  classes, expert or context parallelism, its optimizer offload ...) raises, naming every such field at once,
  before any process group is touched.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:
    from ...config.megatron import MegatronLMPlugin
    from ...parallel import ParallelDims

__all__ = ["check_torch_native", "megatron_layout"]

# field -> the value(s) that ask for nothing: other values need Megatron-LM itself
_MUST_BE_OFF = ("use_custom_fsdp", "no_load_optim", "no_save_optim", "eod_mask_loss", "optimizer_cpu_offload",
                "overlap_cpu_optimizer_d2h_h2d", "use_precision_aware_optimizer", "megatron_dataset_flag",
                "set_all_logging_options")
_MUST_BE_UNSET = ("decoder_last_pipeline_num_layers", "pipeline_model_parallel_split_rank",
                  "num_layers_per_virtual_pipeline_stage", "seq_length", "encoder_seq_length", "decoder_seq_length",
                  "tensorboard_dir", "custom_train_step_class", "custom_train_step_kwargs",
                  "custom_model_provider_function", "custom_prepare_model_function",
                  "custom_megatron_datasets_provider_function", "custom_get_batch_function", "other_megatron_args")
_MUST_BE_ONE = ("expert_model_parallel_size", "expert_tensor_parallel_size")
# settings of the network Megatron-LM builds: meaningless for the user's own model unless left at their defaults
_MODEL_BUILDER = {"attention_backend": True, "attention_softmax_in_fp32": True, "calculate_per_token_loss": True,
                  "use_rotary_position_embeddings": True, "attention_dropout": 0.0, "hidden_dropout": 0.0,
                  "eval_iters": 100, "eval_interval": 1000}


def _refusals(plugin) -> list:
    """``[(field, value, why)]`` for every field the torch-native engine cannot honour."""
    chosen = getattr(plugin, "_chosen_fields", frozenset())
    found = []
    for field in _MUST_BE_OFF:
        if getattr(plugin, field):
            found.append((field, True, "a Megatron-LM training-loop option"))
    for field in _MUST_BE_UNSET:
        if getattr(plugin, field) is not None:
            found.append((field, getattr(plugin, field), "used by Megatron-LM's own model, data or train-step code"))
    for field in _MUST_BE_ONE:
        if getattr(plugin, field) != 1:
            found.append((field, getattr(plugin, field), "expert (MoE) parallelism is Megatron-LM's"))
    if "context_parallel_size" in chosen and plugin.context_parallel_size != 1:
        found.append(("context_parallel_size", plugin.context_parallel_size,
                      "context parallelism is not available on the torch-native engine"))
    for field, default in _MODEL_BUILDER.items():
        if getattr(plugin, field) != default:
            found.append((field, getattr(plugin, field), f"a setting of the network Megatron-LM builds (default "
                                                         f"{default!r})"))
    if plugin.recompute_activations and plugin.recompute_granularity == "selective":
        found.append(("recompute_granularity", "selective", "selective recomputation needs Megatron-LM's attention "
                                                            "layers; 'full' checkpoints whole blocks"))
    if plugin.recompute_activations and plugin.recompute_method == "uniform" and plugin.recompute_num_layers != 1:
        found.append(("recompute_num_layers", plugin.recompute_num_layers,
                      "recompute_method='uniform' checkpoints each block on its own here: use 1, or "
                      "recompute_method='block' to checkpoint only the first N blocks"))
    if plugin.num_micro_batches > 1 and plugin.pp_degree == 1:
        found.append(("num_micro_batches", plugin.num_micro_batches,
                      "micro-batches are the pipeline's (pp_degree > 1); without a pipeline use "
                      "Accelerator(gradient_accumulation_steps=...)"))
    if plugin.sequence_parallelism and plugin.tp_degree == 1:
        found.append(("sequence_parallelism", True, "sequence parallelism splits along the tensor-parallel group: "
                                                    "set tp_degree > 1"))
    return found


def check_torch_native(plugin: MegatronLMPlugin) -> None:
    """Raise ``ValueError`` naming every field of ``plugin`` the torch-native engine cannot honour."""
    found = _refusals(plugin)
    if found:
        lines = "\n".join(f"  - {field}={value!r}: {why}" for field, value, why in found)
        raise ValueError("MegatronLMPlugin trains on hasten's torch-native engine (megatron-core's engine is not "
                         "available here), which cannot honour these fields:\n" + lines +
                         "\nLeave them at their defaults, or see docs/megatron-lm.md for what each maps to.")


def megatron_layout(plugin: MegatronLMPlugin, world_size: int, given: Optional[ParallelDims] = None) -> ParallelDims:
    """The ``ParallelDims`` the plugin asks for on ``world_size`` processes, checked against the sizes of the
    ParallelismConfig behind ``given`` (the run's layout) when there is one."""
    from ...parallel import ParallelDims

    tp, pp = plugin.tp_degree, plugin.pp_degree
    if world_size % (tp * pp):
        raise ValueError(f"MegatronLMPlugin(tp_degree={tp}, pp_degree={pp}) needs a multiple of {tp * pp} processes "
                         f"and the job has {world_size}: launch a multiple of tp_degree x pp_degree.")
    dp = world_size // (tp * pp)
    sharded = plugin.use_distributed_optimizer
    dims = ParallelDims(pp=pp, tp=tp, dp_shard=dp if sharded else 1, dp_replicate=1 if sharded else dp,
                        world_size=world_size)
    config = getattr(given, "_config", None)  # the sizes asked for (the layout fills unset ones in by itself)
    asked = {d: getattr(config, f"{d}_size") for d in ("pp", "tp", "dp_shard", "dp_replicate", "cp", "sp")} \
        if config is not None else {}  # no ParallelismConfig: nothing asked beyond the plugin
    differ = [d for d, size in asked.items() if size not in (1, getattr(dims, d))]
    if differ:
        ours = ", ".join(f"{d}_size={getattr(dims, d)}" for d in differ)
        theirs = ", ".join(f"{d}_size={asked[d]}" for d in differ)
        raise ValueError(f"MegatronLMPlugin(tp_degree={tp}, pp_degree={pp}, use_distributed_optimizer={sharded}) on "
                         f"{world_size} processes lays them out as {ours}, and the ParallelismConfig asks for {theirs}: "
                         "they disagree. Give the layout in one of them (the plugin's data-parallel ranks are sharded "
                         "with use_distributed_optimizer=True, replicated otherwise; context and sequence parallelism "
                         "do not combine with it).")
    if given is not None:
        dims._config = getattr(given, "_config", None)  # its tensor-parallel plan, when it has one
    return dims
