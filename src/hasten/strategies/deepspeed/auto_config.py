"""The DeepSpeed config an engine is built from: every ``"auto"`` filled, every contradiction named.

A ``DeepSpeedPlugin`` holds the user's config (a file, a dict, or one built from the plugin's fields). Before an
engine is built, ``resolved_config`` copies it and fills each ``"auto"`` value from what the run knows:

=============================================  ==========================================================
``"auto"`` key                                 becomes
=============================================  ==========================================================
``train_micro_batch_size_per_gpu``             the prepared training loaders' batch size per data-parallel
                                               rank (the smallest with ``is_train_batch_min=True``, else
                                               the largest); with no loader prepared yet: an error
``gradient_accumulation_steps``                ``Accelerator(gradient_accumulation_steps=...)``
``train_batch_size``                           micro batch x accumulation steps x data-parallel size
``gradient_clipping``                          the plugin's ``gradient_clipping``, else 1.0 (DeepSpeed's own
                                               default); ``clip_grad_norm_(max_norm)`` replaces it at the
                                               step it is called
``fp16.enabled`` / ``bf16.enabled``            ``mixed_precision`` ("bf16" for fp8)
``zero_optimization.reduce_bucket_size``       hidden_size x hidden_size
``zero_optimization.stage3_prefetch_bucket_size``  0.9 x hidden_size x hidden_size
``zero_optimization.stage3_param_persistence_threshold``  10 x hidden_size
``optimizer.params.lr`` / ``weight_decay``     ``DummyOptim(lr=, weight_decay=)``
``scheduler.params.*`` (warmup / total steps)  ``DummyScheduler(warmup_num_steps=, total_num_steps=)``
=============================================  ==========================================================

``hidden_size`` is the model's ``config.hidden_size`` (or the largest of ``config.hidden_sizes``); a model
without one leaves those three keys to DeepSpeed's defaults (they are removed).

Each key goes through ``fill_auto`` (``config/deepspeed.py``), the filler ``DeepSpeedPlugin.fill_match`` uses too.
Where the public ``deepspeed_config_process`` raises on a mismatch, this path keeps the config's value: the batch
sizes and accumulation steps the config sets differently from the run are used, and one warning names each key,
the config's value, the run's value and where the run's came from. The other keys (clipping, precision, bucket
sizes, the placeholders' values) only fill ``"auto"``: a set value is kept without comparing, since the run's
side there is a default rather than a choice. Batch sizes that do not multiply out are refused before the engine
is built (DeepSpeed cannot run them).
"""
from __future__ import annotations

import copy
import logging
from typing import TYPE_CHECKING, Any, Iterable, Optional, Union

from ...config.deepspeed import config_node, fill_auto

if TYPE_CHECKING:
    import torch
    from torch import nn
    from torch.utils.data import DataLoader

    from ...config.deepspeed import DeepSpeedPlugin
    from .wrappers import DummyOptim

__all__ = ["resolved_config", "check_plugin_config", "hidden_size_of", "micro_batch_size"]

logger = logging.getLogger(__name__)

_STAGES = (0, 1, 2, 3)
_OFFLOAD_DEVICES = ("none", "cpu", "nvme")


def _get(config: dict, dotted: str, default=None):
    node, key = config_node(config, dotted)
    return default if node is None else node.get(key, default)


def check_plugin_config(config: dict, device_type: str, mixed_precision: str, what: str = "DeepSpeed config",
                        engine_precision: bool = True) -> None:
    """Refuse what no engine can run, before anything is built: an unknown ZeRO stage, an offload device without
    its nvme path or outside none|cpu|nvme, fp16 on a CPU. Offload settings the stage ignores (parameters below
    stage 3, the optimizer at stage 0) are warned about: DeepSpeed trains without them, as in the reference.
    ``engine_precision=False`` (the Accelerator being made) leaves fp16 on a CPU to ``prepare``: the config can
    still be read and filled, as the reference allows; only building the engine would fail."""
    stage = _get(config, "zero_optimization.stage", 0)
    if stage != "auto" and (isinstance(stage, bool) or stage not in _STAGES):
        raise ValueError(f"{what}: zero_optimization.stage={stage!r} is not a ZeRO stage: use 0, 1, 2 or 3.")
    for kind in ("offload_optimizer", "offload_param"):
        device = _get(config, f"zero_optimization.{kind}.device", "none")
        device = "none" if device is None else str(device).lower()
        if device not in _OFFLOAD_DEVICES:
            raise ValueError(f"{what}: zero_optimization.{kind}.device={device!r}: use none, cpu or nvme.")
        if device == "nvme" and _get(config, f"zero_optimization.{kind}.nvme_path") in (None, "none", ""):
            raise ValueError(
                f"{what}: zero_optimization.{kind}.device is 'nvme' and no nvme_path is given: set "
                f"zero_optimization.{kind}.nvme_path (DeepSpeedPlugin({kind}_nvme_path=...)) to a folder on the "
                "NVMe drive.")
        if device != "none" and kind == "offload_param" and stage not in (3, "auto"):
            logger.warning("%s: offload_param only takes effect with ZeRO stage 3 (the stage is %s); DeepSpeed "
                           "ignores it and keeps the parameters on the device. Use zero_stage=3 to offload them.",
                           what, stage)
        if device != "none" and kind == "offload_optimizer" and stage == 0:
            logger.warning("%s: offload_optimizer is a ZeRO stage 1-3 feature (the stage is 0); DeepSpeed trains "
                           "without partitioning the optimizer.", what)
    if engine_precision:
        check_engine_precision(config, device_type, mixed_precision)


def check_engine_precision(config: dict, device_type: str, mixed_precision: str) -> None:
    """DeepSpeed builds no fp16 engine on a CPU (its loss scaler needs a GPU): said before it is asked to."""
    fp16 = str(_get(config, "fp16.enabled", False)).lower() == "true" or mixed_precision == "fp16"
    if fp16 and device_type == "cpu":
        raise ValueError(
            "DeepSpeed refuses fp16 on the CPU (its loss scaler and fused kernels need a GPU): use "
            "mixed_precision='bf16' (or fp32) on CPUs, or run on a GPU.")


_HIDDEN_SIZE_KEYS = ("reduce_bucket_size", "stage3_prefetch_bucket_size", "stage3_param_persistence_threshold")


def _hidden_size_for_auto_buckets(config: dict, model) -> Optional[int]:
    """The hidden size that fills the config's ``"auto"`` bucket sizes (None when none is ``"auto"`` or no model is
    given). A model without a transformers-style config, or whose config has no hidden size, cannot fill them: as in
    the reference, that is refused, saying which values to set by hand."""
    zero = config.get("zero_optimization") or {}
    auto = [key for key in _HIDDEN_SIZE_KEYS if zero.get(key) == "auto"]
    if not auto or model is None:
        return None
    if getattr(model, "config", None) is None:
        raise ValueError(
            "Can't find `model.config` entry, please specify the values manually in the DeepSpeed config instead of "
            f"'auto': zero_optimization.{', zero_optimization.'.join(auto)} are computed from a transformers-style "
            "model.config.hidden_size, and this model has no config.")
    hidden = hidden_size_of(model)
    if hidden is None:
        raise ValueError(
            "Can find neither `model.config.hidden_size` nor `model.config.hidden_sizes`, please specify the values "
            f"manually in the DeepSpeed config instead of 'auto': zero_optimization.{', zero_optimization.'.join(auto)}.")
    return hidden


def hidden_size_of(model: nn.Module) -> Optional[int]:
    """The model's hidden size from its ``config`` (transformers' convention), or None."""
    config = getattr(model, "config", None)
    if config is None:
        return None
    size = getattr(config, "hidden_size", None)
    if size is None and getattr(config, "hidden_sizes", None):
        size = max(config.hidden_sizes)
    return int(size) if size is not None else None


def micro_batch_size(loaders: Iterable[DataLoader], data_parallel_size: int,
                     is_train_batch_min: bool) -> Optional[int]:
    """The batch size each data-parallel rank takes per step, from the prepared loaders (None without any)."""
    sizes = []
    for loader in loaders:
        total = getattr(loader, "total_batch_size", None)
        if total is None:
            batch = getattr(loader, "batch_size", None)
            total = batch * data_parallel_size if batch else None
        if total:
            sizes.append(max(1, total // data_parallel_size))
    if not sizes:
        return None
    return min(sizes) if is_train_batch_min else max(sizes)


class _Filler:
    """Fills the ``"auto"`` values of ``config`` through ``fill_auto``; a set value that differs from the run's is
    kept (the config wins) and recorded in ``conflicts`` (``ConfigMismatch`` records), to be named in one warning."""

    def __init__(self, config: dict):
        self.config = config
        self.conflicts: list = []

    def fill(self, dotted: str, value, source: str, must_match: bool = True) -> None:
        """``value`` None: the run does not know it (an ``"auto"`` there raises). ``must_match=False``: the value
        only fills ``"auto"``, a set value is kept without comparing."""
        mismatch = fill_auto(self.config, dotted, {} if value is None else {dotted: value}, source=source,
                             compare=must_match)
        if mismatch is not None:
            self.conflicts.append(mismatch)

    def drop_auto(self, dotted: str) -> None:
        node, key = config_node(self.config, dotted)
        if node is not None and node.get(key) == "auto":
            del node[key]

    def warn_conflicts(self) -> None:
        """One warning naming every recorded conflict: the key, the config's value (used), the run's and its
        source."""
        if self.conflicts:
            lines = [f"{c.key}={c.config_value!r} in the DeepSpeed config (used) vs {c.other_value!r} from {c.source}"
                     for c in self.conflicts]
            logger.warning("The DeepSpeed config sets values that differ from the run; the config's are used:\n- "
                           + "\n- ".join(lines) + "\nSet them to 'auto' in the config to take the run's.")


def write_back_filled_values(plugin_config: dict, resolved: dict) -> None:
    """Replace each ``"auto"`` of the plugin's own config by the value ``resolved`` filled it with, in place, as the
    reference does once its engine is built: scripts read the run's values there after ``prepare`` (the micro batch
    size, to give a second plugin the same), and the plugin's next engine starts from them."""
    for key, value in plugin_config.items():
        if isinstance(value, dict) and isinstance(resolved.get(key), dict):
            write_back_filled_values(value, resolved[key])
        elif value == "auto" and key in resolved and resolved[key] != "auto":
            plugin_config[key] = resolved[key]


def resolved_config(plugin: DeepSpeedPlugin, *, model: Optional[nn.Module] = None,
                    optimizer: Optional[Union[torch.optim.Optimizer, DummyOptim]] = None, scheduler: Any = None,
                    loaders: Iterable[DataLoader] = (), accumulation_steps: int = 1, data_parallel_size: int = 1,
                    mixed_precision: str = "no", device_type: str = "cpu",
                    loader_processes: Optional[int] = None) -> dict:
    """A copy of ``plugin``'s config with every ``"auto"`` filled (see the module's table). A value the config sets
    differently from the run is kept and named in one warning; batch sizes that do not multiply out raise."""
    from .wrappers import DummyOptim, DummyScheduler

    config = copy.deepcopy(plugin.deepspeed_config)
    config.pop("steps_per_print", None)
    config["steps_per_print"] = 2 ** 62  # DeepSpeed would print a line every few steps
    config.setdefault("zero_allow_untested_optimizer", True)  # any torch optimizer the script built (SGD, ...)
    if not getattr(plugin, "_accumulation_given", True):  # a config file without it: the Accelerator's
        config["gradient_accumulation_steps"] = "auto"
    check_plugin_config(config, device_type, mixed_precision, engine_precision=False)  # precision: once filled
    filler = _Filler(config)
    # loader_processes: the processes the loaders are sharded over when not DeepSpeed's data-parallel ones (all of
    # them under sequence parallelism)
    micro = micro_batch_size(loaders, loader_processes or data_parallel_size, plugin.is_train_batch_min)
    if micro is None and config.get("train_micro_batch_size_per_gpu", "auto") == "auto":
        if isinstance(config.get("train_batch_size"), int) and not isinstance(config.get("train_batch_size"), bool):
            micro = config["train_batch_size"] // max(1, accumulation_steps * data_parallel_size)
        elif model is not None and optimizer is None:
            micro = 1  # an inference engine: the batch size only sizes buffers
        else:
            raise ValueError(
                "The DeepSpeed config's train_micro_batch_size_per_gpu is 'auto' and no training DataLoader has been "
                "prepared to tell it: pass the loader to the same prepare() call as the model (or earlier), or set "
                "train_micro_batch_size_per_gpu in the DeepSpeed config.")
    filler.fill("train_micro_batch_size_per_gpu", micro, "the prepared DataLoader's batch size per process")
    filler.fill("gradient_accumulation_steps", accumulation_steps, "Accelerator(gradient_accumulation_steps=...)")
    micro_value, steps_value = config.get("train_micro_batch_size_per_gpu"), config.get("gradient_accumulation_steps")
    if isinstance(micro_value, int) and isinstance(steps_value, int):  # the values the engine will use
        filler.fill("train_batch_size", micro_value * steps_value * data_parallel_size,
                    f"micro batch {micro_value} x accumulation {steps_value} x {data_parallel_size} "
                    "data-parallel processes")
    clipping = plugin.gradient_clipping if plugin.gradient_clipping not in (None, "auto") else 1.0
    filler.fill("gradient_clipping", clipping, "DeepSpeedPlugin(gradient_clipping=...)", must_match=False)
    plugin_precision = {"fp16.enabled": mixed_precision == "fp16", "bf16.enabled": mixed_precision in ("bf16", "fp8")}
    for dotted, value in plugin_precision.items():
        filler.fill(dotted, value, f"mixed_precision={mixed_precision!r}", must_match=False)
    hidden = _hidden_size_for_auto_buckets(config, model)
    for dotted, value in (("zero_optimization.reduce_bucket_size", None if hidden is None else hidden * hidden),
                          ("zero_optimization.stage3_prefetch_bucket_size",
                           None if hidden is None else int(0.9 * hidden * hidden)),
                          ("zero_optimization.stage3_param_persistence_threshold",
                           None if hidden is None else 10 * hidden)):
        if hidden is None:
            filler.drop_auto(dotted)  # an "auto" left only without a model (optimizer alone): DeepSpeed's defaults
        else:
            filler.fill(dotted, value, f"the model's hidden_size {hidden}", must_match=False)
    # the placeholders' values fill "auto" only: a number the config sets is the config's (a DummyScheduler's
    # defaults say nothing; transformers' Trainer fills the config itself)
    if isinstance(optimizer, DummyOptim):
        filler.fill("optimizer.params.lr", optimizer.lr, "DummyOptim(lr=...)", must_match=False)
        filler.fill("optimizer.params.weight_decay", optimizer.weight_decay, "DummyOptim(weight_decay=...)",
                    must_match=False)
    if isinstance(scheduler, DummyScheduler):
        for key in ("warmup_num_steps", "warmup_max_lr", "warmup_min_lr", "total_num_steps"):
            value = getattr(scheduler, key, None) if hasattr(scheduler, key) else scheduler.kwargs.get(key)
            if key == "warmup_max_lr" and value is None and isinstance(optimizer, DummyOptim):
                value = optimizer.lr
            if key == "warmup_min_lr" and value is None:
                value = 0
            if key == "warmup_num_steps" and value == 0:
                # DummyScheduler's default. DeepSpeed's warm-up schedulers ran 0 as a 2-step warm-up; recent versions
                # refuse it ("must be a positive integer"): 1 keeps the schedule the older versions ran for 0.
                value = 1
            filler.fill(f"scheduler.params.{key}", value, f"DummyScheduler({key}=...)", must_match=False)
    _check_batch_sizes(config, data_parallel_size)
    check_engine_precision(config, device_type, mixed_precision)
    filler.warn_conflicts()
    return config


def _check_batch_sizes(config: dict, data_parallel_size: int) -> None:
    """DeepSpeed asserts train_batch_size = micro batch x accumulation x data-parallel processes when it builds the
    engine; said here, before anything is built, with the numbers."""
    values = [config.get(key) for key in ("train_batch_size", "train_micro_batch_size_per_gpu",
                                          "gradient_accumulation_steps")]
    if all(isinstance(value, int) and not isinstance(value, bool) for value in values):
        total, micro, steps = values
        if total != micro * steps * data_parallel_size:
            raise ValueError(
                f"The DeepSpeed config's batch sizes do not multiply out: train_batch_size={total}, but "
                f"train_micro_batch_size_per_gpu={micro} x gradient_accumulation_steps={steps} x {data_parallel_size} "
                "data-parallel processes = " f"{micro * steps * data_parallel_size}. Set train_batch_size (or the "
                "others) to 'auto', or make them agree.")

