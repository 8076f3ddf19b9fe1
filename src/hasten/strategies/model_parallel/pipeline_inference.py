"""Pipeline-parallel inference (Accelerate's ``prepare_pippy``): one stage of a traced model per process.

``prepare_pippy(model, ...)`` cuts ``model`` into as many stages as there are processes, by tracing it with
``torch.distributed.pipelining.pipeline`` on an example micro-batch and splitting before the named modules
(``SplitPoint.BEGINNING``), and replaces ``model.forward`` with a ``ScheduleGPipe`` run: the batch given on the
first process is cut into ``num_chunks`` micro-batches that flow through the stages, and the output appears on the
last process (on every process with ``gather_output=True``); the others get None.

Unlike the training pipeline (``pipeline.py``, which cuts a model between its children by hand), this path traces,
so the model may be any module ``torch.export`` captures, transformers models included (their
``config.use_cache`` is set to False, with a warning: a cache object in the outputs can be neither traced nor sent
between stages). The traced graph has the example's
shapes, so every call must bring ``num_chunks`` micro-batches shaped like the example.

Every refusal happens before any work that involves another process: the arguments are checked before the process
state is created, the traced pipeline before any stage talks to another, and a call's inputs on the first process
before the micro-batches are sent (the other processes are told, so they raise too instead of waiting).
"""
from __future__ import annotations

import inspect
import math
from collections import OrderedDict
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Callable, Optional, Union

import torch
from torch import nn

if TYPE_CHECKING:
    from torch.distributed.pipelining import ScheduleGPipe

__all__ = ["generate_device_map", "find_pippy_batch_size", "build_pipeline", "pippy_forward", "prepare_pippy"]

_MISSING = object()
_MAX_LISTED_NAMES = 60


class PipelineInputError(ValueError):
    """Inputs the pipeline cannot run (raised on the first process, and told to the others)."""


# ============================================================================================ planning
def generate_device_map(model: nn.Module, num_processes: int = 1, no_split_module_classes: Optional[list[str]] = None,
                        max_memory: Optional[dict] = None) -> OrderedDict:
    """A device map giving each of ``num_processes`` processes (devices ``0 .. n-1``) about an equal share of
    ``model`` (10% headroom for shared weights), unless ``max_memory`` says how much each may take."""
    from ...big_modeling.device_map import infer_auto_device_map

    if num_processes == 1:
        return infer_auto_device_map(model, no_split_module_classes=no_split_module_classes, clean_result=False)
    if max_memory is None:
        from ...big_modeling.sizes import calculate_maximum_sizes

        model_size, (largest_layer, _) = calculate_maximum_sizes(model)
        share = math.ceil((model_size + largest_layer) / num_processes * 1.1)
        max_memory = {index: share for index in range(num_processes)}
    return infer_auto_device_map(model, max_memory=max_memory, no_split_module_classes=no_split_module_classes,
                                 clean_result=False)


def find_pippy_batch_size(args: Optional[tuple], kwargs: Optional[dict]) -> Optional[int]:
    """The batch size of the first input (positional, then keyword) it can be read from; None if none."""
    from ...collectives.operations import ignorant_find_batch_size

    for value in list(args or ()) + list((kwargs or {}).values()):
        found = ignorant_find_batch_size(value)
        if found is not None:
            return found
    return None


def _world_size() -> int:
    """The number of processes of the run, read without creating the process state (or its process group)."""
    import torch.distributed as dist

    from ...core.env_vars import get_int_from_env
    from ...state import PartialState

    if PartialState._shared_state:
        return PartialState().num_processes
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    return get_int_from_env(["WORLD_SIZE"], 1)


# ============================================================================================ argument checks
def _check_available() -> None:
    from ...core.imports import is_pippy_available

    if not is_pippy_available():
        raise ImportError("Using `torch.distributed.pipelining` requires PyTorch 2.4.0 or later.")


def _check_num_chunks(num_chunks) -> int:
    if isinstance(num_chunks, bool) or not isinstance(num_chunks, int) or num_chunks < 1:
        raise ValueError(f"num_chunks (the number of micro-batches a batch is cut into) must be a whole number >= 1, "
                         f"got {num_chunks!r}.")
    return num_chunks


def _module_names_text(model: nn.Module) -> str:
    names = [name for name, _ in model.named_modules() if name]
    shown = names[:_MAX_LISTED_NAMES]
    more = f", ... ({len(names) - len(shown)} more)" if len(names) > len(shown) else ""
    return f"the modules of {type(model).__name__} are {shown}{more}"


def _check_split_points(model: nn.Module, split_points, num_stages: int) -> list:
    """The split points as a list of module names, refused unless they name ``num_stages - 1`` distinct modules."""
    if isinstance(split_points, str) or not isinstance(split_points, (list, tuple)) or \
            not all(isinstance(point, str) for point in split_points):
        raise TypeError(f"split_points must be 'auto' or a list of module names (where stages 1.. begin), got "
                        f"{split_points!r}.")
    split_points = list(split_points)
    modules = dict(model.named_modules())
    unknown = [point for point in split_points if point == "" or point not in modules]
    if unknown:
        raise ValueError(f"split_points {unknown} name no module of the model (a split point is the name of the "
                         f"module a stage begins with); {_module_names_text(model)}.")
    repeated = sorted({point for point in split_points if split_points.count(point) > 1})
    if repeated:
        raise ValueError(f"split_points names {repeated} more than once; each stage begins at a different module.")
    if len(split_points) != num_stages - 1:
        raise ValueError(
            f"split_points has {len(split_points)} name(s) ({split_points}), but this run has {num_stages} "
            f"process(es), one pipeline stage each, so it needs exactly {num_stages - 1} (where stages "
            f"1..{num_stages - 1} begin). Launch with {len(split_points) + 1} processes, or pass "
            f"{num_stages - 1} split point(s), or split_points='auto'.")
    return split_points


def _auto_split_points(model: nn.Module, num_stages: int, no_split_module_classes) -> list:
    """Where stages 1.. begin in a balanced split: the first module ``generate_device_map`` puts on each device."""
    if num_stages == 1:
        return []
    device_map = generate_device_map(model, num_stages, no_split_module_classes=no_split_module_classes)
    modules = dict(model.named_modules())
    points = []
    for device in range(1, num_stages):
        first = next((name for name, placed in device_map.items() if placed == device), None)
        if first is None or first == "" or first not in modules:
            raise ValueError(
                f"split_points='auto' found no balanced split of {type(model).__name__} into {num_stages} stages "
                f"(the balanced device map is {dict(device_map)}): pass split_points, a list of the "
                f"{num_stages - 1} module name(s) where stages 1..{num_stages - 1} begin; "
                f"{_module_names_text(model)}.")
        points.append(first)
    return points


def _check_examples(example_args, example_kwargs) -> tuple[tuple, dict]:
    from ...collectives.operations import send_to_device

    if example_args is None:
        example_args = ()
    if not isinstance(example_args, (tuple, list)):
        raise TypeError(f"example_args must be a tuple of the model's positional inputs, got "
                        f"{type(example_args).__name__}; pass (tensor,) for one input.")
    if example_kwargs is not None and not isinstance(example_kwargs, Mapping):
        raise TypeError(f"example_kwargs must be a dict of the model's keyword inputs, got "
                        f"{type(example_kwargs).__name__}.")
    example_kwargs = dict(example_kwargs or {})
    if not example_args and not example_kwargs:
        raise ValueError("prepare_pippy traces the model on an example micro-batch to cut it into stages: pass "
                         "example_args (a tuple of inputs) or example_kwargs (a dict), shaped like one micro-batch "
                         "(the batch of a call divided by num_chunks).")
    return tuple(send_to_device(tuple(example_args), "cpu")), send_to_device(example_kwargs, "cpu")


# ============================================================================================ tracing
def _tensors(data) -> list:
    """The tensors of a nested tuple / list / dict, in order."""
    if isinstance(data, torch.Tensor):
        return [data]
    if isinstance(data, Mapping):
        return [leaf for value in data.values() for leaf in _tensors(value)]
    if isinstance(data, (tuple, list)):
        return [leaf for value in data for leaf in _tensors(value)]
    return []


def _turn_off_cache(model: nn.Module) -> None:
    """A transformers model's key/value cache is an object among its outputs, which neither ``torch.export`` nor a
    pipeline stage can pass on; the pipelined model runs without one, so ``config.use_cache`` is set to False (with
    a warning, as it changes the model's config)."""
    config = getattr(model, "config", None)
    if getattr(config, "use_cache", False) is True:
        from ...logging import get_logger

        config.use_cache = False
        get_logger(__name__).warning(
            "prepare_pippy sets model.config.use_cache = False: a key/value cache cannot be traced or passed between "
            "pipeline stages, so the pipelined model runs without one.", main_process_only=True)


def _trace(model: nn.Module, split_points: list, args: tuple, kwargs: dict):
    """``torch.distributed.pipelining.pipeline`` on the example, leaving ``model`` as it was (but for a transformers
    model's ``config.use_cache``, turned off: ``_turn_off_cache``).

    torch marks a split point by replacing that module's ``forward``; the marks are taken off again afterwards, so
    the model runs (and can be traced again) as before.
    """
    from torch.distributed.pipelining import SplitPoint, pipeline

    _turn_off_cache(model)

    modules = dict(model.named_modules())
    saved = {name: (modules[name].__dict__.get("forward", _MISSING), modules[name].__dict__.get("_orig_forward",
                                                                                                 _MISSING))
             for name in split_points}
    try:
        return pipeline(model, mb_args=args, mb_kwargs=kwargs or None,
                        split_spec={name: SplitPoint.BEGINNING for name in split_points})
    except Exception as error:
        cause = f" ({str(error.__cause__).splitlines()[0][:300]})" if error.__cause__ is not None else ""
        raise RuntimeError(f"prepare_pippy could not trace {type(model).__name__} with torch.export on the example "
                           f"inputs, which it needs to cut the model into stages: {error}{cause}.") from error
    finally:
        for name, (forward, orig_forward) in saved.items():
            for attribute, value in (("forward", forward), ("_orig_forward", orig_forward)):
                if value is _MISSING:
                    modules[name].__dict__.pop(attribute, None)
                else:
                    modules[name].__dict__[attribute] = value


class _TracedInputs:
    """What a call must bring: the traced model's inputs, those the first stage takes, and the example's values.

    Built on every process from its own trace (every process traces the same model on the same example).
    """

    def __init__(self, pipe, args: tuple, kwargs: dict, num_chunks: int):
        graph = pipe.split_gm.graph
        stages = [node for node in graph.nodes if node.op == "call_module"]
        placeholders = [node for node in graph.nodes if node.op == "placeholder"]
        later = {node.name: [stages.index(user) for user in node.users if user in stages and user is not stages[0]]
                 for node in placeholders}
        later = {name: used for name, used in later.items() if used}
        if later:
            raise ValueError(
                f"The model inputs {sorted(later)} are used by later pipeline stages ({later}), but "
                f"torch.distributed.pipelining gives the model's inputs to the first stage only. Choose split points "
                f"after the modules that use them, or compute with them before the first split point.")
        self.signature = inspect.Signature([inspect.Parameter(node.target, inspect.Parameter.POSITIONAL_OR_KEYWORD)
                                            for node in placeholders])
        # {the first stage's keyword: the model input it receives}. The stage's graph names its inputs after the
        # traced graph's nodes, which fx renames where a name is taken (nn.Sequential's ``input`` becomes node
        # ``input_1``), while the stage's forward may keep the original names: its signature gives the keywords,
        # its graph's inputs (in the same order) the nodes
        first = pipe.split_gm.get_submodule(stages[0].target)
        nodes = [node.target for node in first.graph.nodes if node.op == "placeholder"]
        keywords = list(inspect.signature(first.forward).parameters)
        keywords = keywords if len(keywords) == len(nodes) else nodes
        model_input = {node.name: node.target for node in placeholders}
        self.first_stage = {keyword: model_input.get(node) for keyword, node in zip(keywords, nodes)}
        unmatched = [name for name, source in self.first_stage.items() if source is None]
        if unmatched:
            raise ValueError(f"The first pipeline stage takes inputs {unmatched} that are not among the traced "
                             f"model's inputs {list(self.signature.parameters)}; this model cannot be pipelined "
                             f"with these split points.")
        self.example = self.bind(args, kwargs, "the example").arguments
        self.num_chunks = num_chunks

    def bind(self, args, kwargs, what: str):
        try:
            return self.signature.bind(*args, **kwargs)
        except TypeError as error:
            raise PipelineInputError(
                f"{what} does not match the inputs the pipeline was traced with ({error}): call the prepared model "
                f"with the inputs the example had, {list(self.signature.parameters)}, in the same way (positional "
                f"or keyword).") from None

    def first_stage_inputs(self, args, kwargs) -> dict:
        """The first stage's keyword inputs for this call; refused unless shaped like ``num_chunks`` examples."""
        given = self.bind(args, kwargs, "The call").arguments
        batch = find_pippy_batch_size((), {name: given[name] for name in self.first_stage.values()})
        if batch is not None:
            _check_divides(batch, self.num_chunks)
        for name, value in given.items():
            expected = self.example[name]
            if name in self.first_stage.values():
                self._check_shapes(name, value, expected)
            elif not _tensors(value) and not _tensors(expected) and not _same_value(value, expected):
                raise PipelineInputError(
                    f"The input {name!r} was {expected!r} in the example and is {value!r} now: a value that is not a "
                    f"tensor is fixed when the model is traced. Prepare the model with example inputs holding "
                    f"{value!r}.")
        return {stage_name: given[name] for stage_name, name in self.first_stage.items()}

    def _check_shapes(self, name: str, value, expected) -> None:
        got, traced = _tensors(value), _tensors(expected)
        wanted = [(example.shape[0] * self.num_chunks, *example.shape[1:]) if example.ndim else tuple(example.shape)
                  for example in traced]
        if len(got) != len(traced) or any(tuple(tensor.shape) != shape for tensor, shape in zip(got, wanted)):
            raise PipelineInputError(
                f"The input {name!r} has shape(s) {[tuple(tensor.shape) for tensor in got]}, but the pipeline was "
                f"traced on micro-batches shaped {[tuple(example.shape) for example in traced]} and a call is cut "
                f"into num_chunks={self.num_chunks} of them, so it needs {wanted}. Pass a batch of "
                f"num_chunks x the example's batch size (pad it with pad_input_tensors), or prepare the model with "
                f"an example shaped like batch / num_chunks.")


def _same_value(value, expected) -> bool:
    try:
        return bool(value == expected)
    except Exception:
        return value is expected


def _stage_count_check(pipe, split_points: list, num_stages: int) -> None:
    if pipe.num_stages != num_stages:
        raise ValueError(
            f"Cutting the model before {split_points} gave {pipe.num_stages} stage(s), not {num_stages} (one per "
            f"process): each split point must name a module the forward calls exactly once, on the path of the "
            f"traced inputs. Choose other split points.")


def _contiguous(value):
    from torch.utils._pytree import tree_map_only

    return tree_map_only(torch.Tensor, lambda tensor: tensor.contiguous(), value)


def _receive_contiguous(pipe) -> None:
    """Point-to-point sends and receives need contiguous tensors, but a traced stage may hand on a view (BERT passes
    its expanded attention mask from stage to stage), and torch sizes the receive buffers with the traced strides.
    The placeholders through which a stage receives from another get contiguous example values, so its buffers are
    plain; ``_schedule`` makes the sent outputs contiguous to match."""
    import contextlib
    import operator

    split = pipe.split_gm
    for node in split.graph.nodes:
        if node.op != "call_module":
            continue
        placeholders = [p for p in split.get_submodule(node.target).graph.nodes if p.op == "placeholder"]
        for placeholder, argument in zip(placeholders, node.args):
            while getattr(argument, "target", None) is operator.getitem:
                argument = argument.args[0]
            value = placeholder.meta.get("val")
            if getattr(argument, "op", None) != "call_module" or not isinstance(value, torch.Tensor):
                continue  # a root input (cut into micro-batches here) or no tensor
            if not value.is_contiguous():
                with getattr(value, "fake_mode", None) or contextlib.nullcontext():  # traced values are fake tensors
                    placeholder.meta["val"] = value.contiguous()


def _schedule(pipe, num_chunks: int):
    from torch.distributed.pipelining import ScheduleGPipe

    from ...state import PartialState

    state = PartialState()
    _receive_contiguous(pipe)
    stage = pipe.build_stage(state.process_index, device=state.device)
    stage.submod.register_forward_hook(lambda module, inputs, output: _contiguous(output))
    return ScheduleGPipe(stage, num_chunks)


def build_pipeline(model: nn.Module, split_points: list[str], args: Optional[tuple], kwargs: Optional[dict],
                   num_chunks: int) -> ScheduleGPipe:
    """Trace ``model`` on the example micro-batch ``args`` / ``kwargs``, cut it before each of ``split_points``
    and return the ``ScheduleGPipe`` running this process's stage in ``num_chunks`` micro-batches.

    Needs one process per stage (``len(split_points) + 1`` processes). The model is left as it was (a transformers
    model's ``config.use_cache`` is turned off, with a warning).
    """
    _check_available()
    num_chunks = _check_num_chunks(num_chunks)
    num_stages = _world_size()
    if num_stages == 1:
        raise ValueError("build_pipeline runs one pipeline stage per process, and this run has one process: launch "
                         "with several (`hasten launch -n N`), or call prepare_pippy, which runs the model as it is "
                         "on one process.")
    split_points = _check_split_points(model, split_points, num_stages)
    args, kwargs = _check_examples(args, kwargs)
    pipe = _trace(model, split_points, args, kwargs)
    _stage_count_check(pipe, split_points, num_stages)
    _TracedInputs(pipe, args, kwargs, num_chunks)
    return _schedule(pipe, num_chunks)


# ============================================================================================ running
def _default_inputs(num_chunks: int):
    def check(args, kwargs):
        batch = find_pippy_batch_size(args, kwargs)
        if batch is None:
            raise PipelineInputError("Could not find batch size from args or kwargs: pass the batch as tensors.")
        _check_divides(batch, num_chunks)
        return args, kwargs

    return check


def _check_divides(batch: int, num_chunks: int) -> None:
    if batch % num_chunks:
        raise PipelineInputError(
            f"The batch size {batch} does not divide by num_chunks={num_chunks}: a pipeline cuts the batch into "
            f"num_chunks equal micro-batches. Pad the batch to a multiple of {num_chunks} (pad_input_tensors) or "
            f"prepare the model with a num_chunks that divides it.")


def _from_last_stage(output, state):
    """The last process's output on every process (the others need not know its structure or shapes)."""
    from ...collectives.operations import (
        broadcast,
        broadcast_object_list,
        get_data_structure,
        initialize_tensors,
    )

    last = state.num_processes - 1
    box = broadcast_object_list([get_data_structure(output) if state.is_last_process else None], from_process=last)
    if not state.is_last_process:
        output = initialize_tensors(box[0], device=state.device)
    tensors = _tensors(output)
    if tensors:
        broadcast(tensors, from_process=last)
    return output


def _run(forward, num_chunks: int, gather_output: bool, args: tuple, kwargs: dict, check_inputs) -> Any:
    """One pipelined call: the first process checks its inputs and tells the others, then every stage runs."""
    from ...collectives.operations import broadcast_object_list, send_to_device
    from ...state import PartialState

    state = PartialState()
    if state.num_processes == 1:
        with torch.no_grad():
            return forward(*args, **kwargs)
    first = state.process_index == 0
    refusal = None
    if first:
        try:
            args, kwargs = check_inputs(args, kwargs)
        except PipelineInputError as error:
            refusal = error
    told = broadcast_object_list([str(refusal) if refusal is not None else None], from_process=0)[0]
    if refusal is not None:
        raise refusal
    if told is not None:
        raise PipelineInputError(f"The first process refused the inputs of this pipelined call: {told}")
    with torch.no_grad():
        if first:
            output = forward(*send_to_device(tuple(args), state.device), **send_to_device(kwargs, state.device))
        else:
            output = forward()
    if not state.is_last_process:
        output = None
    if gather_output:
        output = _from_last_stage(output, state)
    return output


def pippy_forward(forward: Callable[..., Any], num_chunks: int, gather_output: bool, *args: Any, **kwargs: Any) -> Any:
    """Run one batch through a pipeline schedule's ``forward`` (its ``step``): the inputs are read on the first
    process, cut into ``num_chunks`` micro-batches (the batch must divide by it), and the output is returned on the
    last process (every process with ``gather_output``), None elsewhere; without autograd. On one process,
    ``forward(*args, **kwargs)``."""
    num_chunks = _check_num_chunks(num_chunks)
    return _run(forward, num_chunks, gather_output, args, kwargs, _default_inputs(num_chunks))


def prepare_pippy(
    model: nn.Module,
    split_points: Optional[Union[str, list[str]]] = "auto",
    no_split_module_classes: Optional[list[str]] = None,
    example_args: Optional[tuple[Any]] = (),
    example_kwargs: Optional[dict[str, Any]] = None,
    num_chunks: Optional[int] = None,
    gather_output: Optional[bool] = False,
) -> nn.Module:
    """Cut ``model`` into one pipeline stage per process for inference and return it, its ``forward`` running the
    pipeline (see the module docstring).

    Parameters:
        split_points: ``"auto"`` (a balanced split from ``generate_device_map``) or the names of the
            ``num_processes - 1`` modules where stages 1.. begin.
        no_split_module_classes: module classes ``"auto"`` keeps whole in one stage.
        example_args / example_kwargs: one micro-batch of inputs (a call's batch divided by ``num_chunks``), to
            trace the model; every call brings the same inputs, in the same way, ``num_chunks`` times as large.
        num_chunks: micro-batches per call; default, the number of processes.
        gather_output: the output on every process (sent from the last), instead of on the last only.

    Sets ``model.hf_split_points``, ``model.pippy_stage`` (the ``ScheduleGPipe``; None on one process, where the
    model runs whole), ``model._original_forward`` and ``model._original_call``; ``model.forward`` is replaced.
    """
    _check_available()
    if num_chunks is not None:
        _check_num_chunks(num_chunks)
    if not isinstance(model, nn.Module):
        raise TypeError(f"prepare_pippy expects an nn.Module, got {type(model).__name__}.")
    if "pippy_stage" in model.__dict__:
        raise ValueError("This model was already prepared with prepare_pippy; prepare a fresh copy of the model.")
    example_args, example_kwargs = _check_examples(example_args, example_kwargs)
    num_stages = _world_size()
    num_chunks = num_stages if num_chunks is None else num_chunks
    if isinstance(split_points, str) and split_points == "auto":
        split_points = _auto_split_points(model, num_stages, no_split_module_classes)
    split_points = _check_split_points(model, split_points, num_stages)

    if num_stages == 1:  # the only stage is the whole model
        schedule, step = None, model.forward

        def check_inputs(args, kwargs):
            batch = find_pippy_batch_size(args, kwargs)
            if batch is not None:
                _check_divides(batch, num_chunks)
            return args, kwargs
    else:
        pipe = _trace(model, split_points, example_args, example_kwargs)
        _stage_count_check(pipe, split_points, num_stages)
        traced = _TracedInputs(pipe, example_args, example_kwargs, num_chunks)
        schedule = _schedule(pipe, num_chunks)
        del pipe  # the other stages' modules can be freed
        step = schedule.step

        def check_inputs(args, kwargs):
            return (), traced.first_stage_inputs(args, kwargs)

    model.hf_split_points = split_points
    model._original_forward = model.forward
    model._original_call = model.__call__
    model.pippy_stage = schedule

    def forward(*args, **kwargs):
        if num_stages == 1:
            check_inputs(args, kwargs)
        return _run(step, num_chunks, gather_output, args, kwargs, check_inputs)

    forward.__wrapped__ = model._original_forward
    model.forward = forward
    return model
