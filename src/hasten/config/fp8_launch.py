"""A launch's fp8 options: the torchao ones reach the script, the recipes of other libraries are refused. ``hasten
launch`` (its flags and the config file) and a process started without it (``config/launch_file.py``, the config file
alone) both read them here.

``--mixed_precision fp8`` trains through torchao; its options (``--fp8_backend ao``, ``--fp8_pad_inner_dim``,
``--fp8_enable_fsdp_float8_all_gather``, or the same keys under a config file's ``fp8_config:``, where the
``fp8_`` prefix may be left out: ``backend: AO``) travel as ``HASTEN_FP8_<OPTION>``, which ``AORecipeKwargs`` and
the Accelerator read. TransformerEngine and MS-AMP (``backend: TE`` / ``MSAMP``, and their recipe options
``--fp8_format``, ``--fp8_margin`` ...) are planned: the launch stops with ``NotYetSupportedError`` before anything
starts, rather than let the script train fp8 another way. A command-line flag wins over the config file's key.
"""
from __future__ import annotations

import argparse
from typing import Mapping, Optional

from ..core.env_vars import env_name
from ..core.input_errors import CommandError
from ..core.planned import NotYetSupportedError, not_yet_supported
from .launch_groups import backend_not_yet_supported, env_text

__all__ = ["TORCHAO_OPTIONS", "PLANNED_FP8_LIBRARIES", "fp8_library_not_yet_supported", "fp8_options", "fp8_env"]

#: the options torchao's fp8 training reads (``AORecipeKwargs`` and the library choice)
TORCHAO_OPTIONS = ("fp8_backend", "fp8_pad_inner_dim", "fp8_enable_fsdp_float8_all_gather")
#: the fp8 backends hasten does not train with yet, and their libraries' names
PLANNED_FP8_LIBRARIES = {"TE": "TransformerEngine", "MSAMP": "MS-AMP"}


def fp8_library_not_yet_supported(backend: str, meanwhile: str, detail: str = "") -> NotYetSupportedError:
    """The ``NotYetSupportedError`` for fp8 ``backend`` ("TE" / "MSAMP"), ``detail`` after the library's name."""
    return not_yet_supported(f"fp8 training with {PLANNED_FP8_LIBRARIES[backend]}{detail}", meanwhile)


_BACKENDS = ("AO", "NO", *PLANNED_FP8_LIBRARIES)


def fp8_options(args: argparse.Namespace, config: Optional[Mapping] = None) -> dict:
    """``{"fp8_<option>": value}``: the config file's ``fp8_config`` section, then the ``--fp8_*`` flags given
    (``args`` holds the flags given only, not the parser's defaults)."""
    section = (config or {}).get("fp8_config") or {}
    if not isinstance(section, Mapping):
        raise CommandError(f"The config file's fp8_config must be a mapping of options, got {section!r}.")
    options = {(key if str(key).startswith("fp8_") else f"fp8_{key}"): value
               for key, value in section.items() if value is not None}
    options.update({name: value for name, value in vars(args).items()
                    if name.startswith("fp8_") and value is not None})
    return options


def fp8_env(args: argparse.Namespace, config: Optional[Mapping] = None) -> dict:
    """The ``HASTEN_FP8_*`` variables of the torchao options given; ``NotYetSupportedError`` for another library's
    backend or recipe options, ``CommandError`` for a backend name no library has. Called before the job starts."""
    options = fp8_options(args, config)
    backend = str(options.get("fp8_backend", "AO")).strip().upper()
    if backend not in _BACKENDS:
        raise CommandError(f"fp8 backend {options['fp8_backend']!r} (--fp8_backend / fp8_config's backend): "
                           "choose one of ao, te, msamp.")
    if backend in PLANNED_FP8_LIBRARIES:
        raise fp8_library_not_yet_supported(backend, "use --mixed_precision fp8 with the torchao backend "
                                            "(--fp8_backend ao, the default), or bf16", f" (fp8 backend {backend})")
    recipe_only = sorted(name for name in options if name not in TORCHAO_OPTIONS)
    if recipe_only:
        raise backend_not_yet_supported("FP8", ["--" + name for name in recipe_only])
    env = {env_name(name): env_text(options[name]) for name in TORCHAO_OPTIONS if name in options}
    if "fp8_backend" in options:
        env[env_name("fp8_backend")] = backend
    return env
