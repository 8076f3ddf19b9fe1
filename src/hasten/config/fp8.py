"""FP8 training recipes (TransformerEngine, MS-AMP, torchao) as Accelerate's kwargs handlers.

The recipe objects are real and validate their options, so scripts that build them keep working.
``mixed_precision="fp8"`` trains through torchao (``precision/fp8.py``), with the ``AORecipeKwargs`` given (its
``config`` and ``module_filter_func``) or a default one; TransformerEngine and MS-AMP recipes are planned, and
``check_fp8_recipe`` refuses them by name rather than train another way. Unset fields come from the launcher's
environment (``HASTEN_FP8_<OPTION>``, or Accelerate's ``ACCELERATE_FP8_<OPTION>``), then the defaults below.
Nothing here imports transformer_engine, msamp or torchao.
"""
from __future__ import annotations

import enum
import importlib.util
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Literal, Optional, get_args

from .env_fields import as_bool, as_choice, as_int, from_env
from .fp8_launch import PLANNED_FP8_LIBRARIES, fp8_library_not_yet_supported
from .kwargs import KwargsHandler
from .launch_file import read_launch_setting

__all__ = [
    "Backend", "OptLevel", "FP8Format", "AmaxComputeAlgorithm", "FP8BackendType", "AORecipeKwargs",
    "TERecipeKwargs", "MSAMPRecipeKwargs", "FP8RecipeKwargs", "check_fp8_recipe",
]

Backend = Literal["MSAMP", "TE"]
OptLevel = Literal["O1", "O2"]
FP8Format = Literal["HYBRID", "E4M3", "E5M2"]
AmaxComputeAlgorithm = Literal["max", "most_recent"]


class FP8BackendType(str, enum.Enum):
    """The library that runs fp8 training."""

    NO = "NO"
    TE = "TE"
    MSAMP = "MSAMP"
    AO = "AO"


def _fp8(owner: str, field: str, value, default, parse):
    return from_env(owner, field, value, default, parse, setting=f"fp8_{field}")


@dataclass
class AORecipeKwargs(KwargsHandler):
    """FP8 training with torchao's ``Float8Linear``: ``Accelerator(mixed_precision="fp8", kwargs_handlers=[...])``.

    config: a ``torchao.float8.Float8LinearConfig``; when ``None`` the backend builds one from ``pad_inner_dim``
        and ``enable_fsdp_float8_all_gather`` (both default True; environment ``HASTEN_FP8_PAD_INNER_DIM``,
        ``HASTEN_FP8_ENABLE_FSDP_FLOAT8_ALL_GATHER``).
    module_filter_func: ``(module, fqn) -> bool``, which linear layers to convert (default: all but the first and
        last, see ``hasten.utils.ao.filter_first_and_last_linear_layers``).
    """

    config: Optional[Any] = None
    module_filter_func: Optional[Callable] = None
    pad_inner_dim: Optional[bool] = None
    enable_fsdp_float8_all_gather: Optional[bool] = None

    def __post_init__(self):
        owner = type(self).__name__
        if self.module_filter_func is not None and not callable(self.module_filter_func):
            raise ValueError(f"{owner}.module_filter_func must be a callable (module, fqn) -> bool, "
                             f"got {self.module_filter_func!r}.")
        if self.config is None:
            self.pad_inner_dim = _fp8(owner, "pad_inner_dim", self.pad_inner_dim, True,
                                      as_bool(f"{owner}.pad_inner_dim"))
            self.enable_fsdp_float8_all_gather = _fp8(
                owner, "enable_fsdp_float8_all_gather", self.enable_fsdp_float8_all_gather, True,
                as_bool(f"{owner}.enable_fsdp_float8_all_gather"))


@dataclass
class TERecipeKwargs(KwargsHandler):
    """FP8 training with NVIDIA TransformerEngine's ``DelayedScaling`` (or MXFP8 block scaling) recipe (planned).

    use_autocast_during_eval: keep fp8 autocast in eval mode (default False: metrics are usually better without).
    margin (0), interval (1): scaling-factor margin and recomputation interval.
    fp8_format: "HYBRID" (E4M3 forward, E5M2 backward; default), "E4M3" or "E5M2".
    amax_history_len (1024), amax_compute_algo ("most_recent" or "max"): how the scaling factor is computed.
    override_linear_precision: run (fprop, dgrad, wgrad) GEMMs in higher precision (default all False).
    use_mxfp8_block_scaling: MXFP8 block scaling instead of delayed scaling (default False).
    """

    use_autocast_during_eval: Optional[bool] = None
    margin: Optional[int] = None
    interval: Optional[int] = None
    fp8_format: FP8Format = None
    amax_history_len: Optional[int] = None
    amax_compute_algo: AmaxComputeAlgorithm = None
    override_linear_precision: tuple[bool, bool, bool] = None
    use_mxfp8_block_scaling: Optional[bool] = None

    def __post_init__(self):
        owner = type(self).__name__
        self.use_autocast_during_eval = _fp8(owner, "use_autocast_during_eval", self.use_autocast_during_eval,
                                             False, as_bool(f"{owner}.use_autocast_during_eval"))
        self.margin = _fp8(owner, "margin", self.margin, 0, as_int(f"{owner}.margin", minimum=0))
        self.interval = _fp8(owner, "interval", self.interval, 1, as_int(f"{owner}.interval", minimum=1))
        self.fp8_format = from_env(owner, "fp8_format", self.fp8_format, "HYBRID",
                                   as_choice(f"{owner}.fp8_format", get_args(FP8Format), str.upper),
                                   setting="fp8_format")
        self.amax_history_len = _fp8(owner, "amax_history_len", self.amax_history_len, 1024,
                                     as_int(f"{owner}.amax_history_len", minimum=1))
        self.amax_compute_algo = _fp8(owner, "amax_compute_algo", self.amax_compute_algo, "most_recent",
                                      as_choice(f"{owner}.amax_compute_algo", get_args(AmaxComputeAlgorithm)))
        if self.override_linear_precision is None:
            self.override_linear_precision = tuple(
                from_env(owner, "override_linear_precision", None, False,
                         as_bool(f"HASTEN_FP8_OVERRIDE_{gemm.upper()}"), setting=f"fp8_override_{gemm}")
                for gemm in ("fprop", "dgrad", "wgrad"))
        else:
            precision = tuple(self.override_linear_precision)
            if len(precision) != 3 or not all(isinstance(flag, bool) for flag in precision):
                raise ValueError(f"{owner}.override_linear_precision must be three booleans (fprop, dgrad, wgrad), "
                                 f"got {self.override_linear_precision!r}.")
            self.override_linear_precision = precision
        self.use_mxfp8_block_scaling = _fp8(owner, "use_mxfp8_block_scaling", self.use_mxfp8_block_scaling, False,
                                            as_bool(f"{owner}.use_mxfp8_block_scaling"))


@dataclass
class MSAMPRecipeKwargs(KwargsHandler):
    """FP8 training with Microsoft's MS-AMP (planned). opt_level: "O1" or "O2" (default)."""

    opt_level: OptLevel = None

    def __post_init__(self):
        owner = type(self).__name__
        self.opt_level = _fp8(owner, "opt_level", self.opt_level, "O2",
                              as_choice(f"{owner}.opt_level", get_args(OptLevel), str.upper))


@dataclass
class FP8RecipeKwargs(TERecipeKwargs, MSAMPRecipeKwargs):
    """Deprecated (as in Accelerate): use ``TERecipeKwargs`` or ``MSAMPRecipeKwargs``.

    backend: "TE" or "MSAMP" (default: MSAMP when ``msamp`` is installed, else TE).
    """

    backend: Backend = None

    def __post_init__(self):
        warnings.warn("FP8RecipeKwargs is deprecated: use TERecipeKwargs or MSAMPRecipeKwargs instead.",
                      FutureWarning, stacklevel=3)
        owner = type(self).__name__
        default = "MSAMP" if importlib.util.find_spec("msamp") is not None else "TE"
        self.backend = _fp8(owner, "backend", self.backend, default,
                            as_choice(f"{owner}.backend", get_args(Backend), str.upper))
        TERecipeKwargs.__post_init__(self)
        MSAMPRecipeKwargs.__post_init__(self)


_RECIPES = {AORecipeKwargs: "AO", TERecipeKwargs: "TE", MSAMPRecipeKwargs: "MSAMP"}


def check_fp8_recipe(mixed_precision: str, handlers: dict) -> None:
    """Refuse, before anything is built, an fp8 recipe the run cannot train with.

    ``handlers``: the Accelerator's kwargs handlers by type. A recipe without ``mixed_precision="fp8"`` is a
    ValueError (the reference's phrase), as is more than one recipe. A TransformerEngine or MS-AMP recipe (or
    ``HASTEN_FP8_BACKEND`` / ``ACCELERATE_FP8_BACKEND`` naming them) raises ``NotYetSupportedError``: hasten does not
    train fp8 another way than the one asked for.
    """
    recipes = [handler for kind, handler in handlers.items() if issubclass(kind, tuple(_RECIPES))]
    if recipes and mixed_precision != "fp8":
        raise ValueError(f"Passing in an FP8 configuration requires setting `mixed_precision='fp8'` (got "
                         f"{type(recipes[0]).__name__} with mixed_precision={mixed_precision!r}).")
    if len(recipes) > 1:
        raise ValueError("kwargs_handlers holds more than one fp8 recipe (" + ", ".join(
            type(r).__name__ for r in recipes) + "): give the one of the library that should train.")
    if mixed_precision != "fp8":
        return
    if recipes:
        recipe = recipes[0]
        backend = recipe.backend if isinstance(recipe, FP8RecipeKwargs) else next(
            name for kind, name in _RECIPES.items() if isinstance(recipe, kind))
    else:
        backend = str(read_launch_setting("fp8_backend")[0] or "AO").strip().upper()
        backend = "AO" if backend == "NO" else backend  # NO: not chosen, the default library
        if backend not in ("AO", "TE", "MSAMP"):
            raise ValueError(f"HASTEN_FP8_BACKEND / ACCELERATE_FP8_BACKEND={backend!r}: choose one of 'AO', "
                             "'TE', 'MSAMP'.")
    if backend in PLANNED_FP8_LIBRARIES:
        raise fp8_library_not_yet_supported(backend, "train in fp8 through torchao (AORecipeKwargs, the default of "
                                            "mixed_precision='fp8'), or in bf16")
