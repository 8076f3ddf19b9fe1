"""Who am I, which device, which process group: the process state shared by everything in a run.

``PartialState`` reads the launch environment (torchrun's ``RANK``/``WORLD_SIZE``/``LOCAL_RANK`` variables,
set by ``hasten launch``, or those of the engine that started the process: ``core/cluster.py``), initialises
``torch.distributed`` once (gloo on CPU, nccl on CUDA) and answers questions about the current process. Like
Accelerate's, every instance shares one state, so it can be created anywhere. ``AcceleratorState`` adds the
training settings; ``GradientState`` tracks gradient accumulation and the end of data loaders.
"""
from __future__ import annotations

import atexit
import contextlib
import datetime
import functools
import os
import threading
import warnings
from typing import TYPE_CHECKING, Any, Callable, Iterator, Optional, Protocol, Union

import torch
import torch.distributed as dist

from .config.accelerator_settings import launcher_switches, resolve_mixed_precision
from .config.enums import DistributedType, PrecisionType
from .core.cluster import Placement, adopt_placement, check_rendezvous
from .core.env_aliases import get_flag_setting, get_setting
from .core.env_vars import get_int_from_env, parse_flag_from_env
from .core.environment import is_debug_mode
from .core.imports import is_torch_xla_available
from .core.lazy import lazy_exports

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh
    from torch.utils.data import DataLoader

    from .config.accumulation import GradientAccumulationPlugin
    from .config.deepspeed import DeepSpeedPlugin
    from .config.dynamo import TorchDynamoPlugin
    from .config.fsdp import FullyShardedDataParallelPlugin
    from .config.megatron import MegatronLMPlugin

__all__ = ["PartialState", "AcceleratorState", "GradientState", "DistributedType", "is_initialized", "SharedDict",
           "ThreadLocalSharedDict", "do_nothing"]


def is_initialized() -> bool:
    """Whether an ``AcceleratorState`` has been created in this process."""
    return AcceleratorState._shared_state != {}


def do_nothing(*args: Any, **kwargs: Any) -> None:
    """Take anything, do nothing, return None (a stand-in callback)."""
    return None


class ThreadLocalSharedDict(threading.local):
    """A class attribute holding one dict per thread, shared by every instance in that thread.

    As a descriptor, ``State._shared_state`` and ``State()._shared_state`` both give the dict of the current
    thread. torch_xla's multithreaded PJRT mode (TPU v2/v3) runs one process's devices in threads, each of
    which needs its own state. Clear the dict in place; assigning to the class attribute replaces the
    descriptor.
    """

    def __init__(self, thread_local: bool = False):
        self._storage = {}

    def __get__(self, obj, objtype=None):
        return self._storage

    def __set__(self, obj, value):
        self._storage = value


# One state per process, or per thread under torch_xla (see ThreadLocalSharedDict).
SharedDict = ThreadLocalSharedDict if is_torch_xla_available() else dict

# Objects of rooms above this one (strategies, parallel) that the state holds: described here, not imported, as no
# import runs up a floor.
class _Run(Protocol):
    """What the state asks of the registered run (the Accelerator's ``Strategy``)."""

    def state_views(self) -> dict: ...

    def selected_deepspeed_plugin(self) -> Optional[str]: ...

    def select_deepspeed_plugin(self, name: Optional[str]) -> None: ...


class _TensorParallelPlugin(Protocol):
    """A ``TorchTensorParallelPlugin`` (its tensor-parallel size)."""

    tp_size: int


class _MeshConfig(Protocol):
    """A ``ParallelismConfig``: the owner of the run's ``DeviceMesh``."""

    @property
    def device_mesh(self) -> Optional[DeviceMesh]: ...


# Names scripts written for Accelerate also import from this module; they resolve lazily to hasten's own.
__getattr__, _ = lazy_exports(__name__, {"DynamoBackend": "hasten.config.enums",
                                         "GradientAccumulationPlugin": "hasten.config.accumulation",
                                         "SageMakerDistributedType": "hasten.config.enum_compat"})


def _attach_shared_state(self, pickled: dict) -> None:
    """Unpickling a state object joins this process's shared state (filling it from the pickle when there is
    none yet), so an unpickled Accelerator sees the live state, not a detached copy."""
    self.__dict__ = self._shared_state
    if not self._shared_state:
        self._shared_state.update(pickled)


def _reset_error(owner: str, name: str) -> AttributeError:
    """The error for an object whose shared state was cleared by ``_reset_state()`` after it was made."""
    # The first two phrases are the reference's wording, which scripts' own tests match on.
    return AttributeError(
        f"`{owner}` object has no attribute `{name}`. This happens if `{owner}._reset_state()` was called after "
        "this object, or the Accelerator holding it, was created. After resetting, create a new Accelerator() (or "
        f"create `{owner}()`) and use it instead of the old one."
    )


def accelerator_type() -> Optional[str]:
    """The accelerator this machine has (``"cuda"``, ``"xpu"``, ``"mps"``), or None on a CPU-only machine."""
    if torch.cuda.is_available():
        return "cuda"
    if hasattr(torch, "xpu") and torch.xpu.is_available():
        return "xpu"
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        return "mps"
    return None


_MULTI_TYPE = {"cuda": DistributedType.MULTI_GPU, "xpu": DistributedType.MULTI_XPU, "cpu": DistributedType.MULTI_CPU}
_BACKEND = {"cuda": "nccl", "xpu": "xccl", "cpu": "gloo"}


def _destroy_process_group_at_exit() -> None:
    if dist.is_available() and dist.is_initialized():
        try:
            dist.destroy_process_group()
        except Exception:  # exiting anyway: a peer that already left must not turn a clean exit into a crash
            pass


def _device_from_env() -> Optional[torch.device]:
    """The device named by ``HASTEN_TORCH_DEVICE`` / ``ACCELERATE_TORCH_DEVICE`` (``"cpu"``, ``"cuda:1"``), if set."""
    value = get_setting("torch_device")
    if value is None:
        return None
    try:
        device = torch.device(value)
    except (RuntimeError, ValueError) as error:
        raise ValueError(
            f"HASTEN_TORCH_DEVICE / ACCELERATE_TORCH_DEVICE={value!r} is not a torch device ({error}). Use a name "
            "such as 'cpu', 'cuda' or 'cuda:1', or unset the variable to let hasten choose."
        ) from None
    if device.type not in ("cpu", "mps") and not getattr(torch, device.type).is_available():
        raise ValueError(
            f"HASTEN_TORCH_DEVICE / ACCELERATE_TORCH_DEVICE={value!r} names a {device.type} device, but this machine "
            f"has none. Unset the variable, or set it to 'cpu'."
        )
    return device


def launched_backend_type(launched: bool, process_kind: DistributedType,
                          deepspeed_chosen: bool = False) -> DistributedType:
    """The type a launched process's PartialState reports: ``DEEPSPEED`` when it was started for DeepSpeed
    (``hasten launch --use_deepspeed``, a config file's ``distributed_type: DEEPSPEED`` given to the launcher or
    without it, or transformers' ``TrainingArguments(deepspeed=...)``, which sets ``ACCELERATE_USE_DEEPSPEED=true``
    before it makes its state) or when it is made for an Accelerator given a DeepSpeed plugin (``deepspeed_chosen``),
    as the reference's PartialState says; else ``process_kind`` (NO, MULTI_CPU, MULTI_GPU, ...). ``launched``: more
    than one process, or ``LOCAL_RANK`` set. The other backends show only in the AcceleratorState, once the
    Accelerator builds them, as in the reference. For DeepSpeed, DeepSpeed's own communication layer is joined to
    the process group here, as the reference's state does: transformers builds ``deepspeed.zero.Init`` from the
    config before any Accelerator, and that config counts the processes through it (a world of one otherwise, so
    its batch sizes do not multiply out)."""
    if launched and (deepspeed_chosen or "use_deepspeed" in launcher_switches()):
        if dist.is_available() and dist.is_initialized():
            from .core.imports import require_deepspeed

            require_deepspeed().init_distributed(dist_backend=dist.get_backend(), auto_mpi_discovery=False,
                                                 verbose=False)
        return DistributedType.DEEPSPEED
    return process_kind


class PartialState:
    """The process state without training settings: ranks, device, process group.

    Parameters:
        cpu: force the CPU even when an accelerator is present (also ``HASTEN_USE_CPU=1``).
        _for_deepspeed: made by an ``AcceleratorState`` that holds a DeepSpeed plugin (``launched_backend_type``).
        **kwargs: passed to ``torch.distributed.init_process_group`` (``backend``, ``timeout``, ``init_method``).
    """

    _shared_state = SharedDict()
    __setstate__ = _attach_shared_state
    _known_attrs = [
        "_cpu", "backend", "device", "distributed_type", "num_processes", "process_index",
        "local_process_index", "fork_launched", "debug",
    ]

    def __init__(self, cpu: bool = False, _for_deepspeed: bool = False, **kwargs: Any):
        self.__dict__ = self._shared_state
        if self.initialized:
            if cpu and self.device.type != "cpu":
                raise ValueError(
                    "PartialState was already created on "
                    f"{self.device}; PartialState(cpu=True) cannot move it. Create the first state (or the "
                    "Accelerator) with cpu=True, or launch with `hasten launch --cpu`."
                )
            return
        use_cpu = bool(cpu) or get_flag_setting("use_cpu")
        chosen = None if use_cpu else _device_from_env()  # checked before any state is set
        self._cpu = use_cpu
        self.debug = is_debug_mode()
        self.fork_launched = parse_flag_from_env("FORK_LAUNCHED", False)
        already = dist.is_available() and dist.is_initialized()
        place = None if already else adopt_placement()  # torch's variables from the engine's (core/cluster.py)
        device_type = "cpu" if self._cpu else (chosen.type if chosen is not None else accelerator_type() or "cpu")
        world_size = place.world_size if place is not None else 1
        if already:
            world_size = dist.get_world_size()
        self.num_processes = world_size
        self.process_index = dist.get_rank() if already else (place.rank if place is not None else 0)
        self.local_process_index = get_int_from_env(["LOCAL_RANK"], 0 if not already else self.process_index)
        self.backend = None
        self.distributed_type = DistributedType.NO
        if world_size > 1:
            if device_type not in _MULTI_TYPE:
                device_type = "cpu"  # e.g. MPS has no multi-process backend
            if not already:
                self._init_process_group(device_type, kwargs, place)
            self.backend = dist.get_backend()
            self.distributed_type = _MULTI_TYPE[device_type]
        self.distributed_type = launched_backend_type(world_size > 1 or "LOCAL_RANK" in os.environ,
                                                      self.distributed_type, _for_deepspeed)
        if device_type == "cpu" and chosen is not None and chosen.type == "cpu" and chosen.index is not None:
            warnings.warn(
                f"HASTEN_TORCH_DEVICE / ACCELERATE_TORCH_DEVICE={str(chosen)!r}: torch keeps every CPU tensor on "
                "'cpu' whatever the index, so the state's device is the name as given but tensors report 'cpu'.",
                stacklevel=2,
            )
            self.device = chosen
        elif device_type == "cpu":
            self.device = torch.device("cpu")
        elif chosen is not None and chosen.index is not None:
            self.device = chosen
            getattr(torch, device_type).set_device(self.device)
        elif device_type == "mps":
            self.device = torch.device("mps")
        else:
            self.device = torch.device(device_type, self.local_process_index)
            getattr(torch, device_type).set_device(self.device)
            if get_flag_setting("cpu_affinity"):  # hasten launch --enable_cpu_affinity
                from .core.numa import set_numa_affinity

                set_numa_affinity(self.local_process_index)

    def _init_process_group(self, device_type: str, kwargs: dict, place: Placement) -> None:
        if kwargs.get("init_method") is None:
            check_rendezvous(place)
        options = dict(kwargs)
        options.setdefault("backend", _BACKEND[device_type])
        timeout = options.pop("timeout", None)
        if timeout is not None:
            options["timeout"] = timeout if isinstance(timeout, datetime.timedelta) else datetime.timedelta(seconds=timeout)
        if options["backend"] == "nccl" and device_type == "cuda":
            options.setdefault("device_id", torch.device("cuda", self.local_process_index))
        dist.init_process_group(rank=self.process_index, world_size=self.num_processes, **options)
        # A gloo process group still alive at interpreter exit can abort the process ("terminate called
        # without an active exception"); tear down the one we created, after the script's own atexit hooks.
        atexit.register(_destroy_process_group_at_exit)

    def start_single_process_group(self) -> None:
        """A process group of this one process, for the backends that need one even alone (FSDP shards over a
        mesh of one, as torch allows), unless one exists. No rendezvous: an in-memory store."""
        if self.num_processes != 1 or dist.is_initialized():
            return
        dist.init_process_group(_BACKEND.get(self.device.type, "gloo"), store=dist.HashStore(), rank=0, world_size=1)
        atexit.register(_destroy_process_group_at_exit)
        self.backend = dist.get_backend()

    # ------------------------------------------------------------------ facts
    def __repr__(self) -> str:
        return self._describe(self.distributed_type)

    def _describe(self, distributed_type) -> str:
        """The processes, as ``repr`` shows them, under ``distributed_type`` (the backend's, for AcceleratorState)."""
        return (
            f"Distributed environment: {distributed_type}{('  Backend: ' + self.backend) if self.backend else ''}\n"
            f"Num processes: {self.num_processes}\nProcess index: {self.process_index}\n"
            f"Local process index: {self.local_process_index}\nDevice: {self.device}\n"
        )

    @staticmethod
    def _reset_state() -> None:
        """Forget the shared state (tests); the process group, if any, stays up."""
        PartialState._shared_state.clear()

    @property
    def initialized(self) -> bool:
        return self._shared_state != {}

    @property
    def use_distributed(self) -> bool:
        """Whether more than one process takes part."""
        return self.distributed_type != DistributedType.NO and self.num_processes > 1

    @property
    def is_main_process(self) -> bool:
        return self.process_index == 0

    @property
    def is_local_main_process(self) -> bool:
        return self.local_process_index == 0

    @property
    def is_last_process(self) -> bool:
        return self.process_index == self.num_processes - 1

    @property
    def default_device(self) -> torch.device:
        """The device this process would use with no ``cpu`` override."""
        kind = accelerator_type()
        if kind in (None, "mps"):
            return torch.device(kind or "cpu")
        return torch.device(kind, self.local_process_index)

    # ------------------------------------------------------------------ synchronisation
    def wait_for_everyone(self) -> None:
        """Barrier: every process waits here until all have arrived."""
        if self.use_distributed:
            if self.backend == "nccl":
                dist.barrier(device_ids=[self.local_process_index])
            else:
                dist.barrier()

    @contextlib.contextmanager
    def _goes_first(self, is_main: bool):
        if not is_main:
            self.wait_for_everyone()
        yield
        if is_main:
            self.wait_for_everyone()

    @contextlib.contextmanager
    def main_process_first(self) -> Iterator[None]:
        """The main process runs the block first (e.g. to download or preprocess); the others then follow."""
        with self._goes_first(self.is_main_process):
            yield

    @contextlib.contextmanager
    def local_main_process_first(self) -> Iterator[None]:
        """Like ``main_process_first``, once per machine."""
        with self._goes_first(self.is_local_main_process):
            yield

    @contextlib.contextmanager
    def split_between_processes(self, inputs: Union[list, tuple, dict, torch.Tensor],
                                apply_padding: bool = False) -> Iterator[Union[list, tuple, dict, torch.Tensor]]:
        """Yield this process's contiguous share of ``inputs`` (list, tuple, dict of sequences, tensor).

        Shares differ by at most one element, the first processes taking the extra ones. With
        ``apply_padding`` every share is padded with the last element to the same length, so results can be
        gathered; drop the padding afterwards.
        """
        yield split_for_process(inputs, self.num_processes, self.process_index, apply_padding)

    # ------------------------------------------------------------------ decorators and printing
    def on_main_process(self, function: Optional[Callable[..., Any]] = None) -> Callable[..., Any]:
        """Decorator: run ``function`` on the main process only (others get None)."""
        return self._only_if(lambda: self.is_main_process, function)

    def on_local_main_process(self, function: Optional[Callable[..., Any]] = None) -> Callable[..., Any]:
        """Decorator: run ``function`` on the main process of each machine only."""
        return self._only_if(lambda: self.is_local_main_process, function)

    def on_last_process(self, function: Optional[Callable[..., Any]] = None) -> Callable[..., Any]:
        """Decorator: run ``function`` on the last process only."""
        return self._only_if(lambda: self.is_last_process, function)

    def on_process(self, function: Optional[Callable[..., Any]] = None,
                   process_index: Optional[int] = None) -> Callable[..., Any]:
        """Decorator: run ``function`` on the process with global index ``process_index`` only."""
        if function is None:
            return functools.partial(self.on_process, process_index=process_index)
        self._check_index(process_index, "process_index")
        return self._only_if(lambda: self.process_index == process_index, function)

    def on_local_process(self, function: Optional[Callable[..., Any]] = None,
                         local_process_index: Optional[int] = None) -> Callable[..., Any]:
        """Decorator: run ``function`` on the process with local index ``local_process_index`` only."""
        if function is None:
            return functools.partial(self.on_local_process, local_process_index=local_process_index)
        self._check_index(local_process_index, "local_process_index")
        return self._only_if(lambda: self.local_process_index == local_process_index, function)

    @staticmethod
    def _check_index(index, name: str) -> None:
        if not isinstance(index, int) or isinstance(index, bool) or index < 0:
            raise ValueError(f"{name} must be a non-negative int, got {index!r}.")

    @staticmethod
    def _only_if(condition: Callable[[], bool], function: Optional[Callable]):
        if function is None:  # used as @state.on_main_process()
            return lambda fn: PartialState._only_if(condition, fn)

        @functools.wraps(function)
        def wrapper(*args, **kwargs):
            if condition():
                return function(*args, **kwargs)
            return None

        return wrapper

    def print(self, *args: Any, **kwargs: Any) -> None:
        """``print`` once per machine (on the local main process)."""
        if self.is_local_main_process:
            print(*args, **kwargs)

    def destroy_process_group(self, group: Optional[dist.ProcessGroup] = None) -> None:
        """Tear down the process group (at the end of a run); safe to call when none exists."""
        if self.use_distributed and dist.is_initialized():
            dist.destroy_process_group(group)

    def set_device(self) -> None:
        """Make ``self.device`` the current device of its kind (no-op on CPU)."""
        if self.device.type not in ("cpu", "mps"):
            getattr(torch, self.device.type).set_device(self.device)

    def __getattr__(self, name: str):
        if not self.__dict__ and not name.startswith("__"):
            raise _reset_error("PartialState", name)  # an instance exists, so its state was there and is gone
        raise AttributeError(f"'PartialState' object has no attribute {name!r}")


def wait_for_everyone() -> None:
    """Block until every process reaches this point (``PartialState().wait_for_everyone()``)."""
    PartialState().wait_for_everyone()


def split_for_process(inputs: Union[list, tuple, dict, torch.Tensor], num_processes: int, process_index: int,
                      apply_padding: bool = False) -> Union[list, tuple, dict, torch.Tensor]:
    """The contiguous share of ``inputs`` that belongs to ``process_index`` (see ``split_between_processes``)."""
    if num_processes == 1:
        return inputs
    if isinstance(inputs, dict):
        lengths = {key: len(value) for key, value in inputs.items()}
        if len(set(lengths.values())) > 1:
            raise ValueError(
                f"split_between_processes needs every value of the dict to have the same length; got {lengths}."
            )
        return type(inputs)(
            (key, split_for_process(value, num_processes, process_index, apply_padding)) for key, value in inputs.items()
        )
    if not hasattr(inputs, "__len__") or not hasattr(inputs, "__getitem__"):
        raise TypeError(
            f"split_between_processes takes a list, tuple, dict or tensor, got {type(inputs).__name__}."
        )
    length = len(inputs)
    per_process, extras = divmod(length, num_processes)
    start = process_index * per_process + min(process_index, extras)
    end = start + per_process + (1 if process_index < extras else 0)
    missing = per_process + (1 if extras else 0) - (end - start) if apply_padding and length else 0
    if _is_datasets_dataset(inputs):  # slicing a datasets.Dataset gives a dict of columns; select keeps a Dataset
        return inputs.select(list(range(start, end)) + [length - 1] * missing)
    share = inputs[start:end]
    if missing == 0:
        return share
    if isinstance(inputs, torch.Tensor):
        return torch.cat([share, inputs[-1:].expand(missing, *inputs.shape[1:])], dim=0)
    filler = [inputs[-1]] * missing
    return share + type(share)(filler) if isinstance(share, tuple) else share + filler


def _is_datasets_dataset(inputs) -> bool:
    """Whether ``inputs`` is a Hugging Face ``datasets.Dataset`` (rows chosen with ``select``), without importing it."""
    return type(inputs).__module__.startswith("datasets.") and callable(getattr(inputs, "select", None))


class AcceleratorState:
    """``PartialState`` plus the training settings (mixed precision, plugins). One per run, shared.

    The Accelerator creates it with its settings already resolved (``_from_accelerator=True``); created on its own,
    ``mixed_precision`` follows the one precedence rule (argument > ``HASTEN_MIXED_PRECISION`` > ``"no"``,
    ``config.accelerator_settings.resolve_mixed_precision``). Process facts (device, ranks, ``num_processes`` ...) are
    answered by the ``PartialState`` it holds.
    """

    _shared_state = SharedDict()
    __setstate__ = _attach_shared_state
    _known_attrs = PartialState._known_attrs + ["mixed_precision", "dynamo_plugin", "deepspeed_plugins", "fsdp_plugin",
                                                "megatron_lm_plugin"]

    def __init__(self, mixed_precision: Optional[str] = None, cpu: bool = False,
                 dynamo_plugin: Optional[TorchDynamoPlugin] = None,
                 deepspeed_plugin: Optional[Union[DeepSpeedPlugin, dict[str, DeepSpeedPlugin]]] = None,
                 fsdp_plugin: Optional[FullyShardedDataParallelPlugin] = None,
                 torch_tp_plugin: Optional[_TensorParallelPlugin] = None,
                 megatron_lm_plugin: Optional[MegatronLMPlugin] = None,
                 parallelism_config: Optional[_MeshConfig] = None,
                 _from_accelerator: bool = False, **kwargs: Any):
        self.__dict__ = self._shared_state
        if not self.initialized:
            self._shared_state.clear()  # what a PartialState reset left behind
        if self.initialized:
            if mixed_precision is not None and PrecisionType.parse(mixed_precision, "mixed_precision") != self.mixed_precision:
                raise ValueError(
                    f"AcceleratorState already exists with mixed_precision={self.mixed_precision!r}; it cannot be "
                    f"changed to {mixed_precision!r}. Call AcceleratorState._reset_state() first (tests only)."
                )
            return
        self._partial = PartialState(cpu, _for_deepspeed=deepspeed_plugin is not None, **kwargs)
        # the Accelerator gives the value its settings resolved; created on its own, the state resolves one
        self._mixed_precision = mixed_precision if _from_accelerator else resolve_mixed_precision(mixed_precision)
        self.dynamo_plugin = dynamo_plugin
        self.deepspeed_plugins = deepspeed_plugin
        self.fsdp_plugin = fsdp_plugin
        self.torch_tp_plugin = torch_tp_plugin
        self.megatron_lm_plugin = megatron_lm_plugin
        self.parallelism_config = parallelism_config

    @property
    def initialized(self) -> bool:
        """Whether the state exists, with its PartialState: one reset under it (``PartialState._reset_state()``
        alone) makes the next AcceleratorState start afresh, as in the reference."""
        return self._exists()

    @classmethod
    def _exists(cls) -> bool:
        """``initialized``, asked of the class: without creating a state."""
        partial = cls._shared_state.get("_partial")
        return partial is not None and bool(partial.__dict__)

    @staticmethod
    def _reset_state(reset_partial_state: bool = False) -> None:
        """Forget the shared state (tests). Objects created before keep pointing at it: using them raises an
        AttributeError that says so; create a new Accelerator instead."""
        AcceleratorState._shared_state.clear()
        if reset_partial_state:
            PartialState._reset_state()

    # ------------------------------------------------------------------ the registered run
    def register_run(self, strategy: _Run) -> None:
        """Make ``strategy`` the run this state shows: the one write of the training facts into the process-wide
        state, by the Accelerator once the strategy is set up. ``mixed_precision``, ``distributed_type``,
        ``fsdp_plugin`` and ``megatron_lm_plugin`` are then views of what it shows (``Strategy.state_views``), and
        ``select_deepspeed_plugin`` asks it."""
        self.__dict__["_run"] = strategy

    @classmethod
    def current(cls) -> Optional["AcceleratorState"]:
        """The process's state when an Accelerator (or a script) created one, else None; creates nothing.

        For the free functions Accelerate defines as following the state, with no argument to be given it
        (``get_mixed_precision_context_manager``, ``GatheredParameters``, ``deepspeed_required``); hasten's own
        rooms are given what they need instead."""
        return cls() if cls._exists() else None

    @classmethod
    def joined_run(cls) -> dict:
        """What a second Accelerator created in this process joins, as the reference's reads its state: the
        precision (None without a state), the plugins (None each without one) and the name of the selected
        DeepSpeed plugin (None unless several are named)."""
        shared = cls._shared_state if cls._exists() else {}  # none, or reset: a new run
        run = shared.get("_run")
        views = run.state_views() if run is not None else {}
        plugins = {name: views.get(name, shared.get(f"_given_{name}"))
                   for name in ("fsdp_plugin", "megatron_lm_plugin")}
        return {"mixed_precision": views.get("mixed_precision", shared.get("_mixed_precision")),
                "deepspeed_plugins": shared.get("deepspeed_plugins"), "torch_tp_plugin": shared.get("torch_tp_plugin"),
                "selected_deepspeed_plugin": run.selected_deepspeed_plugin() if run is not None else None, **plugins}

    def _stored(self, key: str):
        """``key`` of the shared state; AttributeError when a reset emptied it (``__getattr__`` then says so)."""
        try:
            return self.__dict__[key]
        except KeyError:
            raise AttributeError(key) from None

    def _shown(self, name: str):
        """What the registered run shows as ``name``; None when it shows nothing there (or no run is registered)."""
        run = self.__dict__.get("_run")
        return run.state_views().get(name) if run is not None else None

    @property
    def distributed_type(self) -> DistributedType:
        """What trains: the registered run's backend (``FSDP``, ``DEEPSPEED``, ``MEGATRON_LM``), else the processes'
        kind (``NO``, ``MULTI_CPU``, ``MULTI_GPU`` ..., PartialState's). A value a script assigns here is kept, as
        Accelerate lets scripts set it."""
        written = self.__dict__.get("_written_distributed_type")
        if written is not None:
            return written
        shown = self._shown("distributed_type")
        return shown if shown is not None else self._stored("_partial").distributed_type

    @distributed_type.setter
    def distributed_type(self, value: DistributedType) -> None:
        self.__dict__["_written_distributed_type"] = value

    def _plugin_view(name: str, doc: str) -> property:  # noqa: N805 - builds the class's properties below
        """A plugin the registered run shows as ``name``, else the one the Accelerator was given (settable)."""
        def get(self):
            shown = self._shown(name)
            return shown if shown is not None else self._stored(f"_given_{name}")

        def put(self, plugin) -> None:
            self.__dict__[f"_given_{name}"] = plugin

        return property(get, put, doc=doc)

    fsdp_plugin = _plugin_view("fsdp_plugin", "The FSDP plugin the run shards with, else the one given.")
    megatron_lm_plugin = _plugin_view("megatron_lm_plugin", "The ``MegatronLMPlugin`` the run trains with, else the "
                                                            "one given.")
    del _plugin_view

    # ------------------------------------------------------------------ settings
    @property
    def mixed_precision(self) -> str:
        """``"no"``, ``"fp16"``, ``"bf16"`` or ``"fp8"``: the registered run's precision, else the one this state was
        created with."""
        shown = self._shown("mixed_precision")
        return shown if shown is not None else self._stored("_mixed_precision")

    @property
    def device_mesh(self) -> Optional[DeviceMesh]:
        """The ``DeviceMesh`` of N-D parallelism, owned by the ``ParallelismConfig``'s layout (``ParallelDims``);
        None without a ParallelismConfig or before the mesh is built."""
        config = self.parallelism_config
        return config.device_mesh if config is not None else None

    @property
    def is_fsdp2(self) -> bool:
        """Whether the model is sharded with FSDP2 (``fully_shard``)."""
        # a read-only view Accelerate's users ask for, of the registered run's distributed_type and fsdp_plugin
        return self.distributed_type == DistributedType.FSDP and getattr(self.fsdp_plugin, "fsdp_version", 1) == 2

    @property
    def deepspeed_plugin(self) -> Optional[DeepSpeedPlugin]:
        """The active ``DeepSpeedPlugin``; None when DeepSpeed is not in use."""
        # a read-only view Accelerate's users ask for: the plugins count only when the DeepSpeed strategy trains
        if self.distributed_type != DistributedType.DEEPSPEED or self.deepspeed_plugins is None:
            return None
        plugins = self.deepspeed_plugins
        if not isinstance(plugins, dict):
            return plugins
        return next((plugin for plugin in plugins.values() if plugin.selected), None)

    def get_deepspeed_plugin(self, name: str) -> DeepSpeedPlugin:
        """The ``DeepSpeedPlugin`` registered under ``name`` (several plugins: ``Accelerator(deepspeed_plugins={...})``)."""
        plugins = self.deepspeed_plugins
        if not isinstance(plugins, dict) or name not in plugins:
            known = sorted(plugins) if isinstance(plugins, dict) else []
            raise ValueError(f"No DeepSpeedPlugin is registered under {name!r}; the registered names are {known} "
                             "(Accelerator(deepspeed_plugins={name: DeepSpeedPlugin(...)})).")
        return plugins[name]

    def select_deepspeed_plugin(self, name: Optional[str] = None) -> None:
        """Make the ``DeepSpeedPlugin`` registered under ``name`` the active one: the next ``prepare`` builds its
        engine with it."""
        plugins = self.deepspeed_plugins
        if not isinstance(plugins, dict):
            raise ValueError("select_deepspeed_plugin needs several named plugins: Accelerator(deepspeed_plugins="
                             "{'student': DeepSpeedPlugin(...), 'teacher': DeepSpeedPlugin(...)}).")
        self.get_deepspeed_plugin(name)  # an unknown name lists the known ones
        run = self.__dict__.get("_run")
        if run is not None:
            run.select_deepspeed_plugin(name)  # the strategy builds the next engine with it, and flags it
            return
        from .config.deepspeed import mark_selected

        mark_selected(plugins, name)  # plugins of a state no Accelerator runs: only their flags say which

    # ------------------------------------------------------------------ the process (PartialState's answers)
    @property
    def fork_launched(self) -> bool:
        return self._partial.fork_launched

    @property
    def use_distributed(self) -> bool:
        """Whether more than one process takes part."""
        return self._partial.use_distributed

    @property
    def is_main_process(self) -> bool:
        return self._partial.is_main_process

    @property
    def is_local_main_process(self) -> bool:
        return self._partial.is_local_main_process

    @property
    def is_last_process(self) -> bool:
        return self._partial.is_last_process

    def wait_for_everyone(self) -> None:
        """Barrier: every process waits here until all have arrived."""
        self._partial.wait_for_everyone()

    @contextlib.contextmanager
    def split_between_processes(self, inputs: Union[list, tuple, dict, torch.Tensor],
                                apply_padding: bool = False) -> Iterator[Union[list, tuple, dict, torch.Tensor]]:
        """Yield this process's share of ``inputs`` (see ``PartialState.split_between_processes``)."""
        with self._partial.split_between_processes(inputs, apply_padding=apply_padding) as share:
            yield share

    @contextlib.contextmanager
    def main_process_first(self) -> Iterator[None]:
        """The main process runs the block first; the others then follow."""
        with self._partial.main_process_first():
            yield

    @contextlib.contextmanager
    def local_main_process_first(self) -> Iterator[None]:
        """Like ``main_process_first``, once per machine."""
        with self._partial.local_main_process_first():
            yield

    def print(self, *args: Any, **kwargs: Any) -> None:
        """``print`` once per machine (on the local main process)."""
        self._partial.print(*args, **kwargs)

    def destroy_process_group(self, group: Optional[dist.ProcessGroup] = None) -> None:
        """Tear down the process group (at the end of a run); safe to call when none exists, and on a state
        object kept across ``_reset_state()`` (the process group outlives the reset)."""
        PartialState().destroy_process_group(group)

    def __dir__(self) -> list:
        # the process facts answered from the PartialState are attributes too (scripts and libraries list them)
        partial = self.__dict__.get("_partial")
        return sorted(set(super().__dir__()) | set(dir(partial) if partial is not None and partial.__dict__ else ()))

    def __getattr__(self, name: str):
        # Process facts (device, ranks, collectives) live in PartialState; answer them from there.
        if name.startswith("__"):
            raise AttributeError(name)
        partial = self.__dict__.get("_partial")
        if partial is None:  # an instance exists, so the state was there: it was reset
            raise _reset_error("AcceleratorState", name)
        if not partial.__dict__:  # the PartialState under it was reset
            raise _reset_error("PartialState", name)
        try:
            return getattr(partial, name)
        except AttributeError:  # a name neither has: said of this object
            raise AttributeError(f"'AcceleratorState' object has no attribute {name!r}") from None

    def __repr__(self) -> str:
        # what trains (FSDP, DEEPSPEED ...), as the reference prints it, with the DeepSpeed config it runs
        text = self._partial._describe(self.distributed_type) + f"\nMixed precision type: {self.mixed_precision}\n"
        plugin = self.deepspeed_plugin
        if plugin is not None:
            text += f"ds_config: {plugin.deepspeed_config}\n"
        return text


class GradientState:
    """Gradient-accumulation and data-loader progress, shared by the Accelerator, loaders and scheduler."""

    _shared_state = SharedDict()
    __setstate__ = _attach_shared_state

    def __init__(self, gradient_accumulation_plugin: Optional[GradientAccumulationPlugin] = None):
        self.__dict__ = self._shared_state
        if not self.initialized:
            self.sync_gradients = True
            self._dataloader_references = [None]
            self.plugin_kwargs = {}
            self._is_xla_gradients_synced = False
        if gradient_accumulation_plugin is not None:
            self.plugin_kwargs = gradient_accumulation_plugin.to_kwargs()
        self._initialized = True

    @property
    def initialized(self) -> bool:
        return self._shared_state.get("_initialized", False)

    @property
    def num_steps(self) -> int:
        return self.plugin_kwargs.get("num_steps", 1)

    @property
    def adjust_scheduler(self) -> bool:
        return self.plugin_kwargs.get("adjust_scheduler", False)

    @property
    def sync_with_dataloader(self) -> bool:
        return self.plugin_kwargs.get("sync_with_dataloader", True)

    @property
    def sync_each_batch(self) -> bool:
        return self.plugin_kwargs.get("sync_each_batch", False)

    @property
    def end_of_dataloader(self) -> bool:
        """Whether the active loader has yielded its last batch."""
        loader = self.active_dataloader  # compared with None: a loader's truth value would ask its len() every step
        return loader is not None and getattr(loader, "end_of_dataloader", False)

    @property
    def remainder(self) -> int:
        """Samples of the last global batch that are real (not even_batches duplicates); -1 when unknown."""
        loader = self.active_dataloader
        return getattr(loader, "remainder", -1) if loader is not None else -1

    @property
    def in_dataloader(self) -> bool:
        return self.active_dataloader is not None

    @property
    def active_dataloader(self) -> Optional[DataLoader]:
        """The prepared loader being iterated (the innermost one when loops are nested), or None."""
        return self.dataloader_references[-1]

    @property
    def dataloader_references(self) -> list:
        """The loaders being iterated, outermost first, after a leading None."""
        return self._dataloader_references

    @dataloader_references.setter
    def dataloader_references(self, references: list) -> None:
        self._dataloader_references = list(references)

    @property
    def is_xla_gradients_synced(self) -> bool:
        """Whether gradients were reduced before the optimizer step (torch_xla only; False elsewhere)."""
        return self._is_xla_gradients_synced

    @is_xla_gradients_synced.setter
    def is_xla_gradients_synced(self, is_synced: bool) -> None:
        self._is_xla_gradients_synced = is_synced

    def _set_sync_gradients(self, sync_gradients: bool) -> None:
        self.sync_gradients = sync_gradients

    def _add_dataloader(self, dataloader) -> None:
        self.dataloader_references.append(dataloader)

    def _remove_dataloader(self, dataloader) -> None:
        self.dataloader_references.remove(dataloader)

    @staticmethod
    def _reset_state() -> None:
        GradientState._shared_state.clear()

    def __getattr__(self, name: str):
        if not self.__dict__ and not name.startswith("__"):  # an instance exists, so the state was there: reset
            raise _reset_error("GradientState", name)
        raise AttributeError(f"'GradientState' object has no attribute {name!r}")

    def __repr__(self) -> str:
        return (
            f"Sync Gradients: {self.sync_gradients}\nAt end of current dataloader: {self.end_of_dataloader}\n"
            f"Extra samples added: {self.remainder}\nGradient accumulation plugin: {self.plugin_kwargs}\n"
        )
