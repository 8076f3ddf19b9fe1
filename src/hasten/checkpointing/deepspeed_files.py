"""Reading a DeepSpeed engine checkpoint into plain PyTorch states, with no process group and no engine.

``engine.save_checkpoint(save_dir, tag)`` writes ``save_dir/tag/``: the model-states file(s) and, for ZeRO (and
DeepSpeed's BF16_Optimizer), one optimizer file per data-parallel rank holding that rank's flat partition of the
fp32 master weights and of the optimizer moments. This module rebuilds from those files the model's full fp32
state dict and the optimizer's full state in ``torch.optim.Optimizer.state_dict()`` layout, so that a run saved
under DeepSpeed continues under plain PyTorch, DDP or FSDP.

What each layout holds (DeepSpeed 0.19):

* stage 0, fp32: ``mp_rank_00_model_states.pt`` has the full weights (``module``) and the client optimizer's own
  ``state_dict()`` (``optimizer``);
* stage 0, bf16/fp16: ``optimizer`` is DeepSpeed's FP16_UnfusedOptimizer state: one fp32 master copy per
  parameter (``fp32_groups``) and the base optimizer's ``state_dict()`` over those copies;
* ZeRO 1/2 (and the BF16_Optimizer, bf16 at stage 1 with fp32 gradient accumulation): per rank
  ``[bf16_]zero_pp_rank_<r>_mp_rank_00_optim_states.pt`` with the rank's fp32 partition of each param group
  (``single_partition_of_fp32_groups``) and the base optimizer's ``state_dict()`` over those partitions
  (``base_optimizer_state``: one flat tensor per group, padded where the fp32 partition may not be);
* ZeRO 3: per rank model-states and optimizer files; the fp32 partitions are ``fp32_flat_groups`` (one per
  sub-group) and the base optimizer's ``state_dict()`` is ``optimizer_state_dict`` (one flat tensor per
  sub-group, listed under the param group it belongs to).

The weights are rebuilt with DeepSpeed's own ``zero_to_fp32`` reconstruction. The moments have exactly the
layout of the fp32 partitions (the base optimizer was built over them), so the same reconstruction is applied
with the moments in their place; scalar entries such as ``step`` are given to every parameter of the group.

Security: DeepSpeed pickles its own classes into these files, so they are read with
``torch.load(weights_only=False)``, which can run code from the file. This is done only for the files inside the
folder the caller passed, and the caller opts in by pointing at a DeepSpeed checkpoint: load only checkpoints you
trust, exactly as with ``deepspeed`` itself. ``load_state`` asks first (``deepspeed_io.check_trusted``): a folder
its own ``save_state`` completed, or ``load_kwargs={"weights_only": False}``.
"""
from __future__ import annotations

import contextlib
import io
import os
import re
from pathlib import Path
from typing import Any, Callable, Optional, Union

import torch

from .errors import CorruptCheckpointError, IncompleteCheckpointError, UnsafeCheckpointError
from .optimizer_names import by_name, by_position
from .safe_load import UNSAFE_OPT_IN

__all__ = ["DeepSpeedCheckpointFormat", "check_trusted", "is_deepspeed_checkpoint", "read_deepspeed_layout",
           "read_deepspeed_checkpoint", "deepspeed_parameter_names"]

MODEL_FILE = "mp_rank_00_model_states.pt"
ZERO3_MODEL_FILE = "zero_pp_rank_{rank}_mp_rank_00_model_states.pt"
OPTIM_FILE = "{prefix}zero_pp_rank_{rank}_mp_rank_00_optim_states.pt"
_OPTIM_FILE_PATTERN = re.compile(r"^(bf16_)?zero_pp_rank_(\d+)_mp_rank_(\d+)_optim_states\.pt$")
_INSTALL_HINT = "pip install 'hasten[deepspeed]'"


def _require_deepspeed():
    """DeepSpeed is needed to unpickle its checkpoint files and to rebuild the ZeRO partitions."""
    try:
        from deepspeed.utils import zero_to_fp32
    except ImportError as error:
        raise ImportError(f"Reading a DeepSpeed checkpoint needs the deepspeed package: {_INSTALL_HINT}") from error
    return zero_to_fp32


def is_deepspeed_checkpoint(folder: Union[str, os.PathLike]) -> bool:
    """Whether ``folder`` is the tag folder of a DeepSpeed engine checkpoint (it holds a model-states file)."""
    folder = Path(folder)
    return (folder / MODEL_FILE).is_file() or (folder / ZERO3_MODEL_FILE.format(rank=0)).is_file()


def _load(path: Path, *, mmap: bool = False) -> dict:
    """``torch.load`` of one DeepSpeed file with ``weights_only=False`` (see the module docstring)."""
    if not path.is_file():
        raise IncompleteCheckpointError(
            f"DeepSpeed checkpoint {path.parent} is incomplete: {path.name} is missing. Point at a checkpoint that "
            "every rank finished saving.")
    try:
        return torch.load(path, map_location="cpu", weights_only=False, mmap=mmap)
    except (RuntimeError, EOFError, OSError) as error:
        raise CorruptCheckpointError(f"Cannot read DeepSpeed checkpoint file {path}: {error}") from error


def _model_file(folder: Path) -> Path:
    if not is_deepspeed_checkpoint(folder):
        raise CorruptCheckpointError(
            f"{folder} is not a DeepSpeed checkpoint folder: it has neither {MODEL_FILE} nor "
            f"{ZERO3_MODEL_FILE.format(rank=0)}. Pass the tag folder that engine.save_checkpoint wrote "
            "(e.g. <save_dir>/<tag>).")
    plain = folder / MODEL_FILE
    return plain if plain.is_file() else folder / ZERO3_MODEL_FILE.format(rank=0)


def _optim_files_present(folder: Path) -> list:
    found = [p for p in folder.iterdir() if _OPTIM_FILE_PATTERN.match(p.name)]
    other_mp = sorted(p.name for p in found if _OPTIM_FILE_PATTERN.match(p.name).group(3) != "00")
    if other_mp or (folder / "mp_rank_01_model_states.pt").is_file():
        raise CorruptCheckpointError(
            f"DeepSpeed checkpoint {folder} was saved with tensor/model parallelism (mp_rank > 0 files), which this "
            "reader does not merge. Convert it with DeepSpeed's universal checkpoint tools first.")
    return found


def _weight_dtype(model_states: dict) -> torch.dtype:
    """The dtype the engine trained its module in: that of the saved (possibly placeholder) parameters."""
    buffers = set(model_states.get("buffer_names") or ())
    for name, tensor in model_states["module"].items():
        if name not in buffers and torch.is_tensor(tensor) and tensor.is_floating_point():
            return tensor.dtype
    return torch.float32


def _optimizer_kind(model_states: dict, first_optim: Optional[dict]) -> str:
    """Which DeepSpeed optimizer wrote the checkpoint: it decides where the fp32 weights and moments are."""
    if first_optim is not None:
        return "zero" if "zero_stage" in first_optim["optimizer_state_dict"] else "bf16_optimizer"
    saved = model_states.get("optimizer")
    if saved is None:
        return "none"
    if "fp32_groups" in saved:
        return "fp16_unfused"
    if "fp32_groups_flat" in saved:
        return "fp16_fused"
    return "torch"


def read_deepspeed_layout(folder: Union[str, os.PathLike]) -> dict:
    """Cheaply describe a DeepSpeed checkpoint: ZeRO stage, data-parallel size, training dtype, file names.

    Reads only the model-states file and the first optimizer file, memory-mapped (the big tensors stay on disk).
    Returns ``{"zero_stage", "world_size", "dtype" ("float32"/"bfloat16"/"float16"), "optimizer" (which DeepSpeed
    optimizer wrote it: "torch", "fp16_unfused", "fp16_fused", "zero", "bf16_optimizer" or "none"),
    "model_files", "optim_files", "ds_version", "global_steps"}``.
    """
    _require_deepspeed()
    folder = Path(folder)
    model_states = _load(_model_file(folder), mmap=True)
    present = _optim_files_present(folder)
    world_size = int(model_states.get("dp_world_size") or 1)
    zero3 = not (folder / MODEL_FILE).is_file()
    dtype = _weight_dtype(model_states)
    config = model_states.get("ds_config") or {}
    stage = (config.get("zero_optimization") or {}).get("stage")
    # ZeRO keeps the optimizer in per-rank files only (named bf16_... when training in bf16).
    expects_files = bool(present) or (model_states.get("optimizer") is None and int(stage or 0) >= 1)
    bf16 = any(p.name.startswith("bf16_") for p in present) if present else dtype == torch.bfloat16
    prefix = "bf16_" if bf16 else ""
    optim_files = [OPTIM_FILE.format(prefix=prefix, rank=r) for r in range(world_size)] if expects_files else []
    first_optim = _load(folder / optim_files[0], mmap=True) if optim_files else None
    kind = _optimizer_kind(model_states, first_optim)
    if stage is None:
        stage = int(first_optim["optimizer_state_dict"].get("zero_stage", 1)) if first_optim else 0
    if first_optim is not None:
        counts = first_optim["optimizer_state_dict"].get("partition_count", world_size)
        counts = set(counts) if isinstance(counts, (list, tuple)) else {counts}
        if counts != {world_size}:
            raise CorruptCheckpointError(
                f"DeepSpeed checkpoint {folder}: optimizer partition counts {sorted(counts)} differ from the "
                f"data-parallel size {world_size} (expert or sequence parallel groups); this reader does not merge "
                "such checkpoints.")
    model_files = ([ZERO3_MODEL_FILE.format(rank=r) for r in range(world_size)] if zero3 else [MODEL_FILE])
    return {"zero_stage": int(stage), "world_size": world_size,
            "dtype": str(dtype).replace("torch.", ""), "optimizer": kind,
            "model_files": model_files, "optim_files": optim_files, "ds_version": model_states.get("ds_version"),
            "global_steps": model_states.get("global_steps")}


# ----------------------------------------------------------------------------------------------------------------
# Stage 0: the model-states file holds everything; only the parameter names of optimizer positions are inferred.

def _stage0_names(model_states: dict, shapes_per_group: list) -> list:
    """Names per optimizer group for a stage-0 checkpoint, which records no such mapping.

    The optimizer is assumed to list the parameters in the module's order (``model.parameters()``, tied ones
    once), split over its groups; the saved per-position shapes must agree, otherwise the mapping is unknowable.
    """
    buffers = set(model_states.get("buffer_names") or ())
    names, seen = [], set()
    for name, tensor in model_states["module"].items():
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape))
        if name in buffers or key in seen:
            continue
        seen.add(key)
        names.append(name)
    module = model_states["module"]
    flat_shapes = [shape for group in shapes_per_group for shape in group]
    agrees = len(names) == len(flat_shapes) and all(
        shape is None or tuple(module[name].shape) == tuple(shape) for name, shape in zip(names, flat_shapes))
    if not agrees:
        raise CorruptCheckpointError(
            "This stage-0 DeepSpeed checkpoint does not record which parameter each optimizer position belongs to, "
            "and its optimizer does not list the model's parameters in module order (positions "
            f"{[tuple(s) if s is not None else None for s in flat_shapes]} vs parameters "
            f"{[(n, tuple(module[n].shape)) for n in names]}). Map the positions yourself from the optimizer you "
            "built, or save the run with ZeRO stage >= 1, whose files name every parameter.")
    out, start = [], 0
    for group in shapes_per_group:
        out.append(names[start:start + len(group)])
        start += len(group)
    return out


def _shared_names(module: dict, names: list) -> dict:
    """Every state-dict name under which each parameter name's tensor is saved (tied parameters)."""
    def key(tensor):
        return tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape)

    owners = {key(module[name]): name for name in names}
    aliases = {name: [] for name in names}
    for name, tensor in module.items():
        owner = owners.get(key(tensor))
        if owner is not None:
            aliases[owner].append(name)
    return aliases


def _stage0_state(model_states: dict, kind: str):
    module, saved = model_states["module"], model_states.get("optimizer")
    buffers = set(model_states.get("buffer_names") or ())
    if kind == "torch":
        optimizer = saved
        shapes = [[tuple(optimizer["state"][i]["exp_avg"].shape) if "exp_avg" in optimizer["state"].get(i, {})
                   else None for i in group["params"]] for group in optimizer["param_groups"]]
    elif kind == "fp16_unfused":
        optimizer = saved["optimizer_state_dict"]
        shapes = [[tuple(t.shape) for t in group] for group in saved["fp32_groups"]]
    elif kind == "fp16_fused":
        raise CorruptCheckpointError(
            "This stage-0 DeepSpeed checkpoint was written by DeepSpeed's fused FP16_Optimizer (FusedAdam), whose "
            "flat master weights this reader does not split yet. Convert it with DeepSpeed "
            "(engine.load_checkpoint, then save with a torch optimizer) or save with ZeRO stage >= 1.")
    else:
        raise CorruptCheckpointError("This DeepSpeed checkpoint holds no optimizer state; pass with_optimizer=False.")
    names = _stage0_names(model_states, shapes)
    state = {name: (t.float() if t.is_floating_point() else t) for name, t in module.items()}
    if kind == "fp16_unfused":
        aliases = _shared_names(module, [n for group in names for n in group])
        for group_names, masters in zip(names, saved["fp32_groups"]):
            for name, master in zip(group_names, masters):
                for alias in aliases[name]:
                    state[alias] = master
    for name in buffers & set(state):
        state[name] = module[name].float() if module[name].is_floating_point() else module[name]
    return state, optimizer, names


# ----------------------------------------------------------------------------------------------------------------
# ZeRO 1-3 and the BF16_Optimizer: per-rank flat partitions, rebuilt with DeepSpeed's zero_to_fp32.

def _load_optim_files(folder: Path, layout: dict) -> list:
    missing = [name for name in layout["optim_files"] if not (folder / name).is_file()]
    if missing:
        raise IncompleteCheckpointError(
            f"DeepSpeed checkpoint {folder} is incomplete: {', '.join(missing)} missing (expected one optimizer file "
            f"per data-parallel rank, {layout['world_size']} in all). Point at a checkpoint that every rank "
            "finished saving.")
    return [_load(folder / name)["optimizer_state_dict"] for name in layout["optim_files"]]


def _partitions(optim: list, stage: int):
    """Per rank: the fp32 flat partitions and the base optimizer's state_dict over them.

    A group's flat is padded at its end, inside the last rank's partition; ZeRO 1/2 save their fp32 partitions
    without that padding, the BF16_Optimizer and all moments with it. Being trailing, it is never read:
    zero_to_fp32 walks the parameters from the start and allows for that alignment in its size check.
    """
    if stage == 3:
        return [sd["fp32_flat_groups"] for sd in optim], [sd["optimizer_state_dict"] for sd in optim]
    bases = [sd["base_optimizer_state"] for sd in optim]
    if isinstance(bases[0], list):
        raise CorruptCheckpointError(
            "This DeepSpeed checkpoint was saved with zero_optimization.elastic_checkpoint=true, whose optimizer "
            "layout this reader does not rebuild; save without it.")
    return [sd["single_partition_of_fp32_groups"] for sd in optim], bases


def _quiet(function, *args):
    """DeepSpeed's reconstruction prints progress; a library reading a checkpoint should not."""
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        return function(*args)


def _owned(tensors: dict) -> dict:
    """Contiguous copies that do not keep the whole flat buffers alive; tied names keep sharing one tensor."""
    copies, out = {}, {}
    for name, tensor in tensors.items():
        if id(tensor) not in copies:
            copies[id(tensor)] = tensor.contiguous().clone()
        out[name] = copies[id(tensor)]
    return out


def _rebuild(zero_to_fp32, stage: int, world_size: int, flats: list, model_states: list, paddings) -> dict:
    """name -> full tensor from per-rank flat partitions laid out like the fp32 master weights."""
    merged = {}
    if stage == 3:
        _quiet(zero_to_fp32._zero3_merge_trainable_params, merged, world_size, flats, model_states)
        return zero_to_fp32.to_torch_tensor(merged)
    _quiet(zero_to_fp32._zero2_merge_trainable_params, merged, world_size, flats, model_states, paddings)
    return merged


def _zero_state(folder: Path, layout: dict, with_optimizer: bool):
    zero_to_fp32 = _require_deepspeed()
    world_size = layout["world_size"]
    stage = 3 if layout["zero_stage"] == 3 else 2  # ZeRO 1, 2 and the BF16_Optimizer share one flat layout
    model_states = _quiet(zero_to_fp32.parse_model_states, [str(folder / f) for f in layout["model_files"]])
    optim = _load_optim_files(folder, layout)
    flats, bases = _partitions(optim, stage)
    paddings = optim[0].get("param_alignment_paddings")
    param_groups = bases[0]["param_groups"]
    shapes = model_states[0].param_shapes
    if stage == 3:
        names = [[n for position in group["params"] for n in shapes[position]] for group in param_groups]
    else:
        names = [list(group) for group in shapes]
    if len(names) != len(param_groups):
        raise CorruptCheckpointError(
            f"DeepSpeed checkpoint {folder}: {len(shapes)} parameter-shape groups for {len(param_groups)} optimizer "
            "groups; the files do not belong together.")
    if stage == 3:
        weights = _quiet(zero_to_fp32._get_fp32_state_dict_from_zero3_checkpoint, world_size, flats, model_states,
                         False)
        weights = zero_to_fp32.to_torch_tensor(weights)
    else:
        weights = _quiet(zero_to_fp32._get_fp32_state_dict_from_zero2_checkpoint, world_size, flats, model_states,
                         False, paddings)
    weights = _owned(weights)
    if not with_optimizer:
        return weights, None, names
    optimizer = _zero_optimizer_state(zero_to_fp32, stage, world_size, bases, model_states, paddings,
                                      names, param_groups)
    return weights, optimizer, names


def _zero_optimizer_state(zero_to_fp32, stage, world_size, bases, model_states, paddings, names,
                          param_groups) -> dict:
    """Torch layout: one entry per parameter, numbered across groups in the optimizer's order."""
    flat_positions = [p for group in param_groups for p in group["params"]]
    first_state = bases[0]["state"]
    keys = list(dict.fromkeys(k for position in flat_positions for k in first_state.get(position, {})))
    per_name = {}
    for key in keys:
        sample = first_state[flat_positions[0]][key]
        if torch.is_tensor(sample) and sample.dim() > 0:
            parts = [[base["state"][p][key] for p in flat_positions] for base in bases]
            for name, tensor in _owned(_rebuild(zero_to_fp32, stage, world_size, parts, model_states,
                                                paddings)).items():
                per_name.setdefault(name, {})[key] = tensor
    state, groups, position = {}, [], 0
    for group, group_names in zip(param_groups, names):
        flat_scalars = first_state.get(group["params"][0], {}) if group["params"] else {}
        positions = []
        for name in group_names:
            entry = {key: (value.clone() if torch.is_tensor(value) else value)
                     for key, value in flat_scalars.items() if not (torch.is_tensor(value) and value.dim() > 0)}
            entry.update(per_name.get(name, {}))
            if entry:
                state[position] = dict(sorted(entry.items(), key=lambda kv: keys.index(kv[0])))
            positions.append(position)
            position += 1
        groups.append({**{k: v for k, v in group.items() if k != "params"}, "params": positions})
    return {"state": state, "param_groups": groups}


# ----------------------------------------------------------------------------------------------------------------

def read_deepspeed_checkpoint(folder: Union[str, os.PathLike], *,
                              with_optimizer: bool = True) -> tuple[dict, Optional[dict]]:
    """Rebuild ``(model_state, optimizer_state)`` from a DeepSpeed tag folder, on CPU, with no process group.

    ``model_state``: every name of the model's ``state_dict()`` (tied parameters under each of their names,
    persistent buffers included), parameters as full fp32 tensors (the fp32 master weights when the engine
    trained in bf16/fp16). ``optimizer_state``: what ``torch.optim.<Optimizer>.state_dict()`` of the same model
    would hold (``{"state": {position: {...}}, "param_groups": [{hyperparameters..., "params": [positions]}]}``,
    positions numbered across groups in the optimizer's order; :func:`deepspeed_parameter_names` gives their
    names), or ``None`` when ``with_optimizer`` is false. Files are unpickled with ``weights_only=False``: see
    the module docstring.
    """
    folder = Path(folder)
    layout = read_deepspeed_layout(folder)
    if layout["optim_files"]:
        weights, optimizer, _ = _zero_state(folder, layout, with_optimizer)
        return weights, optimizer
    model_states = _load(folder / MODEL_FILE)
    if layout["optimizer"] == "none" or (not with_optimizer and layout["optimizer"] == "torch"):
        module = model_states["module"]
        return {n: (t.float() if t.is_floating_point() else t) for n, t in module.items()}, None
    weights, optimizer, _ = _stage0_state(model_states, layout["optimizer"])
    return weights, (optimizer if with_optimizer else None)


def deepspeed_parameter_names(folder: Union[str, os.PathLike]) -> list[list[str]]:
    """The parameter names of each optimizer group, in position order (position ``i`` of
    ``read_deepspeed_checkpoint``'s optimizer state is the ``i``-th name of the flattened list).

    ZeRO checkpoints record them; stage-0 ones do not, so there the module's parameter order is assumed and
    checked against the saved shapes (a clear error when they disagree).
    """
    folder = Path(folder)
    layout = read_deepspeed_layout(folder)
    if layout["optim_files"]:
        zero_to_fp32 = _require_deepspeed()
        model_states = _quiet(zero_to_fp32.parse_model_states, [str(folder / layout["model_files"][0])])
        shapes = model_states[0].param_shapes
        if layout["zero_stage"] != 3:
            return [list(group) for group in shapes]
        first = _load(folder / layout["optim_files"][0], mmap=True)["optimizer_state_dict"]
        groups = first["optimizer_state_dict"]["param_groups"]
        return [[n for position in group["params"] for n in shapes[position]] for group in groups]
    return _stage0_state(_load(folder / MODEL_FILE, mmap=True), layout["optimizer"])[2]


def check_trusted(folder: Path, marker: Optional[dict], load_kwargs: Optional[dict]) -> None:
    """DeepSpeed's checkpoint files are pickles of its own classes, and unpickling can run code: they are read only
    from a checkpoint hasten's ``save_state`` completed (its completion marker is there, with every file's checksum)
    or one the caller says it trusts (``load_kwargs={"weights_only": False}``)."""
    if marker is not None or (load_kwargs or {}).get("weights_only", True) is False:
        return
    raise UnsafeCheckpointError(
        f"{folder} holds a DeepSpeed engine checkpoint that hasten's save_state did not complete (it has no completion "
        "marker): DeepSpeed writes pickles, which can run code when they are loaded. Nothing was loaded. If you trust "
        f"this folder, load it with {UNSAFE_OPT_IN}.")


class DeepSpeedCheckpointFormat:
    """A DeepSpeed engine's checkpoint folder (``pytorch_model[_i]/``, beside it DeepSpeed's ``latest`` and
    ``zero_to_fp32.py``), which the engine writes (``strategies/deepspeed/checkpoint_io.py``) and every strategy reads whole here,
    with no engine. The one place the folder's name is spelled."""

    #: the names this format adds to a checkpoint folder
    NAME_PATTERN = r"pytorch_model(_\d+)?|latest|zero_to_fp32\.py"

    @staticmethod
    def folder_name(index: int) -> str:
        """The folder engine ``index`` writes its own checkpoint to (``pytorch_model``, ``pytorch_model_1``)."""
        return "pytorch_model" if index == 0 else f"pytorch_model_{index}"

    def folder(self, checkpoint: Path, index: int) -> Path:
        return Path(checkpoint) / self.folder_name(index)

    def recognises(self, path: Path) -> bool:
        return Path(path).is_dir() and is_deepspeed_checkpoint(path)

    # ------------------------------------------------------------ found in a folder, read whole
    def model_location(self, folder: Path, index: int) -> Optional[Path]:
        """Engine ``index``'s checkpoint folder inside ``folder``, or None."""
        path = self.folder(folder, index)
        return path if self.recognises(path) else None

    def optimizer_location(self, folder: Path, index: int) -> Optional[Path]:
        """The engine checkpoint holding optimizer ``index`` (the engine's own), or None."""
        return self.model_location(folder, index)

    def check_trusted(self, checkpoint: Path, marker: Optional[dict], load_kwargs: Optional[dict]) -> None:
        check_trusted(checkpoint, marker, load_kwargs)

    def read_weights(self, path: Path, what: str, *, device: Any = "cpu",
                     load_kwargs: Optional[dict] = None) -> dict:
        """The model's full fp32 state dict, rebuilt from the engine's partitions (on the CPU)."""
        return read_deepspeed_checkpoint(path, with_optimizer=False)[0]

    def read_optimizer(self, path: Path, what: str, names: Callable[[], list], *, device: Any = "cpu",
                       load_kwargs: Optional[dict] = None) -> dict:
        """The optimizer's full state rebuilt from the engine's partitions, by position for the parameters
        ``names()`` lists (the prepared optimizer's, per group)."""
        return self.read_weights_and_optimizer(path, names)[1]

    def read_weights_and_optimizer(self, path: Path, names: Optional[Callable[[], list]]) -> tuple:
        """``(weights, optimizer state)`` rebuilt in one read of the partitions; the optimizer's by position for the
        parameters ``names()`` lists, or None when ``names`` is None (no optimizer wanted)."""
        weights, state = read_deepspeed_checkpoint(path, with_optimizer=names is not None)
        if state is None:
            return weights, None
        named = by_name(state, deepspeed_parameter_names(path))
        return weights, by_position(named, names(), state["param_groups"])
