"""``MegatronLMPlugin``: the options of Megatron-LM tensor / pipeline / sequence parallelism.

The plugin is a real configuration object: unset fields come from the launcher's environment
(``HASTEN_MEGATRON_LM_<OPTION>``, or ``ACCELERATE_MEGATRON_LM_<OPTION>``), choices are validated and
``megatron_lm_default_args`` holds the Megatron arguments they map to, as in Accelerate. The model-config parsers
(``parse_gpt2_config`` ...) fill in the network sizes from a Transformers model's config. Given to
``Accelerator(megatron_lm_plugin=...)``, the plugin trains on hasten's torch-native engine
(``strategies/model_parallel/megatron.py``); megatron is never imported here.
"""
from __future__ import annotations

import functools
import logging
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping, NoReturn, Optional, Protocol

from ..core.planned import not_yet_supported
from .env_fields import as_bool, as_choice, as_float, as_int
from .launch_file import config_tier
from .resolution import resolve

if TYPE_CHECKING:
    import torch

__all__ = [
    "MegatronLMPlugin", "MODEL_CONFIGS_TO_MEGATRON_PARSERS", "add_model_config_to_megatron_parser",
    "parse_bert_config", "parse_gpt2_config", "parse_t5_config", "parse_llama_config", "parse_glm4_moe_config",
]

logger = logging.getLogger("hasten.utils.dataclasses")  # the name Accelerate logs these under (as_accelerate/logger_names.py)

_LR_DECAY_STYLES = ("constant", "linear", "cosine", "inverse-square-root", "WSD")
_WEIGHT_DECAY_STYLES = ("constant", "linear", "cosine")


def _positive(field):
    return as_int(f"MegatronLMPlugin.{field}", minimum=1)


def _flag(field):
    return as_bool(f"MegatronLMPlugin.{field}")


def _same(value):
    return value


def _dropout(field):
    return as_float(f"MegatronLMPlugin.{field}", minimum=0.0)


# field -> (default when neither given nor in the environment, parser)
_FROM_ENV = {
    "tp_degree": (1, _positive("tp_degree")),
    "pp_degree": (1, _positive("pp_degree")),
    "use_custom_fsdp": (False, _flag("use_custom_fsdp")),
    "no_load_optim": (False, _flag("no_load_optim")),
    "eod_mask_loss": (False, _flag("eod_mask_loss")),
    "no_save_optim": (False, _flag("no_save_optim")),
    "optimizer_cpu_offload": (False, _flag("optimizer_cpu_offload")),
    "overlap_cpu_optimizer_d2h_h2d": (False, _flag("overlap_cpu_optimizer_d2h_h2d")),
    "use_precision_aware_optimizer": (False, _flag("use_precision_aware_optimizer")),
    "decoder_last_pipeline_num_layers": (None, _positive("decoder_last_pipeline_num_layers")),
    "num_micro_batches": (1, _positive("num_micro_batches")),
    "gradient_clipping": (1.0, as_float("MegatronLMPlugin.gradient_clipping", minimum=0.0)),
    "recompute_activations": (False, _flag("recompute_activations")),
    "use_distributed_optimizer": (False, _flag("use_distributed_optimizer")),
    "sequence_parallelism": (False, _flag("sequence_parallelism")),
    "recompute_granularity": ("full", as_choice("MegatronLMPlugin.recompute_granularity", ("full", "selective"))),
    "recompute_method": ("uniform", as_choice("MegatronLMPlugin.recompute_method", ("uniform", "block"))),
    "recompute_num_layers": (1, _positive("recompute_num_layers")),
    "attention_backend": (True, _flag("attention_backend")),
    "expert_model_parallel_size": (1, _positive("expert_model_parallel_size")),
    "context_parallel_size": (2, _positive("context_parallel_size")),  # Accelerate's default
    "attention_dropout": (0.0, _dropout("attention_dropout")),
    "hidden_dropout": (0.0, _dropout("hidden_dropout")),
    "attention_softmax_in_fp32": (True, _flag("attention_softmax_in_fp32")),
    "expert_tensor_parallel_size": (1, _positive("expert_tensor_parallel_size")),
    "calculate_per_token_loss": (True, _flag("calculate_per_token_loss")),
    "use_rotary_position_embeddings": (True, _flag("use_rotary_position_embeddings")),
}

# Megatron argument -> plugin attribute, in the order Accelerate writes them
_DEFAULT_ARGS = {
    "tensor_model_parallel_size": "tp_degree", "pipeline_model_parallel_size": "pp_degree",
    "pipeline_model_parallel_split_rank": "pipeline_model_parallel_split_rank",
    "num_layers_per_virtual_pipeline_stage": "num_layers_per_virtual_pipeline_stage", "DDP_impl": "DDP_impl",
    "use_distributed_optimizer": "use_distributed_optimizer", "sequence_parallel": "sequence_parallelism",
    "clip_grad": "gradient_clipping", "num_micro_batches": "num_micro_batches", "consumed_samples": "consumed_samples",
    "no_wd_decay_cond": "no_wd_decay_cond", "scale_lr_cond": "scale_lr_cond", "lr_mult": "lr_mult",
    "megatron_dataset_flag": "megatron_dataset_flag", "eval_iters": "eval_iters", "eval_interval": "eval_interval",
    **{field: field for field in (
        "use_custom_fsdp", "no_load_optim", "eod_mask_loss", "no_save_optim", "optimizer_cpu_offload",
        "overlap_cpu_optimizer_d2h_h2d", "use_precision_aware_optimizer", "decoder_last_pipeline_num_layers",
        "recompute_granularity", "recompute_method", "recompute_num_layers", "attention_backend",
        "expert_model_parallel_size", "context_parallel_size", "attention_dropout", "hidden_dropout",
        "attention_softmax_in_fp32", "expert_tensor_parallel_size", "calculate_per_token_loss",
        "use_rotary_position_embeddings")},
}

_SCHEDULE_ARGS = ("train_iters", "lr_warmup_iters", "train_samples", "lr_warmup_samples", "lr_decay_iters",
                  "lr_decay_samples", "lr_warmup_fraction", "lr_decay_style", "weight_decay_incr_style",
                  "start_weight_decay", "end_weight_decay", "min_lr")


class _StepCounts(Protocol):
    """What ``set_scheduler_args`` reads of a ``MegatronLMDummyScheduler`` (a strategy's: named, not imported)."""

    total_num_steps: int
    warmup_num_steps: int


@dataclass
class MegatronLMPlugin:
    """Options of Megatron-LM; each keeps Accelerate's meaning (see docs/planned-features.md for the list).

    Main ones: tp_degree / pp_degree (tensor / pipeline parallel sizes, default 1), num_micro_batches (1),
    gradient_clipping (1.0), sequence_parallelism, recompute_activations, use_distributed_optimizer,
    lr_decay_style ("linear"), weight_decay_incr_style ("constant"), seq_length / encoder_seq_length /
    decoder_seq_length, custom_* hooks for the train step and model provider, other_megatron_args (passed through).
    """

    tp_degree: int = None
    pp_degree: int = None
    use_custom_fsdp: bool = None
    overlap_cpu_optimizer_d2h_h2d: bool = None
    no_load_optim: bool = None
    eod_mask_loss: bool = None
    no_save_optim: bool = None
    optimizer_cpu_offload: bool = None
    use_precision_aware_optimizer: bool = None
    decoder_last_pipeline_num_layers: int = None
    recompute_granularity: str = None
    recompute_method: str = None
    recompute_num_layers: int = None
    attention_backend: bool = None
    expert_model_parallel_size: int = None
    context_parallel_size: int = None
    attention_dropout: float = None
    hidden_dropout: float = None
    attention_softmax_in_fp32: bool = None
    expert_tensor_parallel_size: int = None
    calculate_per_token_loss: bool = None
    use_rotary_position_embeddings: bool = None
    num_micro_batches: int = None
    gradient_clipping: float = None
    sequence_parallelism: bool = None
    recompute_activations: bool = None
    use_distributed_optimizer: bool = None
    pipeline_model_parallel_split_rank: int = None
    num_layers_per_virtual_pipeline_stage: int = None
    is_train_batch_min: str = True
    train_iters: int = None
    train_samples: int = None
    weight_decay_incr_style: str = "constant"
    start_weight_decay: float = None
    end_weight_decay: float = None
    lr_decay_style: str = "linear"
    lr_decay_iters: int = None
    lr_decay_samples: int = None
    lr_warmup_iters: int = None
    lr_warmup_samples: int = None
    lr_warmup_fraction: float = None
    min_lr: float = 0
    consumed_samples: list[int] = None
    no_wd_decay_cond: Optional[Callable] = None
    scale_lr_cond: Optional[Callable] = None
    lr_mult: float = 1.0
    megatron_dataset_flag: bool = False
    seq_length: int = None
    encoder_seq_length: int = None
    decoder_seq_length: int = None
    tensorboard_dir: str = None
    set_all_logging_options: bool = False
    eval_iters: int = 100
    eval_interval: int = 1000
    return_logits: bool = False
    custom_train_step_class: Optional[Any] = None
    custom_train_step_kwargs: Optional[dict[str, Any]] = None
    custom_model_provider_function: Optional[Callable] = None
    custom_prepare_model_function: Optional[Callable] = None
    custom_megatron_datasets_provider_function: Optional[Callable] = None
    custom_get_batch_function: Optional[Callable] = None
    custom_loss_function: Optional[Callable] = None
    other_megatron_args: Optional[dict[str, Any]] = None

    def __post_init__(self):
        chosen = set()  # fields given as arguments or by the launcher's environment, not defaulted
        for field, (default, parse) in _FROM_ENV.items():
            setting = f"megatron_lm_{field}"
            value, source = resolve(setting, getattr(self, field), argument_name=f"MegatronLMPlugin({field}=...)",
                                    default=default, parse=parse, **config_tier(setting))
            setattr(self, field, value)
            if source.kind != "default":
                chosen.add(field)
        self._chosen_fields = frozenset(chosen)
        self.lr_decay_style = as_choice("MegatronLMPlugin.lr_decay_style", _LR_DECAY_STYLES, _same)(
            self.lr_decay_style)
        self.weight_decay_incr_style = as_choice("MegatronLMPlugin.weight_decay_incr_style", _WEIGHT_DECAY_STYLES)(
            self.weight_decay_incr_style)
        if self.other_megatron_args is not None and not isinstance(self.other_megatron_args, dict):
            raise ValueError(f"MegatronLMPlugin.other_megatron_args must be a dict of Megatron arguments, "
                             f"got {self.other_megatron_args!r}.")
        self.DDP_impl = "local" if self.pp_degree > 1 or self.use_distributed_optimizer else "torch"
        if self.consumed_samples is not None:  # one per prepared loader: train, valid, test
            self.consumed_samples = list(self.consumed_samples) + [0] * (3 - len(self.consumed_samples))
        self.megatron_lm_default_args = {arg: getattr(self, field) for arg, field in _DEFAULT_ARGS.items()}
        if self.tensorboard_dir is not None:
            self.megatron_lm_default_args["tensorboard_dir"] = self.tensorboard_dir
            if self.set_all_logging_options:
                self.set_tensorboard_logging_options()
        if self.other_megatron_args is not None:
            self.megatron_lm_default_args.update(self.other_megatron_args)

    def set_network_size_args(self, model: torch.nn.Module,
                              batch_data: Optional[Mapping[str, torch.Tensor]] = None) -> None:
        """Fill the network sizes from ``model.config`` with the parser registered for its model type."""
        model_type = model.config.model_type.lower()
        for known, parser in MODEL_CONFIGS_TO_MEGATRON_PARSERS.items():
            if known in model_type:
                parser(self, model, batch_data)
                return
        raise ValueError(f"No Megatron-LM config parser for model type {model_type!r}: register one with "
                         "@add_model_config_to_megatron_parser(model_type).")

    def set_mixed_precision(self, mixed_precision: str) -> None:
        if mixed_precision == "fp16":
            self.megatron_lm_default_args["fp16"] = True
        elif mixed_precision == "bf16":
            self.megatron_lm_default_args["bf16"] = True
            self.DDP_impl = "local"
            self.megatron_lm_default_args["DDP_impl"] = self.DDP_impl

    def set_training_args(self, micro_batch_size: int, dp_degree: int) -> None:
        self.data_parallel_size = dp_degree
        self.micro_batch_size = micro_batch_size
        self.global_batch_size = dp_degree * micro_batch_size * self.num_micro_batches
        self.megatron_lm_default_args.update(data_parallel_size=self.data_parallel_size,
                                             micro_batch_size=self.micro_batch_size,
                                             global_batch_size=self.global_batch_size)

    def set_optimizer_type(self, optimizer: torch.optim.Optimizer) -> None:
        """Megatron's optimizer arguments from a torch Adam-family or SGD optimizer."""
        name = optimizer.__class__.__name__.lower()
        args, defaults = self.megatron_lm_default_args, optimizer.defaults
        if "adam" in name:
            args.update(optimizer="adam", adam_beta1=defaults["betas"][0], adam_beta2=defaults["betas"][1],
                        adam_eps=defaults["eps"])
        elif "sgd" in name:
            args.update(optimizer="sgd", sgd_momentum=defaults["momentum"])
        else:
            raise ValueError(f"Optimizer {name} is not supported by Megatron-LM: use an Adam-family optimizer or SGD.")
        args.update(lr=defaults["lr"], weight_decay=defaults["weight_decay"])

    def set_scheduler_args(self, scheduler: _StepCounts) -> None:
        """Megatron's schedule arguments from a ``MegatronLMDummyScheduler``."""
        dp_size = self.megatron_lm_default_args["data_parallel_size"]
        if self.train_iters is None:
            self.train_iters = scheduler.total_num_steps // dp_size
            if self.train_samples is not None:
                self.train_samples = None
                warnings.warn("Ignoring train_samples: train_iters comes from the scheduler.")
        if self.lr_warmup_iters is None:
            self.lr_warmup_iters = scheduler.warmup_num_steps // dp_size
            if self.lr_warmup_samples is not None:
                warnings.warn("Ignoring lr_warmup_samples: lr_warmup_iters comes from the scheduler.")
            self.lr_warmup_samples = 0
        self.megatron_lm_default_args.update({name: getattr(self, name) for name in _SCHEDULE_ARGS})

    def set_tensorboard_logging_options(self) -> NoReturn:
        raise not_yet_supported("Megatron-LM tensorboard logging options (set_all_logging_options=True)",
                                "leave set_all_logging_options=False")


MODEL_CONFIGS_TO_MEGATRON_PARSERS = {}


def add_model_config_to_megatron_parser(model_type: str) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Decorator: register ``parser(plugin, model, batch_data)`` for model types containing ``model_type``."""

    def add_model_config_parser_helper(func):
        @functools.wraps(func)
        def wrapper(*args, **kwargs):
            return func(*args, **kwargs)

        MODEL_CONFIGS_TO_MEGATRON_PARSERS[model_type] = func
        return wrapper

    return add_model_config_parser_helper


def _choose_seq_length(plugin, preferred: Optional[int], batch_data, fallback: int) -> int:
    """``plugin.seq_length`` unless unset; then ``preferred``, the batch's length, or ``fallback``."""
    if preferred is not None:
        if plugin.seq_length is not None and plugin.seq_length != preferred:
            warnings.warn(f"Both seq_length ({plugin.seq_length}) and the encoder/decoder length ({preferred}) are "
                          f"set: using {preferred}.")
        return preferred
    if plugin.seq_length is not None:
        return plugin.seq_length
    if batch_data is not None:
        return batch_data["input_ids"].shape[1]
    return fallback


def _network_args(plugin, model, **args):
    plugin.megatron_lm_default_args.update(args, model_return_dict=model.config.return_dict)


@add_model_config_to_megatron_parser("megatron-bert")
def parse_bert_config(megatron_lm_plugin: MegatronLMPlugin, model: torch.nn.Module,
                      batch_data: Optional[Mapping[str, torch.Tensor]]) -> None:
    config = model.config
    megatron_lm_plugin.seq_length = _choose_seq_length(megatron_lm_plugin, megatron_lm_plugin.encoder_seq_length,
                                                       batch_data, config.max_position_embeddings)
    _network_args(megatron_lm_plugin, model, seq_length=megatron_lm_plugin.seq_length, model_type_name="bert",
                  num_layers=config.num_hidden_layers, hidden_size=config.hidden_size,
                  num_attention_heads=config.num_attention_heads,
                  max_position_embeddings=config.max_position_embeddings,
                  pretraining_flag="maskedlm" in model.__class__.__name__.lower(),
                  orig_vocab_size=config.vocab_size, num_labels=config.num_labels)


@add_model_config_to_megatron_parser("gpt2")
def parse_gpt2_config(megatron_lm_plugin: MegatronLMPlugin, model: torch.nn.Module,
                      batch_data: Optional[Mapping[str, torch.Tensor]]) -> None:
    config = model.config
    megatron_lm_plugin.seq_length = _choose_seq_length(megatron_lm_plugin, megatron_lm_plugin.decoder_seq_length,
                                                       batch_data, config.n_positions)
    _network_args(megatron_lm_plugin, model, seq_length=megatron_lm_plugin.seq_length,
                  return_logits=megatron_lm_plugin.return_logits, tokenizer_type="GPT2BPETokenizer",
                  model_type_name="gpt", num_layers=config.n_layer, hidden_size=config.n_embd,
                  num_attention_heads=config.n_head, max_position_embeddings=config.n_positions,
                  pretraining_flag=True, orig_vocab_size=config.vocab_size)


@add_model_config_to_megatron_parser("t5")
def parse_t5_config(megatron_lm_plugin: MegatronLMPlugin, model: torch.nn.Module,
                    batch_data: Optional[Mapping[str, torch.Tensor]]) -> None:
    config = model.config
    max_positions = getattr(config, "n_positions", 1024)
    if megatron_lm_plugin.encoder_seq_length is None:
        megatron_lm_plugin.encoder_seq_length = (batch_data["input_ids"].shape[1] if batch_data is not None
                                                 else max_positions)
    if megatron_lm_plugin.decoder_seq_length is None:
        megatron_lm_plugin.decoder_seq_length = (batch_data["labels"].shape[1] if batch_data is not None
                                                 else max_positions)
    _network_args(megatron_lm_plugin, model, encoder_seq_length=megatron_lm_plugin.encoder_seq_length,
                  decoder_seq_length=megatron_lm_plugin.decoder_seq_length, model_type_name="t5",
                  num_layers=config.num_layers, hidden_size=config.d_model, num_attention_heads=config.num_heads,
                  max_position_embeddings=max_positions, pretraining_flag=True, orig_vocab_size=config.vocab_size)


def _decoder_seq_length(plugin, config, batch_data) -> int:
    if plugin.seq_length is not None:
        return plugin.seq_length
    for candidate in (getattr(config, "max_sequence_length", None), plugin.decoder_seq_length):
        if candidate is not None:
            return candidate
    return batch_data["input_ids"].shape[1] if batch_data is not None else config.max_position_embeddings


def _gpt_like_args(plugin, model, batch_data, tokenizer_type: str, pretraining_flag: bool) -> None:
    config = model.config
    plugin.seq_length = _decoder_seq_length(plugin, config, batch_data)
    _network_args(plugin, model, return_logits=plugin.return_logits, tokenizer_type=tokenizer_type,
                  model_type_name="gpt", num_layers=config.num_hidden_layers, pretraining_flag=pretraining_flag,
                  hidden_size=config.hidden_size, num_attention_heads=config.num_attention_heads,
                  orig_vocab_size=config.vocab_size, max_position_embeddings=config.max_position_embeddings,
                  seq_length=plugin.seq_length)


@add_model_config_to_megatron_parser("llama")
def parse_llama_config(megatron_lm_plugin: MegatronLMPlugin, model: torch.nn.Module,
                       batch_data: Optional[Mapping[str, torch.Tensor]]) -> None:
    _gpt_like_args(megatron_lm_plugin, model, batch_data, "Llama2Tokenizer", pretraining_flag=True)


@add_model_config_to_megatron_parser("glm4_moe")
def parse_glm4_moe_config(megatron_lm_plugin: MegatronLMPlugin, model: torch.nn.Module,
                          batch_data: Optional[Mapping[str, torch.Tensor]]) -> None:
    _gpt_like_args(megatron_lm_plugin, model, batch_data, "HuggingFaceTokenizer", pretraining_flag=False)
    config, args = model.config, megatron_lm_plugin.megatron_lm_default_args
    dense_layers = config.first_k_dense_replace
    args.update({
        "kv_channels": config.head_dim, "position_embedding_type": "rope", "original_model_type": config.model_type,
        "qk_layernorm": config.use_qk_norm, "add_bias_linear": False, "group_query_attention": True,
        "num_query_groups": config.num_key_value_heads, "ffn_hidden_size": config.intermediate_size,
        "add_qkv_bias": True, "normalization": "RMSNorm", "rotary-percent": 0.5, "swiglu": True,
        "moe_ffn_hidden_size": config.moe_intermediate_size,
        "moe_shared_expert_intermediate_size": config.moe_intermediate_size, "moe_router_pre_softmax": True,
        "moe_router_score_function": "sigmoid", "moe_router_enable_expert_bias": True,
        "moe_router_bias_update_rate": 0, "moe_router_load_balancing_type": "seq_aux_loss",
        "moe_token_dispatcher_type": "alltoall", "moe_router_topk": config.num_experts_per_tok,
        "moe_router_topk_scaling_factor": config.routed_scaling_factor,
        "moe_layer_freq": [0] * dense_layers + [1] * (config.num_hidden_layers - dense_layers),
        "num_experts": config.n_routed_experts, "moe_grouped_gemm": True, "moe_router_dtype": "fp32",
        "moe_permute_fusion": True, "moe_aux_loss_coeff": 0, "rotary_base": config.rope_theta, "rope_type": "rope",
        "rotary_percent": config.partial_rotary_factor, "norm_epsilon": 1e-3, "use_flash_attn": True,
        "eos_token_id": config.eos_token_id,
    })
    if getattr(config, "fp8_param", False):
        args.update(fp8=config.fp8, fp8_param=config.fp8_param, fp8_param_gather=config.fp8_param_gather,
                    fp8_recipe=config.fp8_recipe)
    args["bf16"] = config.bf16
    args["untie_embeddings_and_output_weights"] = not config.tie_word_embeddings
    logger.info(f"Parsed GLM4 MoE config: {args}")
