"""Pipeline parallelism: cut a sequential model into stages and run them with a torch pipeline schedule.

Two steps, both on ``torch.distributed.pipelining``:

1. ``split_model(model, num_stages, split_points=None)`` cuts the model into ``num_stages`` stage modules, by hand
   rather than by tracing (tracing breaks on data-dependent Python and needs an example input). Every stage is a
   small ``nn.Module`` holding the model's own submodules under their original names, so a stage's
   ``named_parameters()`` / ``state_dict()`` keys are the whole model's keys, and the stages' state dicts together
   are the model's.
2. ``build_pipeline(stage_modules, rank_in_pp, pp_group, schedule, num_micro_batches, loss_fn)`` wraps this rank's
   stages in ``PipelineStage`` objects (shapes are inferred from the first micro-batch) and returns a
   ``PipelineSchedule`` whose ``step`` trains one batch and whose ``eval_step`` runs the forward pass only.

The convention a model must follow to be split (checked where it can be, documented where it cannot):

- its forward applies its direct children in the order they were registered, each child's output being the next
  child's only input, and does nothing else (no extra functional ops, no skip connections between children);
- a child that is an ``nn.ModuleList`` or ``nn.Sequential`` is a chain of blocks applied one after the other; such
  a child is cut between its blocks, so its blocks are the units a stage is made of (``"blocks.0"``, ...);
- every parameter and buffer belongs to a child (none registered on the model itself), and no parameter is shared
  by two stages (tie weights only inside one stage).

A tiny GPT (``embedding -> blocks -> norm -> head``) and any ``nn.Sequential`` follow it. Blocks themselves may do
anything (residuals, attention, several inputs from their own state) as long as they take and return one tensor.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Callable, Iterator, Optional, Sequence, Union

import torch
from torch import nn

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

__all__ = ["split_model", "build_pipeline", "PipelineSchedule", "PipelineStageModule", "SCHEDULES", "pipeline_units"]

# Schedule name -> (torch class name, whether a rank holds several virtual stages).
SCHEDULES = {"gpipe": ("ScheduleGPipe", False), "1f1b": ("Schedule1F1B", False),
             "interleaved_1f1b": ("ScheduleInterleaved1F1B", True)}
_CHAINS = (nn.ModuleList, nn.Sequential)


# ============================================================================================ cutting the model
def pipeline_units(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The units a stage is made of, in forward order: ``(fully-qualified name, module)``.

    The model's direct children, with every ``nn.ModuleList`` / ``nn.Sequential`` child opened into its blocks.
    (An ``nn.Sequential`` model is itself the chain: its units are its children.)
    """
    units = []
    for name, child in model.named_children():
        if isinstance(child, _CHAINS) and len(child) > 0:
            units.extend((f"{name}.{index}", block) for index, block in child.named_children())
        else:
            units.append((name, child))
    return units


def _children_text(model: nn.Module) -> str:
    names = [name for name, _ in model.named_children()]
    units = [name for name, _ in pipeline_units(model)]
    return f"its children are {names} (the units a stage can start at: {units})"


def _check_splittable(model: nn.Module, num_stages: int, units: list) -> None:
    if not isinstance(model, nn.Module):
        raise TypeError(f"split_model expects an nn.Module, got {type(model).__name__}.")
    if isinstance(num_stages, bool) or not isinstance(num_stages, int) or num_stages < 1:
        raise ValueError(f"split_model: num_stages must be a whole number >= 1, got {num_stages!r}.")
    if not units:
        raise ValueError(f"{type(model).__name__} cannot be cut into pipeline stages: it has no child modules (its "
                         f"children are []), and stages are made of a model's children. Wrap it in a module whose "
                         f"children are its layers, or an nn.Sequential.")
    own = [name for name, _ in model.named_parameters(recurse=False)] + \
          [name for name, _ in model.named_buffers(recurse=False)]
    if own:
        raise ValueError(
            f"{type(model).__name__} cannot be cut into pipeline stages: the parameters/buffers {own} are registered "
            f"on the model itself, so no stage would own them. Move them into a child module; "
            f"{_children_text(model)}.")
    if len(units) < num_stages:
        raise ValueError(
            f"{type(model).__name__} cannot be cut into {num_stages} pipeline stages: it has {len(units)} unit(s) "
            f"to cut between, and {_children_text(model)}. A model is cut between its children and between the "
            f"blocks of an nn.ModuleList / nn.Sequential child; use fewer stages or register the layers as children.")


def _starts_from_split_points(model: nn.Module, units: list, num_stages: int, split_points: Sequence[str]) -> list:
    """The index of the first unit of each stage, from the names where a stage begins."""
    names = [name for name, _ in units]
    first_block = {}  # a chain child's name stands for its first block
    for name, child in model.named_children():
        if isinstance(child, _CHAINS) and len(child) > 0:
            first_block[name] = names.index(f"{name}.{next(iter(child._modules))}")
    if isinstance(split_points, str) or not isinstance(split_points, (list, tuple)):
        raise TypeError(f"split_points must be a list of module names, got {split_points!r}.")
    if len(split_points) != num_stages - 1:
        raise ValueError(f"split_points names where stages 1..{num_stages - 1} begin, so it needs {num_stages - 1} "
                         f"name(s) for {num_stages} stages; got {len(split_points)}: {list(split_points)}.")
    starts = [0]
    for point in split_points:
        if point in names:
            index = names.index(point)
        elif point in first_block:
            index = first_block[point]
        else:
            raise ValueError(f"split point {point!r} is not a unit of {type(model).__name__}: {_children_text(model)}.")
        if index <= starts[-1]:
            raise ValueError(f"split point {point!r} does not come after the previous stage's start "
                             f"({names[starts[-1]]!r}): split points must be in forward order, each stage holding at "
                             f"least one unit; {_children_text(model)}.")
        starts.append(index)
    return starts


def _balanced_starts(sizes: list[int], num_stages: int) -> list[int]:
    """Cut ``sizes`` into ``num_stages`` contiguous, non-empty runs whose largest sum is as small as possible.

    A small dynamic programme over the cut positions (models have tens to hundreds of units). Among the best cuts,
    the earliest ones win, so the result is deterministic.
    """
    n = len(sizes)
    prefix = [0]
    for size in sizes:
        prefix.append(prefix[-1] + size)
    # best[k][i]: the smallest largest-stage for the first i units in k stages; cut[k][i]: where stage k begins
    best = [[math.inf] * (n + 1) for _ in range(num_stages + 1)]
    cut = [[0] * (n + 1) for _ in range(num_stages + 1)]
    best[0][0] = 0
    for k in range(1, num_stages + 1):
        for i in range(k, n - (num_stages - k) + 1):
            for j in range(k - 1, i):
                cost = max(best[k - 1][j], prefix[i] - prefix[j])
                if cost < best[k][i]:
                    best[k][i], cut[k][i] = cost, j
    starts, end = [], n
    for k in range(num_stages, 0, -1):
        end = cut[k][end]
        starts.append(end)
    return starts[::-1]


class PipelineStageModule(nn.Module):
    """One stage of a cut model: its units, under their names in the whole model, run one after the other.

    A unit ``"norm"`` is the child ``norm``; a unit ``"blocks.2"`` sits in an ``nn.ModuleDict`` child ``blocks``
    under the key ``"2"``, so parameter names (``blocks.2.fc.weight``) are those of the whole model.
    """

    def __init__(self, model: nn.Module, unit_names: Sequence[str], stage_index: int):
        super().__init__()
        self.stage_index = stage_index
        self.unit_names = tuple(unit_names)
        for name in self.unit_names:
            parent, _, key = name.rpartition(".")
            if parent:
                if parent not in self._modules:
                    self.add_module(parent, nn.ModuleDict())
                self._modules[parent][key] = model.get_submodule(name)
            else:
                self.add_module(name, model.get_submodule(name))

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        for name in self.unit_names:
            hidden = self.get_submodule(name)(hidden)
        return hidden

    def extra_repr(self) -> str:
        return f"stage_index={self.stage_index}, units={list(self.unit_names)}"


def split_model(model: nn.Module, num_stages: int, split_points: Optional[Sequence[str]] = None,
                example_input: Optional[torch.Tensor] = None) -> list[PipelineStageModule]:
    """Cut a sequential ``model`` into ``num_stages`` stage modules (see the module docstring for the convention).

    ``split_points``: the fully-qualified names of the units where stages 1, 2, ... begin (like torch's
    ``SplitPoint.BEGINNING``), e.g. ``["blocks.2"]``; a chain child's own name (``"blocks"``) means its first
    block. Without it, the stages hold about the same number of parameters. The stages share the model's modules
    (nothing is copied): keep the ones this rank runs and drop the others (``build_pipeline`` does).
    ``example_input``: when given, the stages run one after the other on it must give ``model(example_input)``;
    this catches a forward that is not the chain of its children (the convention cannot be read from the code).
    Raises ``ValueError`` (listing the model's children) when the model cannot be cut that way.
    """
    units = pipeline_units(model) if isinstance(model, nn.Module) else []
    _check_splittable(model, num_stages, units)
    if split_points is not None:
        starts = _starts_from_split_points(model, units, num_stages, split_points)
    else:
        starts = _balanced_starts([sum(p.numel() for p in unit.parameters()) for _, unit in units], num_stages)
    bounds = list(zip(starts, starts[1:] + [len(units)]))
    stages = [PipelineStageModule(model, [name for name, _ in units[begin:end]], index)
              for index, (begin, end) in enumerate(bounds)]
    _check_no_shared_parameters(stages)
    if example_input is not None:
        _check_chain(model, stages, example_input)
    return stages


@torch.no_grad()
def _check_chain(model: nn.Module, stages: Sequence[nn.Module], example_input: torch.Tensor) -> None:
    """Both ways of running the model, in eval mode (dropout would make them differ); the modes are put back."""
    modes = [(module, module.training) for module in model.modules()]
    model.eval()
    try:
        expected = model(example_input)
        hidden = example_input
        for stage in stages:
            hidden = stage(hidden)
    finally:
        for module, training in modes:
            module.training = training
    if not (isinstance(expected, torch.Tensor) and expected.shape == hidden.shape
            and torch.allclose(hidden, expected, rtol=1e-4, atol=1e-5)):
        raise ValueError(
            f"{type(model).__name__}'s forward is not the chain of its children: running its units one after the "
            f"other on example_input does not give model(example_input), so its stages would compute something else."
            f" A model to cut must apply its children in registration order, each output feeding the next, with "
            f"nothing in between; {_children_text(model)}.")


def _check_no_shared_parameters(stages: Sequence[nn.Module]) -> None:
    owner = {}
    for index, stage in enumerate(stages):
        for name, param in stage.named_parameters():
            if id(param) in owner and owner[id(param)][0] != index:
                other, other_name = owner[id(param)]
                raise ValueError(
                    f"The parameter {other_name!r} of stage {other} is also {name!r} of stage {index} (tied weights): "
                    f"a parameter cannot live in two pipeline stages. Choose split points that keep both in one "
                    f"stage, or untie them.")
            owner.setdefault(id(param), (index, name))


# ============================================================================================ running the stages
def _resolve_group(pp_group):
    """A ProcessGroup (or None: the default group) from a group or a 1-D DeviceMesh."""
    if pp_group is not None and hasattr(pp_group, "get_group") and hasattr(pp_group, "mesh"):
        if pp_group.ndim != 1:
            raise ValueError(f"pp_group must be a process group or a 1-D DeviceMesh, got a {pp_group.ndim}-D mesh "
                             f"{pp_group.mesh_dim_names}; pass mesh['pp'].")
        return pp_group.get_group()
    return pp_group


def _check_count(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a whole number >= 1, got {value!r}.")
    return value


def _plan(num_stages: int, pp_size: int, schedule: str, num_micro_batches: int, virtual_stages) -> int:
    """Check a pipeline's sizes (no communication); return the number of stages each rank holds."""
    if schedule not in SCHEDULES:
        raise ValueError(f"Unknown pipeline schedule {schedule!r}; the schedules are {sorted(SCHEDULES)}.")
    _check_count("num_micro_batches", num_micro_batches)
    multi = SCHEDULES[schedule][1]
    if virtual_stages is None:
        virtual_stages = max(1, num_stages // pp_size) if multi else 1
    _check_count("virtual_stages", virtual_stages)
    if not multi and virtual_stages != 1:
        raise ValueError(f"The {schedule!r} schedule runs one stage per rank (virtual_stages=1), got "
                         f"virtual_stages={virtual_stages}; use schedule='interleaved_1f1b' for several.")
    if num_stages != pp_size * virtual_stages:
        raise ValueError(
            f"The pipeline has {num_stages} stage(s), but {pp_size} pipeline rank(s) x {virtual_stages} virtual "
            f"stage(s) per rank = {pp_size * virtual_stages}: split the model into {pp_size * virtual_stages} stages "
            f"(split_model(model, {pp_size * virtual_stages})), or change the schedule or the pipeline size.")
    if schedule in ("1f1b", "interleaved_1f1b") and num_micro_batches < pp_size:
        raise ValueError(f"The {schedule!r} schedule needs at least as many micro-batches as pipeline ranks: "
                         f"num_micro_batches={num_micro_batches} < {pp_size}. Use num_micro_batches >= {pp_size}.")
    if schedule == "interleaved_1f1b":
        rounds = max(1, num_micro_batches // pp_size)
        if num_micro_batches % rounds:
            raise ValueError(f"The 'interleaved_1f1b' schedule runs micro-batches in rounds of {pp_size} (the pipeline "
                             f"size): num_micro_batches={num_micro_batches} must be a multiple of {rounds} rounds; "
                             f"use a multiple of {pp_size}.")
    return virtual_stages


def _module_device(modules: Sequence[nn.Module]) -> torch.device:
    for module in modules:
        for tensor in module.parameters():
            return tensor.device
    return torch.device("cpu")


def build_pipeline(stage_modules: Sequence[nn.Module], rank_in_pp: int, pp_group: Union["ProcessGroup", None] = None,
                   schedule: str = "gpipe", num_micro_batches: int = 1,
                   loss_fn: Optional[Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = None,
                   virtual_stages: Optional[int] = None, device: Union[str, torch.device, None] = None,
                   broadcast_loss: bool = True) -> "PipelineSchedule":
    """The pipeline this rank runs: its stages of ``stage_modules`` (every stage, in order, e.g. from
    ``split_model``) under ``schedule``.

    ``pp_group``: the pipeline's process group (or a 1-D DeviceMesh; None: every process); ``rank_in_pp`` this
    process's rank in it. With ``pp`` ranks, rank ``r`` runs the stages ``r, r + pp, r + 2 pp, ...``: one for
    ``"gpipe"`` and ``"1f1b"``, ``virtual_stages`` (default ``len(stage_modules) // pp``) for
    ``"interleaved_1f1b"``. ``loss_fn(output, target)`` must return the mean over one micro-batch: gradients are
    divided by ``num_micro_batches``, so they are those of the mean over the whole batch. ``device``: where the
    stages run (they are moved there); default: where their parameters are. Every check runs before any
    communication.
    """
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError("build_pipeline needs torch.distributed to be initialised: launch with `hasten launch -n "
                           "<processes>` and create the Accelerator / PartialState (or init_process_group) first.")
    stage_modules = list(stage_modules)
    if not stage_modules or not all(isinstance(module, nn.Module) for module in stage_modules):
        raise TypeError("stage_modules must be a non-empty list of nn.Module stages (e.g. from split_model).")
    group = _resolve_group(pp_group)
    pp_size, my_rank = dist.get_world_size(group), dist.get_rank(group)
    if rank_in_pp != my_rank:
        raise ValueError(f"rank_in_pp={rank_in_pp!r}, but this process is rank {my_rank} of the pipeline group "
                         f"(size {pp_size}); pass dist.get_rank(pp_group).")
    if loss_fn is not None and not callable(loss_fn):
        raise TypeError(f"loss_fn must be callable (output, target) -> loss, got {loss_fn!r}.")
    virtual_stages = _plan(len(stage_modules), pp_size, schedule, num_micro_batches, virtual_stages)
    indices = [rank_in_pp + v * pp_size for v in range(virtual_stages)]
    local = [stage_modules[index] for index in indices]
    if device is not None:
        device = torch.device(device)
        local = [module.to(device) for module in local]
    else:
        device = _module_device(local)
    return PipelineSchedule(local, indices, len(stage_modules), group, schedule, num_micro_batches, loss_fn, device,
                            broadcast_loss)


class PipelineSchedule:
    """This rank's part of a pipeline: its stage modules, the torch schedule that runs them, and the loss.

    ``step(inputs, target)`` trains on one batch (forward and backward; the optimizer step is the caller's) and
    returns the mean of the micro-batch losses on every rank of the pipeline (broadcast from the last stage's rank;
    ``broadcast_loss=False``: on that rank only, None elsewhere). ``eval_step(inputs)`` runs the forward pass only
    and returns the last stage's outputs (the whole batch) on the rank holding it, None elsewhere. ``inputs`` are
    needed on the first stage's rank and ``target`` on the last stage's; other ranks may pass them or None.
    """

    def __init__(self, modules: Sequence[nn.Module], stage_indices: Sequence[int], num_stages: int,
                 group: Optional[ProcessGroup], schedule: str, num_micro_batches: int,
                 loss_fn: Optional[Callable[[torch.Tensor, torch.Tensor], torch.Tensor]],
                 device: torch.device, broadcast_loss: bool):
        import torch.distributed as dist
        from torch.distributed import pipelining

        self.modules = list(modules)
        self.stage_indices = list(stage_indices)
        self.num_stages = num_stages
        self.group = group
        self.schedule_name = schedule
        self.num_micro_batches = num_micro_batches
        self.loss_fn = loss_fn
        self.device = device
        self.broadcast_loss = broadcast_loss
        self._scoring = True
        self._shapes = None  # (training?, {name: (shape, dtype)}) of the batches torch inferred the stages from
        self.pp_size = dist.get_world_size(group)
        self.is_first = 0 in self.stage_indices
        self.is_last = num_stages - 1 in self.stage_indices
        # the rank (global) holding the last stage: stages go round the ranks, so that is (num_stages - 1) % pp
        self._last_rank = dist.get_global_rank(group, (num_stages - 1) % self.pp_size) if group is not None \
            else (num_stages - 1) % self.pp_size
        self.stages = [pipelining.PipelineStage(module, index, num_stages, device, group=group)
                       for module, index in zip(self.modules, self.stage_indices)]
        cls = getattr(pipelining, SCHEDULES[schedule][0])
        first = self.stages if SCHEDULES[schedule][1] else self.stages[0]
        self._schedule = cls(first, n_microbatches=num_micro_batches, loss_fn=self._micro_batch_loss)

    # ------------------------------------------------------------------------------------------ parameters
    def parameters(self) -> Iterator[nn.Parameter]:
        """The parameters this rank owns (all its stages'): give these to its optimizer."""
        for module in self.modules:
            yield from module.parameters()

    def named_parameters(self) -> Iterator[tuple[str, nn.Parameter]]:
        """``(name in the whole model, parameter)`` for the parameters this rank owns."""
        for module in self.modules:
            yield from module.named_parameters()

    def state_dict(self) -> dict:
        """This rank's part of the model's state dict (keys are the whole model's)."""
        state = {}
        for module in self.modules:
            state.update(module.state_dict())
        return state

    # ------------------------------------------------------------------------------------------ running
    def _micro_batch_loss(self, output, target):
        if not self._scoring or self.loss_fn is None:  # eval_step: torch scores every micro-batch, we need not
            return output.new_zeros(())
        return self.loss_fn(output, target)

    def _check_batch(self, name: str, tensor) -> int:
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"{name} must be a tensor whose first dimension is the batch, got {type(tensor).__name__}.")
        if tensor.dim() == 0 or tensor.shape[0] % self.num_micro_batches:
            size = tensor.shape[0] if tensor.dim() else "no batch dimension"
            raise ValueError(f"The {name} batch ({size}) must split into num_micro_batches={self.num_micro_batches} "
                             f"equal micro-batches: use a batch size that is a multiple of {self.num_micro_batches}.")
        return tensor.shape[0]

    def _check_inputs(self, inputs, target, training: bool) -> None:
        shapes = {}
        if self.is_first:
            if inputs is None:
                raise ValueError("This rank holds the first pipeline stage (stage 0): pass the batch as inputs.")
            batch = self._check_batch("inputs", inputs)
            shapes["inputs"] = (tuple(inputs.shape), inputs.dtype)
        if training and self.is_last:
            if self.loss_fn is None:
                raise ValueError("step() trains, which needs a loss: build_pipeline(..., loss_fn=...). Use "
                                 "eval_step() for the forward pass alone.")
            if target is None:
                raise ValueError(f"This rank holds the last pipeline stage (stage {self.num_stages - 1}): pass the "
                                 f"batch's target.")
            size = self._check_batch("target", target)
            if self.is_first and size != batch:
                raise ValueError(f"inputs hold {batch} samples but target holds {size}: give both the same batch.")
            shapes["target"] = (tuple(target.shape), target.dtype)
        self._check_same_shapes(shapes, training)

    def _check_same_shapes(self, shapes: dict, training: bool) -> None:
        """torch infers the stages' shapes from the first batch after the pipeline starts or switches between
        training and evaluation, and reuses its buffers after: a batch of another shape would be read wrongly."""
        if self._shapes is not None and self._shapes[0] == training:
            for name, (shape, dtype) in shapes.items():
                seen_shape, seen_dtype = self._shapes[1][name]
                if (shape, dtype) != (seen_shape, seen_dtype):
                    raise ValueError(
                        f"The {name} batch has shape {list(shape)} ({dtype}), but this pipeline's "
                        f"{'training' if training else 'evaluation'} steps set their shapes from a batch of "
                        f"{list(seen_shape)} ({seen_dtype}): every {'step' if training else 'eval_step'} in a row "
                        f"needs that shape (DataLoader(drop_last=True); pad the sequences). A call of the other kind "
                        f"({'eval_step' if training else 'step'}) lets the next one start from a new shape.")
        self._shapes = (training, shapes)

    def step(self, inputs: Optional[torch.Tensor] = None, target: Optional[torch.Tensor] = None
             ) -> Optional[torch.Tensor]:
        """Forward and backward over one batch, micro-batch by micro-batch; the gradients are left in ``.grad``
        (summed into what is there: zero them between steps). Returns the mean micro-batch loss (detached)."""
        self._check_inputs(inputs, target, training=True)
        losses = [] if self.is_last else None
        args = (inputs.to(self.device),) if self.is_first else ()
        target = target.to(self.device) if self.is_last else None
        self._schedule.step(*args, target=target, losses=losses, return_outputs=False)
        loss = torch.stack([l.detach() for l in losses]).mean() if self.is_last else None
        if not self.broadcast_loss or self.pp_size == 1:
            return loss
        import torch.distributed as dist

        if loss is None:
            loss = torch.zeros((), device=self.device)
        loss = loss.float().contiguous()
        dist.broadcast(loss, src=self._last_rank, group=self.group)
        return loss

    @torch.no_grad()
    def eval_step(self, inputs: Optional[torch.Tensor] = None) -> Optional[torch.Tensor]:
        """The forward pass alone over one batch: the last stage's outputs (whole batch) on its rank, else None."""
        self._check_inputs(inputs, None, training=False)
        args = (inputs.to(self.device),) if self.is_first else ()
        # torch's eval still calls the loss on the last stage with one target row per micro-batch: give it
        # placeholders and skip the scoring (the caller may not even have a target)
        placeholder = torch.zeros(self.num_micro_batches, device=self.device) if self.is_last else None
        self._scoring = False
        try:
            outputs = self._schedule.eval(*args, target=placeholder)
        finally:
            self._scoring = True
        return outputs if self.is_last else None
