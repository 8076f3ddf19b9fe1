"""The traced memory a plan is built from: training steps on fake tensors, scaled from a few layers to the model's.

A ``Tracer`` runs ``training_step_memory`` (one device) and ``fsdp2_step_memory`` (one rank of FSDP2 over the fake
process group) for one model and one step shape, and keeps each result. A model whose depth can be chosen
(``ModelSource.layers``) is traced with 2 and 3 blocks, and every part of each phase's peak (forward and backward;
optimizer step) is extended linearly to the model's depth: the blocks repeat, so what one more block adds is what
each adds (when the peaks at 2 and 3 blocks are different moments of the phase, 3 and 4 blocks are traced instead);
the highest phase at that depth is the peak (tests/planning check the scaling against a trace of the
whole model). With ``search``, a trace at micro-batch 1 and 2 gives the same line in the
micro-batch size. Each trace takes seconds whatever the model's size: nothing is allocated.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Callable, Optional

import torch
from torch import nn

from .fsdp1_memory import fsdp1_step_memory
from .launch_config import FSDP1_OPTIONS
from .model_source import ModelSource, PlanInputError
from .sharded_memory import fsdp2_step_memory
from .step_memory import AUTOCAST_DTYPES, MemoryBreakdown, highest, training_step_memory

__all__ = ["StepShape", "Tracer", "OPTIMIZERS", "extend"]

#: the optimizers a plan knows: name -> (class in torch.optim, its arguments). On one device PyTorch's multi-tensor
#: (foreach) implementations, the default on a GPU, are traced: their temporaries are part of the step. Under FSDP2
#: the per-tensor step is traced (``foreach`` dropped): on fake DTensors the multi-tensor step is not traced
#: faithfully by PyTorch today (it reports more optimizer state than the unsharded model has).
OPTIMIZERS = {
    "adamw": ("AdamW", {"foreach": True}),
    "adam": ("Adam", {"foreach": True}),
    "sgd": ("SGD", {"lr": 0.01, "foreach": True}),
    "sgd_momentum": ("SGD", {"lr": 0.01, "momentum": 0.9, "foreach": True}),
    "adafactor": ("Adafactor", {"foreach": True}),
    "adam8bit": ("SGD", {"lr": 0.01, "foreach": True}),  # bitsandbytes' state added by the plan (ADAM8BIT_STATE)
}
#: bytes of bitsandbytes' 8-bit Adam state per parameter: two 8-bit moments and a float32 scale per block of 256
ADAM8BIT_STATE = 2 * (1 + 4 / 256)
#: optimizer steps traced: the first creates the optimizer state, the second runs with it (the steady state)
STEPS = 2


@dataclass(frozen=True)
class StepShape:
    """What one training step of the run looks like."""

    micro_batch_size: int
    seq_len: int
    mixed_precision: str = "bf16"
    optimizer: str = "adamw"
    activation_checkpointing: bool = False
    gradient_accumulation_steps: int = 1


def extend(small: MemoryBreakdown, larger: MemoryBreakdown, small_at: int, larger_at: int,
           target: int) -> MemoryBreakdown:
    """Every part of the peak on the line through ``small`` (at ``small_at``) and ``larger`` (at ``larger_at``),
    read at ``target`` (never below zero)."""
    values = {}
    for item in fields(MemoryBreakdown):
        low, high = getattr(small, item.name), getattr(larger, item.name)
        slope = (high - low) / (larger_at - small_at)
        values[item.name] = max(0, round(low + slope * (target - small_at)))
    return MemoryBreakdown(**values)


#: the parts that say at which moment of a phase its peak is: the model's state only grows with the depth
_MOMENT_PARTS = ("activations", "temporaries", "other", "gathered_parameters", "gathered_gradients", "communication",
                 "gradients", "optimizer_state")


def _same_moment(small: MemoryBreakdown, larger: MemoryBreakdown) -> bool:
    """Whether two depths' peaks of a phase are the same moment of it: every part present in both or in neither,
    and none shrinking as a block is added."""
    for name in _MOMENT_PARTS:
        low, high = getattr(small, name), getattr(larger, name)
        if (low == 0) != (high == 0) or high < low:
            return False
    return True


def _optimizer(name: str, sharded: bool = False) -> Callable[..., torch.optim.Optimizer]:
    if name not in OPTIMIZERS:
        raise PlanInputError(f"Unknown optimizer {name!r}: choose among {', '.join(OPTIMIZERS)}.")
    class_name, arguments = OPTIMIZERS[name]
    if sharded:
        arguments = {key: value for key, value in arguments.items() if key != "foreach"}
    optimizer_class = getattr(torch.optim, class_name, None)
    if optimizer_class is None:
        raise PlanInputError(f"torch {torch.__version__} has no torch.optim.{class_name} (optimizer {name!r}).")
    return lambda parameters: optimizer_class(parameters, **arguments)


class Tracer:
    """Traces of ``source`` stepped as ``shape`` says, each computed once (see the module docstring)."""

    def __init__(self, source: ModelSource, shape: StepShape, search: bool = False):
        self.source = source
        self.shape = shape
        self.search = search  # micro-batches past 2 from the line through 1 and 2 (``_peak``)
        self.optimizer = _optimizer(shape.optimizer)
        self.sharded_optimizer = _optimizer(shape.optimizer, sharded=True)
        self._done: dict[tuple, dict[str, MemoryBreakdown]] = {}
        self._block: Optional[int] = None
        self._blocks: Optional[list[str]] = None

    def exactly(self) -> "Tracer":
        """This tracer tracing every micro-batch size it is asked about (no line through 1 and 2), sharing the
        traces made so far."""
        exact = Tracer(self.source, self.shape, search=False)
        exact._done, exact._block, exact._blocks = self._done, self._block, self._blocks
        return exact

    # the model, as each layout builds it
    def _builder(self, depth: Optional[int], narrowed_by: int, weights_dtype: Optional[torch.dtype],
                 checkpointed: bool) -> Callable[[], nn.Module]:
        def build() -> nn.Module:
            model = self.source.build(depth, narrowed_by, weights_dtype or torch.float32)
            dtype = AUTOCAST_DTYPES.get(self.shape.mixed_precision)
            if weights_dtype is None and dtype is not None:
                from ..precision.autocast import MixedPrecision

                # as every strategy's prepare() does: the forward under autocast, its outputs made float32 (the
                # bf16 precision given the run's dtype: an fp16 one would build a loss scaler and warn about fp16
                # on CPUs, neither of which is the planned run's)
                precision = MixedPrecision("bf16", torch.device("cpu"), autocast_kwargs={"dtype": dtype})
                model = precision.wrap_forward(model)
            if checkpointed:
                from ..strategies.fsdp.wrapping import apply_activation_checkpointing, wrap_policy, wrap_units

                units = wrap_units(model, wrap_policy(model, self.fsdp_plugin(False)))
                apply_activation_checkpointing(model, units)
            return model
        return build

    def _batch(self, micro_batch: int, seq_len: int) -> Callable[[], Any]:
        return lambda: self.source.batch(micro_batch, seq_len)

    def _at_depth(self, trace: Callable[[Optional[int]], dict]) -> dict[str, MemoryBreakdown]:
        """Each phase's parts (``run_steps``) at the model's depth: on the line through 2 and 3 blocks, or through 3
        and 4 when the peaks at 2 and 3 blocks are not the same moment of the phase (``_same_moment``; a model of 4
        blocks is then traced whole)."""
        layers = self.source.layers
        if layers is None or layers <= 3:
            return trace(None)
        small, larger, at = trace(2), trace(3), 2
        if not all(_same_moment(small[phase], larger[phase]) for phase in small):
            if layers == 4:
                return trace(None)  # as cheap as the 4th block the line would need
            small, larger, at = larger, trace(4), 3
        return {phase: extend(small[phase], larger[phase], at, at + 1, layers) for phase in small}

    def _phases(self, key: tuple, micro: int, trace_at: Callable[[int], Callable[[Optional[int]], dict]]
                ) -> dict[str, MemoryBreakdown]:
        """Each phase's peak at micro-batch ``micro``: traced, or, past 2 when searching, on the line through
        micro-batches 1 and 2. The highest phase is the step's peak (which one changes with depth and batch)."""
        def phases(size: int) -> dict[str, MemoryBreakdown]:
            if (*key, size) not in self._done:
                self._done[(*key, size)] = self._at_depth(trace_at(size))
            return self._done[(*key, size)]

        if micro <= 2 or not self.search:
            return phases(micro)
        one, two = phases(1), phases(2)
        return {phase: extend(one[phase], two[phase], 1, 2, micro) for phase in one}

    def single(self, narrowed_by: int = 1, weights_dtype: Optional[torch.dtype] = None,
               micro_batch: Optional[int] = None) -> MemoryBreakdown:
        """One device's peak (all parts of the model on it); ``weights_dtype``: the weights converted (a ZeRO run
        in 16 bits), with the forward then run without autocast."""
        return highest(self.single_phases(narrowed_by, weights_dtype, micro_batch))

    def single_phases(self, narrowed_by: int = 1, weights_dtype: Optional[torch.dtype] = None,
                      micro_batch: Optional[int] = None) -> dict[str, MemoryBreakdown]:
        """``single``'s peak of each phase (``run_steps``: forward and backward; optimizer step). A model narrowed
        for tensor parallelism steps tensor by tensor, as its mix of DTensors and plain tensors makes it
        (``strategies/model_parallel/mixed_parameters.py``)."""
        shape = self.shape
        precision = "no" if weights_dtype is not None else shape.mixed_precision

        def trace_at(micro: int) -> Callable[[Optional[int]], dict]:
            def trace(depth: Optional[int]) -> dict:
                return training_step_memory(
                    self._builder(depth, narrowed_by, weights_dtype, shape.activation_checkpointing),
                    self._batch(micro, shape.seq_len), mixed_precision=precision,
                    optimizer=self.sharded_optimizer if narrowed_by > 1 else self.optimizer,
                    steps=STEPS, micro_batches=min(shape.gradient_accumulation_steps, 2), by_phase=True)
            return trace

        return self._phases(("single", narrowed_by, weights_dtype), micro_batch or shape.micro_batch_size, trace_at)

    def fsdp2(self, world: int, narrowed_by: int = 1, seq_len: Optional[int] = None,
              micro_batch: Optional[int] = None, replicas: int = 1, units: bool = True) -> MemoryBreakdown:
        """One rank's peak under FSDP2 sharded over ``world`` ranks (``seq_len``: its share of the sequence;
        ``replicas`` > 1: HSDP, that many copies of the shard group; ``units=False``: the whole model one unit, as
        a plugin without a wrap policy shards it)."""
        shape = self.shape
        length = seq_len or shape.seq_len

        def trace_at(micro: int) -> Callable[[Optional[int]], dict]:
            def trace(depth: Optional[int]) -> dict:
                # without units: fsdp2_step_memory's default, the plugin prepare() uses without one
                plugin = self.fsdp_plugin(shape.activation_checkpointing) if units else None
                return fsdp2_step_memory(self._builder(depth, narrowed_by, None, False), self._batch(micro, length),
                                         world_size=world, fsdp_plugin=plugin, optimizer=self.sharded_optimizer,
                                         mixed_precision=shape.mixed_precision, steps=STEPS,
                                         micro_batches=min(shape.gradient_accumulation_steps, 2),
                                         replicas=replicas, by_phase=True)
            return trace

        return highest(self._phases(("fsdp2", world, narrowed_by, length, replicas, units),
                                    micro_batch or shape.micro_batch_size, trace_at))

    def fsdp1(self, world: int, micro_batch: Optional[int] = None) -> MemoryBreakdown:
        """One rank's peak under FSDP1 over ``world`` ranks, wrapped with the options of the config the plan writes
        (``fsdp_plugin(..., version=1)``)."""
        shape = self.shape

        def trace_at(micro: int) -> Callable[[Optional[int]], dict]:
            def trace(depth: Optional[int]) -> dict:
                plugin = self.fsdp_plugin(shape.activation_checkpointing, version=1)
                return fsdp1_step_memory(self._builder(depth, 1, None, False), self._batch(micro, shape.seq_len),
                                         world_size=world, fsdp_plugin=plugin, optimizer=self.sharded_optimizer,
                                         mixed_precision=shape.mixed_precision, steps=STEPS,
                                         micro_batches=min(shape.gradient_accumulation_steps, 2))
            return trace

        return highest(self._phases(("fsdp1", world), micro_batch or shape.micro_batch_size, trace_at))

    def block_names(self) -> list[str]:
        """The class names of the model's repeated blocks: those of its ``_no_split_modules`` found more than once
        (an embedding named there, whose weight a head may share, stays in the root unit); empty when it names
        none."""
        if self._blocks is None:
            from torch._subclasses.fake_tensor import FakeTensorMode

            with FakeTensorMode():
                model = self.source.build(2 if self.source.layers else None, 1, torch.float32)
            named = list(getattr(model, "_no_split_modules", None) or [])
            counts = {name: sum(type(module).__name__ == name for module in model.modules()) for name in named}
            self._blocks = [name for name in named if counts[name] > 1] or named
        return list(self._blocks)

    def fsdp_plugin(self, checkpointing: bool, version: int = 2) -> Any:
        """The FSDP plugin the written config asks for (``launch_config.py``): each of the model's blocks
        (``block_names``) a unit (the whole model one unit when it names none), with ``activation_checkpointing`` of
        each; for ``version`` 1 also the written FSDP1 options (``FSDP1_OPTIONS``)."""
        from ..config.fsdp import FullyShardedDataParallelPlugin

        blocks = self.block_names()
        options = dict(FSDP1_OPTIONS) if version == 1 else {}
        if blocks:
            options.update(auto_wrap_policy="transformer_based_wrap", transformer_cls_names_to_wrap=blocks)
        return FullyShardedDataParallelPlugin(fsdp_version=version, activation_checkpointing=checkpointing, **options)

    def parameter_count(self, below: Optional[int] = None) -> int:
        """Parameters of the model at its depth (only those of tensors with fewer than ``below`` elements)."""
        from torch._subclasses.fake_tensor import FakeTensorMode

        def count(depth: Optional[int]) -> int:
            with FakeTensorMode():
                tensors = list(self.source.build(depth, 1, torch.float32).parameters())
            return sum(p.numel() for p in tensors if below is None or p.numel() < below)

        layers = self.source.layers
        if layers is None or layers <= 3:
            return count(None)
        two, three = count(2), count(3)
        return two + (three - two) * (layers - 2)

    def block_bytes(self) -> int:
        """Float32 bytes of one repeated block's parameters: the difference a block makes to the model, or, for a
        model built whole, its largest repeated block (``block_names``; the whole model when it names none)."""
        if self._block is None:
            from torch._subclasses.fake_tensor import FakeTensorMode

            if self.source.layers is None:
                blocks = set(self.block_names())
                with FakeTensorMode():
                    model = self.source.build(None, 1, torch.float32)
                    sizes = [sum(p.numel() * 4 for p in module.parameters()) for module in model.modules()
                             if type(module).__name__ in blocks]
                self._block = max(sizes) if sizes else self.single().parameters
            else:
                with FakeTensorMode():
                    one, two = (sum(p.numel() * 4 for p in self.source.build(depth, 1, torch.float32).parameters())
                                for depth in (1, 2))
                self._block = two - one
        return self._block
