"""``ParallelismConfig``: the sizes of the data / tensor / context / sequence parallel dimensions, and their handlers.

A self-validating dataclass (Accelerate's ``ParallelismConfig``): unset sizes come from the launcher's environment
(``HASTEN_PARALLELISM_CONFIG_<SIZE>``, or ``ACCELERATE_PARALLELISM_CONFIG_<SIZE>`` / ``PARALLELISM_CONFIG_<SIZE>``),
then 1. The layout of the processes over these sizes, and the one ``DeviceMesh``, belong to ``ParallelDims``
(``dims.py``): the config keeps the layout laid out from it and asks it for the mesh (``device_mesh``,
``get_device_mesh``; named dimensions ``dp_replicate``, ``dp_shard``, ``cp``, ``tp``, plus the flattened ``dp``,
``dp_shard_cp``, ``dp_cp``).
Such a mesh can already be given to ``prepare_data_loader(torch_device_mesh=...)``.
"""
from __future__ import annotations

import copy
import os
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Literal, Optional, Union

from ..config.env_fields import as_bool, as_choice, as_int, from_env
from .dims import ParallelDims

if TYPE_CHECKING:
    import torch
    from torch.distributed.device_mesh import DeviceMesh

__all__ = [
    "TorchTensorParallelPlugin", "TorchContextParallelConfig", "DeepSpeedSequenceParallelConfig",
    "TorchTensorParallelConfig", "TorchPipelineParallelConfig", "ParallelismConfig", "SIZE_FIELDS",
    "check_size_combination",
]

SIZE_FIELDS = ("dp_replicate_size", "dp_shard_size", "tp_size", "cp_size", "sp_size")

_MESH_ORDER = ("pp", "dp_replicate", "dp_shard", "cp", "sp", "tp")
_PP_SCHEDULES = ("gpipe", "1f1b", "interleaved_1f1b")
_SP_ATTENTION = ("flash_attention_2", "flash_attention_3", "sdpa")


def _setting(owner: str, field: str, value, default, parse, name: Optional[str] = None):
    return from_env(owner, field, value, default, parse, setting=f"parallelism_config_{name or field}")


def check_size_combination(dp_replicate_size: int = 1, dp_shard_size: int = 1, tp_size: int = 1, cp_size: int = 1,
                           sp_size: int = 1) -> None:
    """Raise ``ValueError`` for sizes that cannot work together (also checked by ``hasten launch``)."""
    if cp_size > 1 and sp_size > 1:
        raise ValueError(f"Context parallelism and sequence parallelism exclude each other: got "
                         f"cp_size={cp_size} and sp_size={sp_size}; set one of them to 1.")
    if cp_size > 1 and dp_replicate_size > 1 and dp_shard_size == 1:
        raise ValueError("Context parallelism cannot be combined with pure data-parallel replication "
                         f"(dp_replicate_size={dp_replicate_size}, dp_shard_size=1): set dp_shard_size > 1 (FSDP + "
                         "CP, or HSDP + CP with dp_replicate_size > 1).")


@dataclass
class TorchTensorParallelPlugin:
    """Tensor parallelism with PyTorch DTensor: ``tp_size`` and, optionally, the device mesh to use."""

    tp_size: int = 1
    torch_device_mesh: Optional["torch.distributed.DeviceMesh"] = None

    def __post_init__(self):
        self.tp_size = as_int("TorchTensorParallelPlugin.tp_size", minimum=1)(self.tp_size)


@dataclass
class TorchContextParallelConfig:
    """Context parallelism (FSDP2-based): ``cp_comm_strategy`` is "allgather" (default) or "alltoall"."""

    cp_comm_strategy: Optional[str] = None

    def __post_init__(self):
        def strategy(value):
            try:
                return as_choice("TorchContextParallelConfig.cp_comm_strategy", ("allgather", "alltoall"))(value)
            except ValueError as error:  # the reference's key phrase first
                raise ValueError(f"Invalid cp_comm_strategy: {value}. {error}") from None

        self.cp_comm_strategy = _setting("TorchContextParallelConfig", "cp_comm_strategy", self.cp_comm_strategy,
                                         "allgather", strategy)


@dataclass
class DeepSpeedSequenceParallelConfig:
    """DeepSpeed (ALST / Ulysses) sequence parallelism.

    sp_seq_length: the sequence length when every batch has the same one; sp_seq_length_is_variable (default True)
    allows it to change between batches. sp_attn_implementation: "flash_attention_2", "flash_attention_3", "sdpa"
    or a hub-hosted flash-attention kernel ("kernels-community/flash-attn2").
    """

    sp_seq_length: Optional[int] = None
    sp_seq_length_is_variable: Optional[bool] = None
    sp_attn_implementation: Optional[str] = None

    def __post_init__(self):
        owner = "DeepSpeedSequenceParallelConfig"
        self.sp_seq_length_is_variable = _setting(owner, "sp_seq_length_is_variable", self.sp_seq_length_is_variable,
                                                  True, as_bool(f"{owner}.sp_seq_length_is_variable"))
        if self.sp_seq_length is not None or not self.sp_seq_length_is_variable:
            self.sp_seq_length = _setting(owner, "sp_seq_length", self.sp_seq_length, None,
                                          lambda v: None if str(v) == "None" else as_int(f"{owner}.sp_seq_length",
                                                                                          minimum=1)(v))
        if not self.sp_seq_length_is_variable and self.sp_seq_length is None:
            raise ValueError("With sp_seq_length_is_variable=False, give sp_seq_length (or set "
                             "HASTEN_PARALLELISM_CONFIG_SP_SEQ_LENGTH).")
        self.sp_attn_implementation = _setting(owner, "sp_attn_implementation", self.sp_attn_implementation, None,
                                               str)
        attention = self.sp_attn_implementation
        if attention is not None and attention not in _SP_ATTENTION and not (
                "/" in attention and "flash-attn" in attention):
            raise ValueError(f"Invalid sp_attn_implementation: {attention}. "
                             f"{owner}.sp_attn_implementation must be one of {list(_SP_ATTENTION)} or a hub-hosted "
                             f"flash attention kernel (e.g. 'kernels-community/flash-attn2'), got {attention!r} "
                             "('eager' and 'flex_attention' do not work with sequence parallelism).")


def _check_sequence_handler(handler, sp_size: int) -> None:
    """sp_backend='deepspeed' takes a DeepSpeedSequenceParallelConfig; a fixed sequence length must split evenly."""
    if not isinstance(handler, DeepSpeedSequenceParallelConfig):
        raise ValueError(f"sp_backend='deepspeed' needs a DeepSpeedSequenceParallelConfig sp_handler, got "
                         f"{type(handler).__name__}.")
    if not handler.sp_seq_length_is_variable and handler.sp_seq_length % sp_size:
        raise ValueError(f"sp_seq_length={handler.sp_seq_length} is not divisible by sp_size={sp_size}: with "
                         "sp_seq_length_is_variable=False every batch is that long and each rank of the group takes "
                         f"1/{sp_size} of it. Pad the batches to a multiple of {sp_size}, or set "
                         "sp_seq_length_is_variable=True.")


@dataclass
class TorchTensorParallelConfig:
    """Options of PyTorch tensor parallelism. ``enable_async_tp`` is accepted and ignored (as in Accelerate).

    tp_plan: how to split the model's modules over the ``tp`` dimension, ``{module name pattern: style}`` (``*``
        stands for a layer index; styles "colwise", "rowwise", "colwise_rep", "rowwise_rep", "sequence_parallel"
        or a torch ``ParallelStyle``). None: the model's own ``_tp_plan`` (transformers' convention).
    """

    enable_async_tp: bool = False
    tp_plan: Optional[dict] = None

    def __post_init__(self):
        if self.enable_async_tp:
            warnings.warn("Async tensor parallelism is not supported; enable_async_tp is ignored.")
        if self.tp_plan is not None and not isinstance(self.tp_plan, dict):
            raise TypeError(f"TorchTensorParallelConfig.tp_plan must be a dict {{module name pattern: style}}, got "
                            f"{type(self.tp_plan).__name__}.")


@dataclass
class TorchPipelineParallelConfig:
    """Options of pipeline parallelism (hasten's, on ``torch.distributed.pipelining``; see
    docs/pipeline-parallelism.md).

    schedule: "gpipe", "1f1b" (default) or "interleaved_1f1b". num_micro_batches: micro-batches per batch (default:
    the number of pipeline ranks x virtual_stages). split_points: names of the modules where stages 1, 2, ... begin
    (default: stages of about equal size). virtual_stages: stages per rank ("interleaved_1f1b"; default 2 for it, 1
    otherwise). loss_fn: ``loss_fn(outputs, target)``, the mean loss of one micro-batch, computed on the last stage.
    """

    schedule: str = "1f1b"
    num_micro_batches: Optional[int] = None
    split_points: Optional[list] = None
    virtual_stages: Optional[int] = None
    loss_fn: Optional[Callable] = None

    def __post_init__(self):
        self.schedule = as_choice("TorchPipelineParallelConfig.schedule", _PP_SCHEDULES, str.lower)(self.schedule)
        for name in ("num_micro_batches", "virtual_stages"):
            if getattr(self, name) is not None:
                setattr(self, name, as_int(f"TorchPipelineParallelConfig.{name}", minimum=1)(getattr(self, name)))
        if self.virtual_stages is None:
            self.virtual_stages = 2 if self.schedule == "interleaved_1f1b" else 1
        elif self.virtual_stages > 1 and self.schedule != "interleaved_1f1b":
            raise ValueError(f"virtual_stages={self.virtual_stages} needs schedule='interleaved_1f1b' (got "
                             f"{self.schedule!r}).")
        if self.loss_fn is not None and not callable(self.loss_fn):
            raise TypeError(f"TorchPipelineParallelConfig.loss_fn must be callable (outputs, target) -> loss, got "
                            f"{self.loss_fn!r}.")


@dataclass
class ParallelismConfig:
    """The sizes of the parallel dimensions; their product is the number of processes.

    dp_replicate_size: data-parallel replicas (DDP across replicas); dp_shard_size: the FSDP shard group.
    ``dp_replicate_size == 1, dp_shard_size > 1`` is FSDP; both > 1 is HSDP; pure replication uses DDP without
    this config. tp_size / cp_size / sp_size: tensor, context (backend "torch") and sequence (backend
    "deepspeed") parallel sizes; cp and sp exclude each other. The handlers carry each dimension's options.
    """

    dp_replicate_size: Optional[int] = None
    dp_shard_size: Optional[int] = None
    tp_size: Optional[int] = None
    cp_size: Optional[int] = None
    cp_backend: Literal["torch"] = None
    sp_size: Optional[int] = None
    sp_backend: Literal["deepspeed"] = None
    tp_handler: Union[None, TorchTensorParallelConfig] = None
    cp_handler: Union[None, TorchContextParallelConfig] = None
    sp_handler: Union[None, DeepSpeedSequenceParallelConfig] = None
    pp_size: Optional[int] = None  # hasten's: pipeline parallelism (torch.distributed.pipelining)
    pp_handler: Optional[TorchPipelineParallelConfig] = None

    _layout = None  # the ParallelDims laid out from this config (the mesh's one owner); a class attribute, not a field

    def __post_init__(self):
        owner = "ParallelismConfig"
        for dimension in ("dp_replicate", "dp_shard", "tp", "cp", "sp", "pp"):
            field = f"{dimension}_size"
            setattr(self, field, _setting(owner, field, getattr(self, field), 1,
                                          as_int(f"{owner}.{field}", minimum=1)))
        self.cp_backend = _setting(owner, "cp_backend", self.cp_backend, "torch",
                                   as_choice(f"{owner}.cp_backend", ("torch",)))
        self.sp_backend = _setting(owner, "sp_backend", self.sp_backend, "deepspeed",
                                   as_choice(f"{owner}.sp_backend", ("deepspeed",)))
        if self.tp_size > 1 and self.tp_handler is None:
            self.tp_handler = TorchTensorParallelConfig()
        if self.cp_size > 1:
            if self.cp_handler is None:
                self.cp_handler = TorchContextParallelConfig()
            elif not isinstance(self.cp_handler, TorchContextParallelConfig):
                raise ValueError(f"cp_backend='torch' needs a TorchContextParallelConfig cp_handler, got "
                                 f"{type(self.cp_handler).__name__}.")
        if self.sp_size > 1 and self.sp_handler is None:
            self.sp_handler = DeepSpeedSequenceParallelConfig()
        if self.sp_size > 1:
            _check_sequence_handler(self.sp_handler, self.sp_size)
        if self.pp_size > 1 and self.pp_handler is None:
            self.pp_handler = TorchPipelineParallelConfig()
        if self.pp_handler is not None and not isinstance(self.pp_handler, TorchPipelineParallelConfig):
            raise ValueError(f"pp_handler must be a TorchPipelineParallelConfig, got {type(self.pp_handler).__name__}.")
        check_size_combination(**{field: getattr(self, field) for field in SIZE_FIELDS})
        self._sizes = {"dp_replicate": self.dp_replicate_size, "dp_shard": self.dp_shard_size, "tp": self.tp_size,
                       "cp": self.cp_size, "sp": self.sp_size, "pp": self.pp_size}

    def to_json(self) -> dict:
        """The configuration as plain data (the handlers as dicts; the device mesh left out)."""
        return copy.deepcopy({key: dict(value.__dict__) if hasattr(value, "__dict__") else value
                              for key, value in self.__dict__.items() if key not in ("_layout", "_sizes")})

    @property
    def device_mesh(self) -> Optional[DeviceMesh]:
        """The ``DeviceMesh`` of this config's layout once it is built (by the Accelerator or ``get_device_mesh``);
        None before."""
        return self._layout.built_mesh if self._layout is not None else None

    @device_mesh.setter
    def device_mesh(self, mesh: Optional[DeviceMesh]) -> None:
        """Adopt a mesh built elsewhere: its dimensions must be the ones this config lays out."""
        if mesh is None:
            self._layout = None
            return
        self._run_layout(mesh.size()).adopt_mesh(mesh)

    def _run_layout(self, world_size: Optional[int] = None):
        """The layout of this config over the run's processes (the process group's, else ``WORLD_SIZE``)."""
        if world_size is None:
            import torch.distributed as dist

            world_size = (dist.get_world_size() if dist.is_available() and dist.is_initialized()
                          else int(os.environ.get("WORLD_SIZE", "1")))
        return ParallelDims.from_config(self, world_size)

    @property
    def dp_dim_names(self) -> list[str]:
        """Enabled dimensions over which data is split."""
        return [name for name, on in (("dp_replicate", self.dp_replicate_enabled),
                                      ("dp_shard", self.dp_shard_enabled)) if on]

    @property
    def non_dp_dim_names(self) -> list[str]:
        """Enabled dimensions whose ranks receive the same batch."""
        return [name for name, on in (("pp", self.pp_size > 1), ("tp", self.tp_enabled), ("cp", self.cp_enabled),
                                      ("sp", self.sp_enabled))
                if on]

    @property
    def dp_shard_cp_dim_names(self) -> list[str]:
        """Enabled dimensions flattened into the mesh FSDP shards the model over."""
        return [name for name, on in (("dp_shard", self.dp_shard_enabled), ("cp", self.cp_enabled)) if on]

    @property
    def dp_cp_dim_names(self) -> list[str]:
        """Enabled dimensions over which the loss is averaged."""
        return self.dp_dim_names + (["cp"] if self.cp_enabled else [])

    @property
    def fsdp_dim_names(self) -> list[str]:
        """Dimensions FSDP is applied over, data-parallel replication included."""
        return (["dp_replicate"] if self.dp_replicate_enabled else []) + ["dp_shard_cp"]

    @property
    def total_size(self) -> int:
        return self.dp_replicate_size * self.dp_shard_size * self.tp_size * self.cp_size * self.sp_size * self.pp_size

    @property
    def non_data_parallel_size(self) -> int:
        return self.tp_size * self.cp_size * self.sp_size * self.pp_size

    @property
    def data_parallel_size(self) -> int:
        return self.dp_replicate_size * self.dp_shard_size

    @property
    def dp_replicate_enabled(self) -> bool:
        return self.dp_replicate_size > 1

    @property
    def dp_shard_enabled(self) -> bool:
        return self.dp_shard_size > 1

    @property
    def tp_enabled(self) -> bool:
        return self.tp_size > 1

    @property
    def cp_enabled(self) -> bool:
        return self.cp_size > 1

    @property
    def sp_enabled(self) -> bool:
        return self.sp_size > 1

    @property
    def active_mesh_dims(self) -> list[str]:
        return self.dp_dim_names + self.non_dp_dim_names

    def build_device_mesh(self, device_type: str) -> Optional[DeviceMesh]:
        """A new ``DeviceMesh`` of the enabled dimensions (None when none is, or for DeepSpeed sequence parallelism,
        which builds its own groups), built by ``ParallelDims``. Needs ``total_size`` processes."""
        if self.sp_backend == "deepspeed" and self.sp_size > 1:
            return None
        if not self._get_mesh():
            return None
        dims = ParallelDims(dp_replicate=self.dp_replicate_size, dp_shard=self.dp_shard_size, cp=self.cp_size,
                            tp=self.tp_size, pp=self.pp_size, world_size=self.total_size)
        return dims.build_mesh(device_type)  # a world of another size is refused there, naming both

    def get_device_mesh(self, device_type: Optional[str] = None) -> Optional[DeviceMesh]:
        """The mesh of this config's layout, built on first use for ``device_type``; a later different
        ``device_type`` is an error."""
        mesh = self.device_mesh
        if mesh is None:
            if device_type is None:
                raise ValueError("Pass a device_type (e.g. 'cuda' or 'cpu') to build the device mesh.")
            if (self.sp_backend == "deepspeed" and self.sp_size > 1) or not self._get_mesh():
                return None
            return self._run_layout().build_mesh(device_type)
        if device_type is not None and mesh.device_type != device_type:
            raise ValueError(f"The device mesh was built for {mesh.device_type!r}, not {device_type!r}.")
        return mesh

    def _get_mesh(self) -> tuple:
        """``(dimension names, sizes)`` of the enabled dimensions in canonical order; ``()`` when none is."""
        dims = sorted(self.active_mesh_dims, key=_MESH_ORDER.index)
        return (tuple(dims), tuple(self._sizes[d] for d in dims)) if dims else ()

    def ignored_handlers(self) -> list:
        """The dimensions whose handler is set while their size is 1: the handler changes nothing (the Accelerator
        warns about each, as the reference does)."""
        return [name for name, size in self._sizes.items()
                if size == 1 and getattr(self, f"{name}_handler", None) is not None]
