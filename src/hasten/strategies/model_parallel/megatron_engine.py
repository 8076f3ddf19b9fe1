"""Accelerate's ``accelerate.utils.megatron_lm`` names: megatron-core's own engine, which hasten does not run.

``MegatronLMPlugin`` trains on hasten's torch-native engine (``megatron.py``); these are the names of
megatron-core's GPU engine, kept so that scripts importing them load.

``MegatronLMDummyScheduler`` is a working scheduler with Megatron's lr / weight-decay schedules on any torch optimizer
(``megatron_scheduler.py``; ``megatron_param_groups`` builds Megatron-style param groups). The placeholder
``MegatronLMDummyDataLoader`` and the ``AbstractTrainStep`` base class work; the T5 mask helpers are plain tensor code
and work too. Everything that needs Megatron raises ``NotYetSupportedError``. megatron is never imported.
"""
from __future__ import annotations

import os
from abc import ABC
from typing import TYPE_CHECKING, Any, Callable, NoReturn, Optional, Sequence, Union

import torch

from ...core.planned import not_yet_supported
from ...optimizer import AcceleratedOptimizer
from ...scheduler import AcceleratedScheduler
from .megatron_scheduler import MegatronParamScheduler

if TYPE_CHECKING:
    from torch.utils.data import DataLoader

    from ...core.aliases import Device, NestedData
    from ...core.planned import NotYetSupportedError

__all__ = [
    "model_provider_func", "prepare_model_optimizer_scheduler", "MegatronLMDummyDataLoader", "prepare_data_loader",
    "MegatronLMOptimizerWrapper", "prepare_optimizer", "MegatronLMDummyScheduler", "megatron_param_groups",
    "MegatronLMSchedulerWrapper", "prepare_scheduler", "AbstractTrainStep", "BertTrainStep", "GPTTrainStep",
    "T5TrainStep", "finish_mpu_init", "initialize", "MegatronEngine", "avg_losses_across_data_parallel_group",
    "gather_across_data_parallel_groups",
]

_MEANWHILE = "train with DDP (several processes) or on a single device"
# ``accelerator`` below: the Accelerator (a room above this one, never read by these placeholders)


def _megatron(what: str) -> NotYetSupportedError:
    return not_yet_supported(f"Megatron-LM ({what})", _MEANWHILE)


def model_provider_func(pre_process: bool = True, post_process: bool = True, add_encoder: bool = True,
                        add_decoder: bool = True) -> NoReturn:
    raise _megatron("model_provider_func")


def prepare_model_optimizer_scheduler(accelerator: Any) -> NoReturn:
    raise _megatron("prepare_model_optimizer_scheduler")


class MegatronLMDummyDataLoader:
    """Stands for a Megatron indexed dataset given to ``prepare``; ``dataset_kwargs`` are Megatron data arguments."""

    def __init__(self, **dataset_kwargs: Any):
        self.dataset_args = dict(dataset_kwargs, megatron_dataset_flag=True)

    def set_megatron_data_args(self) -> NoReturn:
        raise _megatron("MegatronLMDummyDataLoader.set_megatron_data_args")

    def get_train_valid_test_datasets_provider(self, accelerator: Any) -> NoReturn:
        raise _megatron("MegatronLMDummyDataLoader.get_train_valid_test_datasets_provider")

    def build_train_valid_test_data_iterators(self, accelerator: Any) -> NoReturn:
        raise _megatron("MegatronLMDummyDataLoader.build_train_valid_test_data_iterators")


def prepare_data_loader(accelerator: Any, dataloader: Union[DataLoader, MegatronLMDummyDataLoader]) -> NoReturn:
    raise _megatron("prepare_data_loader")


class MegatronLMOptimizerWrapper(AcceleratedOptimizer):
    """An optimizer Megatron steps inside the model's forward (planned)."""

    def __init__(self, optimizer: torch.optim.Optimizer):
        raise _megatron("MegatronLMOptimizerWrapper")

    def zero_grad(self, set_to_none: Optional[bool] = None) -> None:
        pass  # Megatron zeroes the gradients itself

    def step(self) -> None:
        pass  # Megatron steps inside the model's forward

    @property
    def step_was_skipped(self) -> bool:
        return self.optimizer.skipped_iter


def prepare_optimizer(accelerator: Any, model: torch.nn.Module) -> NoReturn:
    raise _megatron("prepare_optimizer")


_SCHEDULE_OPTIONS = frozenset((
    "train_iters", "train_samples", "lr_decay_iters", "lr_decay_samples", "lr_warmup_iters", "lr_warmup_samples",
    "lr_warmup_fraction", "lr_decay_style", "min_lr", "max_lr", "lr_warmup_init", "lr_wsd_decay_iters",
    "lr_wsd_decay_samples", "lr_wsd_decay_style", "weight_decay_incr_style", "start_weight_decay",
    "end_weight_decay", "samples_per_step", "consumed_samples"))
_PARAM_GROUP_OPTIONS = {"lr_mult": 1.0, "no_wd_decay_cond": None, "scale_lr_cond": None}


def _dummy_scheduler_options(total_num_steps: Optional[int], warmup_num_steps: int, kwargs: dict) -> dict:
    """Accelerate's ``total_num_steps`` / ``warmup_num_steps`` and Megatron's names -> the scheduler's options."""
    unknown = sorted(set(kwargs) - _SCHEDULE_OPTIONS - set(_PARAM_GROUP_OPTIONS))
    if unknown:
        raise ValueError(f"MegatronLMDummyScheduler got unknown option(s) {', '.join(unknown)}; it accepts "
                         f"{', '.join(sorted(_SCHEDULE_OPTIONS))}.")
    for name, default in _PARAM_GROUP_OPTIONS.items():
        if name in kwargs and kwargs[name] != default:
            raise ValueError(f"{name} shapes the param groups, not the schedule: build the optimizer on "
                             f"megatron_param_groups(model, weight_decay, {name}=...) and the scheduler applies "
                             "each group's lr_mult / wd_mult.")
    options = {name: value for name, value in kwargs.items() if name in _SCHEDULE_OPTIONS}
    if total_num_steps is not None:
        if options.get("train_samples") is not None:
            raise ValueError(f"total_num_steps ({total_num_steps}) counts iterations and train_samples "
                             f"({options['train_samples']}) counts samples: give one of them.")
        if options.get("train_iters") not in (None, total_num_steps):
            raise ValueError(f"total_num_steps ({total_num_steps}) and train_iters ({options['train_iters']}) "
                             "disagree: give one of them.")
        options["train_iters"] = total_num_steps
    if warmup_num_steps:
        for name in ("lr_warmup_samples", "lr_warmup_fraction"):
            if options.get(name):
                raise ValueError(f"warmup_num_steps ({warmup_num_steps}) and {name} ({options[name]}) both set the "
                                 "warmup: give one of them.")
        if options.get("lr_warmup_iters") not in (None, 0, warmup_num_steps):
            raise ValueError(f"warmup_num_steps ({warmup_num_steps}) and lr_warmup_iters "
                             f"({options['lr_warmup_iters']}) disagree: give one of them.")
        options["lr_warmup_iters"] = warmup_num_steps
    return options


class MegatronLMDummyScheduler(MegatronParamScheduler):
    """Megatron-LM's learning-rate / weight-decay schedule for any torch optimizer (Accelerate's signature).

    ``total_num_steps`` is the run's length in iterations (Megatron's ``train_iters``) and ``warmup_num_steps`` the
    warmup (``lr_warmup_iters``); ``kwargs`` take Megatron's other names (``lr_decay_style``, ``min_lr``,
    ``lr_warmup_fraction``, ``train_samples`` ..., see ``MegatronParamScheduler``). Bad or conflicting values raise
    ``ValueError`` here, before the optimizer is touched.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, total_num_steps: Optional[int] = None,
                 warmup_num_steps: int = 0, **kwargs: Any):
        options = _dummy_scheduler_options(total_num_steps, warmup_num_steps, kwargs)
        self.total_num_steps = total_num_steps
        self.warmup_num_steps = warmup_num_steps
        self.kwargs = kwargs
        super().__init__(optimizer, **options)


def megatron_param_groups(model: torch.nn.Module, weight_decay: float,
                          no_wd_decay_cond: Optional[Callable[[str, torch.nn.Parameter], bool]] = None,
                          scale_lr_cond: Optional[Callable[[str, torch.nn.Parameter], bool]] = None,
                          lr_mult: float = 1.0) -> list[dict]:
    """Megatron's param groups for ``model``'s trainable parameters, to build any torch optimizer on.

    A parameter gets no weight decay when ``no_wd_decay_cond(name, param)`` says so (default: biases and 1-D
    parameters such as norms) and a learning rate scaled by ``lr_mult`` when ``scale_lr_cond(name, param)`` is true
    (default: none). Each group carries ``wd_mult`` (0 or 1), ``lr_mult`` and its ``weight_decay``;
    ``MegatronLMDummyScheduler`` multiplies the scheduled lr and weight decay by them.
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"megatron_param_groups takes a torch.nn.Module; got {type(model).__name__}.")
    for name, cond in (("no_wd_decay_cond", no_wd_decay_cond), ("scale_lr_cond", scale_lr_cond)):
        if cond is not None and not callable(cond):
            raise TypeError(f"{name} must be a function (name, param) -> bool or None; got {cond!r}.")
    for name, value in (("weight_decay", weight_decay), ("lr_mult", lr_mult)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
            raise ValueError(f"{name} must be a number >= 0; got {value!r}.")
    groups: dict[tuple[float, float], list] = {}
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        no_wd = no_wd_decay_cond(name, param) if no_wd_decay_cond else (name.endswith(".bias") or param.ndim == 1)
        scaled = bool(scale_lr_cond(name, param)) if scale_lr_cond else False
        groups.setdefault((0.0 if no_wd else 1.0, float(lr_mult) if scaled else 1.0), []).append(param)
    if not groups:
        raise ValueError("megatron_param_groups found no trainable parameter in the model (all requires_grad=False).")
    return [{"params": params, "weight_decay": weight_decay * wd_mult, "wd_mult": wd_mult, "lr_mult": scale}
            for (wd_mult, scale), params in groups.items()]


class MegatronLMSchedulerWrapper(AcceleratedScheduler):
    """A scheduler Megatron steps itself (planned)."""

    def __init__(self, scheduler: Any, optimizers: Union[torch.optim.Optimizer, Sequence[torch.optim.Optimizer]]):
        raise _megatron("MegatronLMSchedulerWrapper")

    def step(self, *args: Any, **kwargs: Any) -> None:
        return  # Megatron steps the scheduler inside the model's forward


def prepare_scheduler(accelerator: Any, optimizer: torch.optim.Optimizer, scheduler: Any) -> NoReturn:
    raise _megatron("prepare_scheduler")


class AbstractTrainStep(ABC):
    """Base of a Megatron train step: how to get a batch, run the forward step and compute the loss."""

    def __init__(self, name: str):
        super().__init__()
        self.name = name

    def get_batch_func(self, accelerator: Any, megatron_dataset_flag: bool) -> Optional[Callable[..., Any]]:
        pass

    def get_forward_step_func(self) -> Optional[Callable[..., Any]]:
        pass

    def get_loss_func(self, accelerator: Any) -> Optional[Callable[..., Any]]:
        pass


class BertTrainStep(AbstractTrainStep):
    """The BERT train step (planned)."""

    def __init__(self, accelerator: Any, args: Any):
        raise _megatron("BertTrainStep")

    def get_batch_func(self, accelerator: Any, megatron_dataset_flag: bool) -> NoReturn:
        raise _megatron("BertTrainStep.get_batch_func")

    def get_loss_func(self, accelerator: Any, pretraining_flag: bool, num_labels: int) -> NoReturn:
        raise _megatron("BertTrainStep.get_loss_func")

    def get_forward_step_func(self, pretraining_flag: bool, bert_binary_head: bool) -> NoReturn:
        raise _megatron("BertTrainStep.get_forward_step_func")


class GPTTrainStep(AbstractTrainStep):
    """The GPT train step (planned)."""

    def __init__(self, accelerator: Any, args: Any):
        raise _megatron("GPTTrainStep")

    def get_batch_func(self, accelerator: Any, megatron_dataset_flag: bool) -> NoReturn:
        raise _megatron("GPTTrainStep.get_batch_func")

    def get_loss_func(self, accelerator: Any) -> NoReturn:
        raise _megatron("GPTTrainStep.get_loss_func")

    def get_forward_step_func(self) -> NoReturn:
        raise _megatron("GPTTrainStep.get_forward_step_func")


class T5TrainStep(AbstractTrainStep):
    """The T5 train step (planned); its attention-mask helpers work."""

    def __init__(self, accelerator: Any, args: Any):
        raise _megatron("T5TrainStep")

    @staticmethod
    def attn_mask_postprocess(attention_mask: torch.Tensor) -> torch.Tensor:
        """A 2D padding mask ``[b, s]`` as the 3D mask ``[b, s, s]`` Megatron takes (True = masked out)."""
        return (attention_mask.unsqueeze(1) * attention_mask.unsqueeze(2)) < 0.5

    @staticmethod
    def get_decoder_mask(seq_length: int, device: Device) -> torch.Tensor:
        """The causal mask ``[1, s, s]`` (True = masked out)."""
        return torch.tril(torch.ones((1, seq_length, seq_length), device=device)) < 0.5

    @staticmethod
    def get_enc_dec_mask(attention_mask: torch.Tensor, dec_seq_length: int, device: Device) -> torch.Tensor:
        """The encoder-decoder mask ``[b, dec_seq_length, s]`` from the encoder's padding mask (True = masked out)."""
        batch_size = attention_mask.shape[0]
        return (torch.ones((batch_size, dec_seq_length, 1), device=device) * attention_mask.unsqueeze(1)) < 0.5

    def get_batch_func(self, accelerator: Any, megatron_dataset_flag: bool) -> NoReturn:
        raise _megatron("T5TrainStep.get_batch_func")

    def get_loss_func(self, accelerator: Any) -> NoReturn:
        raise _megatron("T5TrainStep.get_loss_func")

    def get_forward_step_func(self) -> NoReturn:
        raise _megatron("T5TrainStep.get_forward_step_func")


def finish_mpu_init() -> NoReturn:
    raise _megatron("finish_mpu_init")


def initialize(accelerator: Any, extra_args_provider: Optional[Callable[..., Any]] = None,
               args_defaults: Optional[dict] = None) -> NoReturn:
    raise _megatron("initialize")


class MegatronEngine(torch.nn.Module):
    """The Megatron model, optimizer and scheduler behind one module (planned)."""

    def __init__(self, accelerator: Any, model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any):
        raise _megatron("MegatronEngine")

    def get_module_config(self) -> NoReturn:
        raise _megatron("MegatronEngine.get_module_config")

    def train(self) -> NoReturn:
        raise _megatron("MegatronEngine.train")

    def eval(self) -> NoReturn:
        raise _megatron("MegatronEngine.eval")

    def get_batch_data_iterator(self, batch_data: NestedData) -> NoReturn:
        raise _megatron("MegatronEngine.get_batch_data_iterator")

    def train_step(self, **batch_data: Any) -> NoReturn:
        raise _megatron("MegatronEngine.train_step")

    def eval_step(self, **batch_data: Any) -> NoReturn:
        raise _megatron("MegatronEngine.eval_step")

    def forward(self, **batch_data: Any) -> NoReturn:
        raise _megatron("MegatronEngine.forward")

    def log_eval_results(self) -> NoReturn:
        raise _megatron("MegatronEngine.log_eval_results")

    def save_checkpoint(self, output_dir: Union[str, os.PathLike]) -> NoReturn:
        raise _megatron("MegatronEngine.save_checkpoint")

    def load_checkpoint(self, input_dir: Union[str, os.PathLike]) -> NoReturn:
        raise _megatron("MegatronEngine.load_checkpoint")


def avg_losses_across_data_parallel_group(losses: list[torch.Tensor]) -> NoReturn:
    raise _megatron("avg_losses_across_data_parallel_group")


def gather_across_data_parallel_groups(tensor: NestedData) -> NoReturn:
    raise _megatron("gather_across_data_parallel_groups")
