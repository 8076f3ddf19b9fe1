"""DeepSpeed sequence parallelism (ALST / Ulysses) for transformers models, on DeepSpeed's own building blocks.

``ParallelismConfig(sp_backend="deepspeed", sp_size=N)`` with a DeepSpeed plugin splits every sequence over the N
ranks of a sequence-parallel group. DeepSpeed provides the machinery (``deepspeed.runtime.sequence_parallel.
ulysses_sp``):

- ``UlyssesSPAttentionHF.register_with_transformers`` builds the sequence-parallel groups (its ``mpu``, handed to
  ``deepspeed.initialize``) and wraps the transformers attention function the model runs, so that each attention
  call trades the sequence split for a split over the heads (an all-to-all before and after);
- ``UlyssesSPDataLoaderAdapter`` wraps a loader sharded over every process: each rank's batch is gathered by the
  group and cut along the sequence, so the group trains one rank's batch after the other, and the labels become
  ``shift_labels`` (cut at the same places).

What this module adds is the checking before any of that runs (``SequenceParallel.from_layout`` when the strategy
is built, ``check_model`` before the groups are made), one registration per process (the attention wrapper and
DeepSpeed's groups are process-wide), the gradient scale (``loss_scale``), and the loss aggregation the ALST
recipe uses (``sequence_parallel_loss``).

The gradient scale: with the recipe's loss (every rank of the group holds the whole, token-weighted loss),
ZeRO-3's reduce-scatter averages the gradients over the group and gives the gradient of that loss, while stages
0-2 (and ZeRO-3's all-reduce path) sum over the group, which gives ``sp_size`` times it. hasten divides the loss by
``sp_size`` under stages 0-2 so every stage trains like one process on the same batches (measured in
tests/strategies/deepspeed/check_sequence_parallel.py); ZeRO-3 without ``reduce_scatter`` mixes both per bucket
and is refused.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Optional

import torch

if TYPE_CHECKING:
    from deepspeed.runtime.sequence_parallel.ulysses_sp import UlyssesSPDataLoaderAdapter
    from torch import nn
    from torch.distributed import ProcessGroup
    from torch.utils.data import DataLoader

    from ...parallel import ParallelDims

__all__ = ["SequenceParallel", "sequence_parallel_loss", "MIN_DEEPSPEED"]

#: DeepSpeed's first release with ALST / Ulysses for transformers (the reference asks for it too)
MIN_DEEPSPEED = "0.18.2"
_MASK_ATTENTION = ("eager", "paged|eager")  # build a 4D mask, which Ulysses drops: cannot be split
# one registration per process: the attention wrapper is written into transformers' table and DeepSpeed's groups
# are module-level, so a later Accelerator in the same process reuses them when it asks for the same things
_REGISTERED: dict = {}


@dataclass
class SequenceParallel:
    """The sequence-parallel part of a DeepSpeed run: ``size`` ranks per group, the handler's options."""

    size: int
    seq_length: Optional[int]
    seq_length_is_variable: bool
    attn_implementation: Optional[str]
    mpu: object = None  # DeepSpeed's parallel_state_sp, once registered

    @classmethod
    def from_layout(cls, dims: Optional[ParallelDims]) -> Optional[SequenceParallel]:
        """The settings of ``dims`` (a ``ParallelDims``) when it asks for sequence parallelism, else None; what
        cannot work is refused here, before DeepSpeed makes any group."""
        if dims is None or dims.sp == 1:
            return None
        others = [f"{name}_size={getattr(dims, name)}" for name in ("tp", "cp", "pp") if getattr(dims, name) > 1]
        if others:
            raise ValueError(f"DeepSpeed sequence parallelism (sp_size={dims.sp}) cannot be combined with "
                             f"{', '.join(others)}: set them to 1 (data parallelism, dp_replicate_size / "
                             "dp_shard_size, combines with it).")
        from ...core.versions import compare_versions

        if not compare_versions("deepspeed", ">=", MIN_DEEPSPEED):
            raise ImportError(f"Deepspeed ALST/Ulysses requires deepspeed>={MIN_DEEPSPEED}: pip install -U deepspeed.")
        import importlib.util

        if importlib.util.find_spec("transformers") is None:
            raise ImportError("DeepSpeed sequence parallelism (Ulysses) works on transformers models: pip install "
                              "transformers.")
        config = getattr(dims, "_config", None)
        handler = getattr(config, "sp_handler", None)
        if handler is None:
            from ...parallel.config import DeepSpeedSequenceParallelConfig

            handler = DeepSpeedSequenceParallelConfig()
        return cls(size=dims.sp, seq_length=handler.sp_seq_length,
                   seq_length_is_variable=bool(handler.sp_seq_length_is_variable),
                   attn_implementation=handler.sp_attn_implementation)

    # ------------------------------------------------------------ before the groups exist
    def check_model(self, model: nn.Module) -> str:
        """Refuse a model Ulysses cannot split; returns the attention implementation to wrap."""
        config = getattr(model, "config", None)
        if config is None or not hasattr(config, "get_text_config"):
            raise ValueError(
                f"DeepSpeed sequence parallelism (Ulysses) works on transformers models: UlyssesSPAttentionHF "
                f"expects the model object to have a config attribute (a transformers PretrainedConfig), and this "
                f"{type(model).__name__} has {'none' if config is None else 'one that is not a PretrainedConfig'}.")
        text = config.get_text_config()
        heads = getattr(text, "num_attention_heads", None)
        kv_heads = getattr(text, "num_key_value_heads", None)
        missing = [name for name, value in (("num_attention_heads", heads), ("num_key_value_heads", kv_heads))
                   if not isinstance(value, int)]
        if missing:
            raise ValueError(f"DeepSpeed sequence parallelism splits the attention heads, and the config of this "
                             f"{type(model).__name__} has no {' / '.join(missing)}: use a transformers attention "
                             "model (Llama, Mistral, Qwen ...).")
        if heads % self.size:
            raise ValueError(f"sp_size={self.size} does not divide the model's {heads} attention heads "
                             f"(num_attention_heads): Ulysses gives each rank of the group heads/sp_size heads. Use an "
                             f"sp_size that divides {heads}.")
        if kv_heads % self.size and self.size % kv_heads:
            raise ValueError(f"sp_size={self.size} and the model's {kv_heads} key/value heads (num_key_value_heads) "
                             "do not divide one another: Ulysses needs one to be a multiple of the other.")
        recurrent = sorted({kind for kind in (getattr(text, "layer_types", None) or [])
                            if "linear_attention" in str(kind)})
        if recurrent:
            raise ValueError(
                f"Sequence parallelism does not support attention layers of type {recurrent} ({type(model).__name__}):"
                " they carry a state along the sequence outside the attention function Ulysses wraps, so each rank "
                "would restart it and the gradients would be wrong. Use a full-attention model, or sp_size=1.")
        running = getattr(config, "_attn_implementation", None)
        wanted = self.attn_implementation or running
        if wanted in _MASK_ATTENTION or wanted is None:
            raise ValueError(
                f"The model runs {running!r} attention, which Ulysses cannot split (it needs a 4D attention mask): "
                "build the model with attn_implementation='sdpa' (or a flash attention) and set "
                "DeepSpeedSequenceParallelConfig(sp_attn_implementation=...) to the same.")
        if running is not None and running != wanted:
            raise ValueError(
                f"sp_attn_implementation={wanted!r} does not match model config attn_implementation={running!r}: "
                "Ulysses wraps the attention function the model calls, so set both to the same value (build the "
                f"model with attn_implementation={wanted!r}, or set sp_attn_implementation={running!r}).")
        return wanted

    @staticmethod
    def check_engine_config(config: dict) -> None:
        """Refuse an engine config whose gradient reduction mixes sums and averages over the group."""
        zero = config.get("zero_optimization", {}) or {}
        if zero.get("stage", 0) == 3 and zero.get("reduce_scatter", True) is False:
            raise ValueError(
                "ZeRO-3 with zero_optimization.reduce_scatter=false reduces some gradient buckets as a sum over the "
                "sequence-parallel group and others as an average, so the gradients would be scaled unevenly: keep "
                "reduce_scatter true (the default) with sequence parallelism.")

    def loss_scale(self, config: dict) -> float:
        """What the loss is multiplied by before the engine's backward, so the gradients are those of one
        process (module docstring): 1/sp_size where the engine sums over the group, else 1."""
        return 1.0 if (config.get("zero_optimization", {}) or {}).get("stage", 0) == 3 else 1.0 / self.size

    # ------------------------------------------------------------ the groups and the attention wrapper
    def register(self, model: nn.Module, micro_batch_size: int) -> ModuleType:
        """DeepSpeed's ``mpu`` with the model's attention wrapped (once per process; a later call with the same
        settings reuses it)."""
        attention = self.check_model(model)
        settings = {"sequence_parallel_size": self.size, "core_attn_implementation": attention,
                    "seq_length": self.seq_length, "seq_length_is_variable": self.seq_length_is_variable,
                    "micro_batch_size": micro_batch_size}
        if _REGISTERED:
            if _REGISTERED["settings"] != settings:
                differ = [f"{key}={_REGISTERED['settings'][key]!r} then {value!r}" for key, value in settings.items()
                          if _REGISTERED["settings"][key] != value]
                raise ValueError("DeepSpeed sequence parallelism is set up once per process (its groups and the "
                                 "attention wrapper are process-wide), and this model asks for other settings: "
                                 + "; ".join(differ) + ".")
            self.mpu = _REGISTERED["mpu"]
            return self.mpu
        from deepspeed.runtime.sequence_parallel.ulysses_sp import UlyssesSPAttentionHF

        extra = {}
        if "disable_in_eval" in inspect.signature(UlyssesSPAttentionHF.register_with_transformers).parameters:
            extra["disable_in_eval"] = True  # evaluation runs whole sequences, as the reference sets it
        self.mpu = UlyssesSPAttentionHF.register_with_transformers(model_name_or_path=model, **settings, **extra)
        _REGISTERED.update(settings=settings, mpu=self.mpu)
        return self.mpu

    @property
    def group(self) -> ProcessGroup:
        """The sequence-parallel process group of this rank (after the first model was prepared)."""
        if self.mpu is None:
            raise ValueError("The sequence-parallel groups exist once a model is prepared: call accelerator.prepare("
                             "model, optimizer, loader) first.")
        return self.mpu.get_sequence_parallel_group()

    def adapt(self, loader: DataLoader, device: torch.device) -> UlyssesSPDataLoaderAdapter:
        """``loader`` (sharded over every process) fed to the group through DeepSpeed's adapter."""
        group = self.group
        return _adapter_class()(loader, sp_rank=self.mpu.get_sequence_parallel_rank(), sp_group=group,
                                sp_world_size=self.mpu.get_sequence_parallel_world_size(), device=device)


_ADAPTER: list = []


def _adapter_class():
    """DeepSpeed's ``UlyssesSPDataLoaderAdapter``, telling hasten's loader its end on the right micro-batch, with
    contiguous tensors.

    The adapter takes one batch from the loader it wraps and yields sp_size micro-batches from it, so that loader
    says "last batch" (``end_of_dataloader``, which ends an accumulation cycle) sp_size micro-batches early; here it
    says so on the adapter's last micro-batch only.

    Each micro-batch's tensors are this rank's columns of the gathered batch: views, whose ``.cpu()`` copies them
    only when they come from an accelerator. On a CPU, with more than one sequence per batch, they stay
    non-contiguous and transformers' loss (``shift_labels.view(-1)``) fails, so they are made contiguous here.
    """
    if not _ADAPTER:
        from deepspeed.runtime.sequence_parallel.ulysses_sp import UlyssesSPDataLoaderAdapter

        class SequenceParallelLoader(UlyssesSPDataLoaderAdapter):
            _source_ended = False

            def __next__(self):
                refilled = not self.micro_batches
                batch = super().__next__()
                batch = {key: value.contiguous() if torch.is_tensor(value) else value for key, value in batch.items()}
                if hasattr(self.dl, "end_of_dataloader"):
                    if refilled:
                        self._source_ended = bool(self.dl.end_of_dataloader)
                    self.dl.end_of_dataloader = self._source_ended and not self.micro_batches
                return batch

        _ADAPTER.append(SequenceParallelLoader)
    return _ADAPTER[0]


def sequence_parallel_loss(loss: torch.Tensor, shift_labels: torch.Tensor, group: Optional[ProcessGroup],
                           ignore_index: int = -100) -> torch.Tensor:
    """The loss of the whole sequence from each rank's mean loss over its shard: the ranks' losses weighted by
    their counted tokens (``shift_labels != ignore_index``), gathered differentiably over ``group``; a rank with no
    counted token adds nothing."""
    import torch.distributed.nn.functional as distributed

    losses = distributed.all_gather(loss, group=group)
    counted = (shift_labels != ignore_index).view(-1).sum()
    counts = distributed.all_gather(counted, group=group)
    start = torch.zeros((), dtype=loss.dtype, device=loss.device)
    total = sum((part * count for part, count in zip(losses, counts) if count > 0), start)
    return total / max(sum(counts), 1)
