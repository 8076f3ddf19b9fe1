"""``ParallelDims``: how the processes of a job are laid out over the parallel dimensions, and the one DeviceMesh.

A job of ``world_size`` processes is a grid ``dp_replicate x dp_shard x cp x sp x tp``; a process's coordinate on
each dimension follows from its global rank, row-major in that order (tp varies fastest, so the ranks of one
tensor-parallel group are neighbours, on one machine). Data is split over ``dp = dp_replicate x dp_shard``; the
ranks of one tp / cp / sp group see the same batch.

The sizes are checked when the object is made, so a layout that cannot be built fails before any process group
exists, with a message naming the sizes and the number of processes. The ``torch.distributed.DeviceMesh`` is built
once, on demand (``build_mesh`` / ``mesh``), with the dimensions larger than 1 in the order ``dp_replicate, dp_shard,
cp, tp`` and the flattened dimensions ``dp``, ``dp_shard_cp`` and ``dp_cp``. Plain data parallelism needs no mesh:
its data-parallel group is the default world group (``dp_group is None``), so DDP runs as it always did. DeepSpeed
sequence parallelism (``sp``) builds its own groups, so it takes no part in the torch mesh.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Optional, Protocol

if TYPE_CHECKING:  # torch is imported only when a mesh or a group is asked for
    from torch.distributed import DeviceMesh, ProcessGroup

__all__ = ["ParallelDims", "LAYOUT_ORDER", "MESH_ORDER"]

# Every dimension, outermost first: the order of the rank arithmetic (pipeline stages outermost, as torchtitan).
LAYOUT_ORDER = ("pp", "dp_replicate", "dp_shard", "cp", "sp", "tp")
# The dimensions of the torch DeviceMesh (sp is DeepSpeed's and has none).
MESH_ORDER = ("pp", "dp_replicate", "dp_shard", "cp", "tp")
# Flattened mesh dimensions: name -> the dimensions they join.
FLATTENED = (("dp", ("dp_replicate", "dp_shard")), ("dp_shard_cp", ("dp_shard", "cp")),
             ("dp_cp", ("dp_replicate", "dp_shard", "cp")))
_DIM_AND_FLAT_NAMES = frozenset(MESH_ORDER) | {name for name, _ in FLATTENED}


class _SizesConfig(Protocol):
    """What ``from_config`` reads of a ``ParallelismConfig`` (whose module imports this one: named, not imported):
    the sizes, and the layout it keeps."""

    dp_replicate_size: Optional[int]
    dp_shard_size: Optional[int]
    tp_size: Optional[int]
    cp_size: Optional[int]
    sp_size: Optional[int]
    _layout: Optional[ParallelDims]


def _count(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"ParallelDims: {name} must be a whole number >= 1, got {value!r}.")
    return value


def _product_text(sizes: dict) -> str:
    """``"dp_shard_size=2 x tp_size=2 = 4 processes"`` (the sizes larger than 1)."""
    shown = [f"{name}_size={size}" for name, size in sizes.items() if size > 1] or ["every size 1"]
    return f"{' x '.join(shown)} = {math.prod(sizes.values())} processes"


def _world_text(world_size: int) -> str:
    return f"the job has {world_size} process{'es' if world_size != 1 else ''} (WORLD_SIZE={world_size})"


def _current_rank() -> int:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return int(os.environ.get("RANK", "0"))


def _default_device_type() -> str:
    """The device type of the default process group's backend (nccl: cuda, gloo: cpu), else what is available."""
    import torch
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        backend = str(dist.get_backend())
        if "nccl" in backend and torch.cuda.is_available():
            return "cuda"
        if "gloo" in backend and "cuda" not in backend:
            return "cpu"
    return "cuda" if torch.cuda.is_available() else "cpu"


@dataclass
class ParallelDims:
    """The layout of ``world_size`` processes over data / context / sequence / tensor parallel dimensions.

    Sizes are whole numbers >= 1 whose product is ``world_size``. When every size is 1 and the job has several
    processes, the processes are data-parallel replicas (``dp_replicate = world_size``), as in Accelerate. With
    DeepSpeed sequence parallelism (``sp > 1``) and no data-parallel size given, the processes left over are
    DeepSpeed's data-parallel ranks (``dp_replicate = world_size / (sp x tp x cp)``). ``cp`` and ``sp`` exclude each
    other. ``rank`` is this process's global rank (default: the process group's, else ``$RANK``, else 0).
    """

    dp_replicate: int = 1
    dp_shard: int = 1
    cp: int = 1
    tp: int = 1
    sp: int = 1
    world_size: int = 1
    pp: int = 1  # pipeline stages (hasten's torch-native engine), outermost
    rank: Optional[int] = None
    #: dimensions of size 1 kept in the mesh all the same (a backend that needs their names: DDP x TP shards over a
    #: one-rank ``dp_shard`` dimension); set before the mesh is built
    unit_dims: tuple = field(default=(), compare=False)
    _mesh: Optional["DeviceMesh"] = field(default=None, init=False, repr=False, compare=False)
    _flattened: dict = field(default_factory=dict, init=False, repr=False, compare=False)
    _solo_group: Optional["ProcessGroup"] = field(default=None, init=False, repr=False, compare=False)
    _config: object = field(default=None, init=False, repr=False, compare=False)  # the ParallelismConfig, if any

    def __post_init__(self):
        world = _count("world_size", self.world_size)
        sizes = {name: _count(name, getattr(self, name)) for name in LAYOUT_ORDER}
        if sizes["cp"] > 1 and sizes["sp"] > 1:
            raise ValueError(f"Context parallelism and sequence parallelism exclude each other: got cp_size="
                             f"{sizes['cp']} and sp_size={sizes['sp']}; set one of them to 1.")
        if math.prod(sizes.values()) == 1 and world > 1:
            self.dp_replicate = sizes["dp_replicate"] = world  # nothing asked for: plain data parallelism
        elif sizes["sp"] > 1 and sizes["dp_replicate"] * sizes["dp_shard"] == 1:
            model = sizes["sp"] * sizes["tp"] * sizes["cp"]
            if world % model:
                raise ValueError(f"{_product_text(sizes)} does not divide the number of processes: "
                                 f"{_world_text(world)}. Launch a multiple of {model} processes, or change the sizes.")
            self.dp_replicate = sizes["dp_replicate"] = world // model  # DeepSpeed's data-parallel ranks
        total = math.prod(sizes.values())
        if total != world:
            raise ValueError(
                f"{_product_text(sizes)}, but {_world_text(world)}: the product of the parallel sizes does not match "
                f"the number of processes. Launch {total} processes (hasten launch -n {total}), or change the sizes "
                f"so that they multiply to {world}.")
        if self.rank is not None and not (isinstance(self.rank, int) and 0 <= self.rank < world):
            raise ValueError(f"ParallelDims: rank must be a whole number from 0 to {world - 1}, got {self.rank!r}.")

    # ------------------------------------------------------------------------------------------ constructors
    @classmethod
    def from_config(cls, config: Optional[_SizesConfig], world_size: int, rank: Optional[int] = None) -> ParallelDims:
        """The layout a ``ParallelismConfig`` asks for on ``world_size`` processes; ``None``: plain data parallelism.

        The config keeps the layout laid out from it: asked again for the same processes, this returns that one, so
        the config, the Accelerator's strategy and the state all see the one DeviceMesh it builds.
        """
        if config is None:
            return cls(dp_replicate=_count("world_size", world_size), world_size=world_size, rank=rank)
        kept = config._layout
        if kept is not None and kept.world_size == world_size and kept.rank == rank:
            return kept
        dims = cls(dp_replicate=config.dp_replicate_size, dp_shard=config.dp_shard_size, cp=config.cp_size,
                   tp=config.tp_size, sp=config.sp_size, world_size=world_size, rank=rank,
                   pp=getattr(config, "pp_size", 1) or 1)
        dims._config = config
        if kept is not None and kept.built_mesh is not None:  # a mesh built for another process count stays valid
            dims.adopt_mesh(kept.built_mesh)
        config._layout = dims
        return dims

    # ------------------------------------------------------------------------------------------ sizes
    @property
    def sizes(self) -> dict:
        """``{dimension: size}`` in layout order (``dp_replicate, dp_shard, cp, sp, tp``; ``pp`` first when the model
        is cut into pipeline stages)."""
        return {name: getattr(self, name) for name in self._dims()}

    def _dims(self) -> tuple:
        return LAYOUT_ORDER if self.pp > 1 else LAYOUT_ORDER[1:]

    @property
    def dp_size(self) -> int:
        """Data-parallel degree: the number of different batches per step (``dp_replicate x dp_shard``)."""
        return self.dp_replicate * self.dp_shard

    @property
    def tp_size(self) -> int:
        return self.tp

    @property
    def cp_size(self) -> int:
        return self.cp

    @property
    def sp_size(self) -> int:
        return self.sp

    @property
    def pp_size(self) -> int:
        return self.pp

    @property
    def model_parallel(self) -> bool:
        """Whether the model (or its sequence) is split: tensor, context, sequence or pipeline parallelism."""
        return self.tp > 1 or self.cp > 1 or self.sp > 1 or self.pp > 1

    @property
    def sharded(self) -> bool:
        """Whether parameters are sharded over data-parallel ranks (FSDP / HSDP)."""
        return self.dp_shard > 1

    @property
    def uses_mesh(self) -> bool:
        """Whether training needs the torch DeviceMesh: sharding, context or tensor parallelism (not plain DDP,
        not DeepSpeed sequence parallelism, which builds its own groups)."""
        return self.sp == 1 and (self.dp_shard > 1 or self.cp > 1 or self.tp > 1 or self.pp > 1)

    @property
    def mesh_dim_names(self) -> tuple:
        """Named dimensions of the mesh: those larger than 1, in ``MESH_ORDER``; ``("dp_replicate",)`` when none."""
        names = tuple(name for name in MESH_ORDER if getattr(self, name) > 1 or name in self.unit_dims)
        return names or ("dp_replicate",)

    @property
    def mesh_shape(self) -> tuple:
        return tuple(getattr(self, name) for name in self.mesh_dim_names)

    @property
    def flattened_dim_names(self) -> dict:
        """``{flattened name: the mesh dimensions it joins}`` for those that exist in the mesh."""
        present = set(self.mesh_dim_names)
        joined = {name: tuple(dim for dim in dims if dim in present and getattr(self, dim) > 1)
                  for name, dims in FLATTENED}
        if not joined["dp"] and self.dp_size == 1 and self.mesh_dim_names == ("dp_replicate",):
            joined["dp"] = joined["dp_cp"] = ("dp_replicate",)  # one process
        return {name: dims for name, dims in joined.items() if dims}

    # ------------------------------------------------------------------------------------------ ranks
    def coordinates(self, rank: Optional[int] = None) -> dict:
        """``{dimension: coordinate}`` of ``rank`` (default: this process) on every dimension, in layout order."""
        rank = self.global_rank if rank is None else rank
        if not (isinstance(rank, int) and 0 <= rank < self.world_size):
            raise ValueError(f"rank must be from 0 to {self.world_size - 1}, got {rank!r}.")
        coordinates = {}
        for name in reversed(self._dims()):
            rank, coordinates[name] = divmod(rank, getattr(self, name))
        return {name: coordinates[name] for name in self._dims()}

    @property
    def global_rank(self) -> int:
        return _current_rank() if self.rank is None else self.rank

    @property
    def dp_replicate_rank(self) -> int:
        return self.coordinates()["dp_replicate"]

    @property
    def dp_shard_rank(self) -> int:
        return self.coordinates()["dp_shard"]

    @property
    def dp_rank(self) -> int:
        """This process's index among the data-parallel ranks (which share of the data it gets)."""
        where = self.coordinates()
        return where["dp_replicate"] * self.dp_shard + where["dp_shard"]

    @property
    def cp_rank(self) -> int:
        return self.coordinates()["cp"]

    @property
    def sp_rank(self) -> int:
        return self.coordinates()["sp"]

    @property
    def tp_rank(self) -> int:
        return self.coordinates()["tp"]

    @property
    def pp_rank(self) -> int:
        return self.coordinates().get("pp", 0)

    # ------------------------------------------------------------------------------------------ mesh and groups
    def build_mesh(self, device_type: Optional[str] = None) -> Optional["DeviceMesh"]:
        """The DeviceMesh, built on the first call (a collective: every rank calls it) and returned after.

        ``device_type``: "cpu" (gloo) or "cuda" (nccl); default: the process group's. None with DeepSpeed sequence
        parallelism, whose groups DeepSpeed builds. A later call for another device type is an error.
        """
        if self.sp > 1:
            return None
        if self._mesh is not None:
            if device_type is not None and self._mesh.device_type != device_type:
                raise ValueError(f"The device mesh was built for {self._mesh.device_type!r}, not {device_type!r}.")
            return self._mesh
        from torch.distributed.device_mesh import init_device_mesh

        device_type = device_type or _default_device_type()
        self._check_process_count()
        mesh = init_device_mesh(device_type, self.mesh_shape, mesh_dim_names=self.mesh_dim_names)
        # torch asks callers to keep the flattened meshes themselves (slicing them from the root is deprecated)
        self._flattened = {name: mesh[list(dims)]._flatten(name) for name, dims in self.flattened_dim_names.items()}
        self._mesh = mesh
        return mesh

    @property
    def built_mesh(self) -> Optional["DeviceMesh"]:
        """The DeviceMesh if it was built (or adopted), else None; builds nothing."""
        return self._mesh

    def adopt_mesh(self, mesh: "DeviceMesh", given_as: str = "The device mesh") -> None:
        """Use ``mesh``, built elsewhere, as this layout's: its dimension names and sizes must be this layout's
        (``given_as`` names it in the error)."""
        names, shape = tuple(mesh.mesh_dim_names or ()), tuple(mesh.shape)
        if names != self.mesh_dim_names or shape != tuple(self.mesh_shape):
            raise ValueError(f"{given_as} has dimensions {names} of sizes {shape}; this run's layout is "
                             f"{self.mesh_dim_names} of sizes {tuple(self.mesh_shape)}: build it with "
                             f"init_device_mesh(device_type, {tuple(self.mesh_shape)}, "
                             f"mesh_dim_names={self.mesh_dim_names}), or leave it out.")
        self._flattened = {name: mesh[list(dims)]._flatten(name) for name, dims in self.flattened_dim_names.items()}
        self._mesh = mesh

    @property
    def mesh(self) -> Optional["DeviceMesh"]:
        """The DeviceMesh (built on first use, for the process group's device type; see ``build_mesh``)."""
        return self.build_mesh()

    # FSDP's mesh, the one rule (fsdp_mesh for this layout, fsdp_mesh_of for a mesh built elsewhere): HSDP, when the
    # processes also replicate, shards over (dp_replicate, dp_shard[_cp]) and replicates across the first; otherwise
    # the dp_shard[_cp] dimension alone. "_cp" when context parallelism splits the sequence over the same ranks.
    def fsdp_mesh(self, device_type: Optional[str] = None) -> "DeviceMesh":
        """The mesh FSDP shards this layout's model over (built on first use, for ``device_type``)."""
        self.build_mesh(device_type)
        shard = "dp_shard_cp" if self.cp > 1 else "dp_shard"
        if self.dp_replicate > 1:
            return self.mesh["dp_replicate", shard]
        return self.submesh(shard)

    @staticmethod
    def fsdp_mesh_of(mesh: Optional["DeviceMesh"]) -> Optional["DeviceMesh"]:
        """The same rule for a mesh built elsewhere (an Accelerate-style mesh with flattened ``dp_shard_cp``), read
        from its dimension names: the whole mesh when it names none of them; None (every process) for None."""
        if mesh is None:
            return None
        names = tuple(getattr(mesh, "mesh_dim_names", None) or ())
        for shard in ("dp_shard_cp", "dp_shard"):
            if shard in names:
                return mesh["dp_replicate", shard] if "dp_replicate" in names else mesh[shard]
        return mesh

    def submesh(self, name: str) -> "DeviceMesh":
        """The 1-D mesh of one dimension, named or flattened (``"tp"``, ``"dp"``, ``"dp_shard_cp"`` ...); builds the
        mesh on first use."""
        mesh = self.mesh
        if mesh is None:
            raise ValueError("DeepSpeed sequence parallelism builds no torch DeviceMesh; there is no submesh.")
        if name in self._flattened:
            return self._flattened[name]
        if self.world_size == 1 and mesh.ndim == 1 and name in _DIM_AND_FLAT_NAMES:
            return mesh  # one process: every dimension is that process (FSDP debugged on one device)
        if name not in self.mesh_dim_names and name not in self.flattened_dim_names:
            known = list(self.mesh_dim_names) + list(self._flattened)
            raise KeyError(f"The mesh has no dimension {name!r}; it has {known} (dimensions of size 1 are left out).")
        return mesh[name]

    @property
    def mesh_built(self) -> bool:
        return self._mesh is not None

    @property
    def dp_group(self) -> Optional["ProcessGroup"]:
        """The process group over which data is split, gathered and reduced.

        None when data parallelism spans every process: that is the default (world) group, and no mesh is built
        for it. Otherwise the mesh's flattened ``dp`` group (the first use builds the mesh: a collective), or,
        with a data-parallel degree of 1, a group of this process alone.
        """
        if self.dp_size == self.world_size:
            return None
        if self.sp > 1:
            raise NotImplementedError(
                "With DeepSpeed sequence parallelism the data-parallel group is DeepSpeed's (its groups module), "
                "not a torch mesh group; hasten does not build one.")
        if self.dp_size == 1:
            if self._solo_group is None:
                import torch.distributed as dist

                self._solo_group = dist.new_group([self.global_rank], use_local_synchronization=True)
            return self._solo_group
        return self.submesh("dp").get_group()

    # ------------------------------------------------------------------------------------------ helpers
    def _check_process_count(self) -> None:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            world = dist.get_world_size()
        elif "WORLD_SIZE" in os.environ:
            world = int(os.environ["WORLD_SIZE"])
        else:  # no process group and no launcher: torch's init_device_mesh decides (it starts the group itself)
            return
        if world != self.world_size:
            raise ValueError(f"{_product_text(self.sizes)}, but {_world_text(world)}: the layout does not match the "
                             f"number of processes. Launch {self.world_size} processes, or change the sizes.")
