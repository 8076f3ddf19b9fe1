"""``hasten estimate-memory``: how much memory a model needs, per dtype, without downloading or allocating it.

The model is built on the meta device from a class (``package.module:Class`` or ``path/to/file.py:Class``,
with constructor arguments), from a local config (a hasten model config naming such a class, or a
Transformers ``config.json`` / folder, which needs ``transformers``), or, as in Accelerate, from a Hugging Face
Hub model id (``org/name``): only its config is fetched, never its weights.

Code named by a *file* (a hasten model config naming a class, with a ``path.py`` resolved next to the config;
Transformers ``auto_map`` modeling files) is never imported unless ``--trust_remote_code`` (or
``--trust-remote-code``) is given: a downloaded file is not trusted by default. A ``module:Class`` typed on the
command line is the user's own choice and needs no flag.
Accelerate's helper names (``create_empty_model``, ``gather_data``, ``create_ascii_table`` ...) are here too.
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import sys
from typing import TYPE_CHECKING, Any, Optional, Sequence

from .errors import CommandError
from .utils import command_parser

if TYPE_CHECKING:
    from torch import nn

__all__ = ["add_parser", "run", "estimate", "build_empty_model", "format_table", "human_bytes",
           "estimate_command_parser", "estimate_command", "main", "create_empty_model", "gather_data",
           "estimate_training_usage", "create_ascii_table", "check_has_model", "verify_on_hub", "add_timm_hub_prefix"]

DTYPES = ("float32", "float16", "bfloat16", "int8", "int4")
DEFAULT_DTYPES = ("float32", "float16", "int8", "int4")


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "estimate-memory",
        help="estimate the memory a model needs to load and train",
        description="Build a model on the meta device (no weights allocated or downloaded; a Hub model's config "
                    "is fetched) and print, per dtype, the size of its largest layer, its total size and what "
                    "training it with Adam needs. For the memory per rank of a training run under DDP, FSDP, "
                    "ZeRO or tensor parallelism, activations included, use `hasten plan`.",
    )
    parser.add_argument("model_name", metavar="model",
                        help="`package.module:Class`, `path/to/file.py:Class` (a class or a function "
                             "returning an nn.Module), or a local config: a JSON file "
                             '{"model": "module:Class", "kwargs": {...}}, or a Transformers config.json '
                             "or model folder (needs `transformers`), or a Hugging Face Hub model id such as "
                             "`org/name` (its config is fetched).")
    parser.add_argument("--kwargs", default=None, metavar="JSON",
                        help='constructor keyword arguments as a JSON object, e.g. \'{"n_layers": 48}\'')
    parser.add_argument("--arg", "-a", action="append", default=[], metavar="NAME=VALUE",
                        help="one constructor argument (VALUE read as JSON when it parses, else as text); repeatable")
    parser.add_argument("--dtypes", nargs="+", default=list(DEFAULT_DTYPES), choices=DTYPES,
                        help=f"dtypes to report (default: {' '.join(DEFAULT_DTYPES)})")
    parser.add_argument("--no-split", nargs="+", default=None, metavar="CLASS",
                        help="class names never split across devices (the largest layer counts them whole); "
                             "default: the model's `_no_split_modules`")
    parser.add_argument("--json", action="store_true", help="print the figures (bytes) as JSON instead of a table")
    parser.add_argument("--trust_remote_code", "--trust-remote-code", action="store_true", default=False,
                        help="allow the code a config file or model folder names to run (a hasten config's class, "
                             "Transformers auto_map files); only for files whose code you have read")
    parser.add_argument("--access_token", "--access-token", default=None,
                        help="Hugging Face token for a gated or private Hub model")
    parser.add_argument("--library_name", "--library-name", default=None, choices=("transformers", "timm"),
                        help="build MODEL with this library (timm: an architecture name such as resnet50)")
    return parser


def run(args: argparse.Namespace) -> int:
    model = create_empty_model(args.model_name, getattr(args, "library_name", None),
                               getattr(args, "trust_remote_code", False), getattr(args, "access_token", None),
                               kwargs=_constructor_kwargs(args.kwargs, args.arg))
    rows = estimate(model, args.dtypes, args.no_split)
    if args.json:
        print(json.dumps({"model": args.model_name, "parameters": _count(model), "rows": rows}, indent=2))
    else:
        print(format_table(args.model_name, _count(model), rows))
    return 0


estimate_command = run


def estimate_command_parser(subparsers: Optional[argparse._SubParsersAction] = None) -> argparse.ArgumentParser:
    """``hasten estimate-memory``'s parser: registered on ``subparsers`` when given, else stand-alone."""
    return command_parser(add_parser, subparsers, estimate_command)


def main() -> int:
    from .cli import main as cli_main

    return cli_main(["estimate-memory", *sys.argv[1:]])


# ------------------------------------------------------------------ building the model
def _constructor_kwargs(kwargs_json, pairs) -> dict:
    kwargs: dict = {}
    if kwargs_json:
        try:
            kwargs = json.loads(kwargs_json)
        except json.JSONDecodeError as error:
            raise CommandError(f"--kwargs is not valid JSON ({error}): write e.g. '{{\"n_layers\": 48}}'.") from None
        if not isinstance(kwargs, dict):
            raise CommandError("--kwargs must be a JSON object, e.g. '{\"n_layers\": 48}'.")
    for pair in pairs:
        name, sep, text = pair.partition("=")
        if not sep or not name.isidentifier():
            raise CommandError(f"--arg {pair!r} is not NAME=VALUE (e.g. --arg n_layers=48).")
        try:
            kwargs[name] = json.loads(text)
        except json.JSONDecodeError:
            kwargs[name] = text
    return kwargs


def create_empty_model(model_name: str, library_name: Optional[str] = None, trust_remote_code: bool = False,
                       access_token: Optional[str] = None, *, kwargs: Optional[dict[str, Any]] = None) -> nn.Module:
    """``model_name`` built on the meta device: a hasten spec (``module:Class``, a file, a local config or folder),
    with ``library_name="timm"`` a timm architecture, or else a Hugging Face Hub model id (``org/name``), whose
    config alone is fetched, with ``access_token`` for gated or private repositories (as Accelerate does).
    """
    kwargs = dict(kwargs or {})
    if library_name == "timm":
        return _from_timm(model_name, kwargs)
    if library_name not in (None, "transformers"):
        raise CommandError(f"--library_name {library_name!r}: choose transformers or timm, or leave it out.")
    if _looks_like_hub_id(model_name):
        return _from_hub(model_name, library_name, trust_remote_code, access_token, kwargs)
    return build_empty_model(model_name, kwargs, trust_remote_code=trust_remote_code)


def _looks_like_hub_id(name: str) -> bool:
    """Not a local path nor a ``module:Class`` (hasten's own specs come first), and shaped like ``org/name`` or
    ``name``: the Hub's model ids."""
    if os.path.exists(name) or ":" in name or name.endswith((".py", ".json")) or name.startswith((".", "/", "~")):
        return False
    parts = name.split("/")
    return len(parts) <= 2 and all(part and all(c.isalnum() or c in "-_." for c in part) for part in parts) \
        and ("/" in name or "." not in name)


def _hub_error(kind: str, message: str):
    """``huggingface_hub``'s exception of that ``kind`` (which also is an OSError) with ``message``."""
    from huggingface_hub import errors

    error_class = getattr(errors, kind)
    response_class = getattr(errors, "Response", None)  # the HTTP library's, which these errors carry
    try:
        response = response_class(404 if kind == "RepositoryNotFoundError" else 401,
                                  request=_http_request(response_class)) if response_class is not None else None
        return error_class(message, response=response)
    except TypeError:  # releases whose errors take the message alone
        return error_class(message)


def _http_request(response_class):
    request_class = getattr(importlib.import_module(response_class.__module__.split(".")[0]), "Request", None)
    return request_class("GET", "https://huggingface.co/api/models") if request_class is not None else None


def _from_hub(name: str, library_name, trust_remote_code: bool, token, kwargs: dict):
    try:
        info = verify_on_hub(name, token)
    except Exception as error:  # offline, a proxy, a timeout: said in one line, not a traceback
        raise CommandError(
            f"{name!r} is no local path nor `module:Class`, so it was looked up as a Hugging Face Hub model, and the "
            f"Hub could not be reached ({type(error).__name__}: {error}). Check the name and your connection, or "
            "give a local config (a config.json or model folder) or `module:Class`.") from error
    if info == "gated":
        raise _hub_error("GatedRepoError", f"Repo for model `{name}` is gated. You must be authenticated to access "
                                           "it: run `hf auth login`, or pass an access token.")
    if info == "repo":
        raise _hub_error("RepositoryNotFoundError", f"Repo for model `{name}` does not exist on the Hub. Check the "
                                                    "name, or give a local config or `module:Class`.")
    library = library_name or getattr(info, "library_name", None)
    if library is None:
        raise ValueError(f"Model `{name}` does not have any library metadata on the Hub, please manually pass in a "
                         "`--library_name` to use (such as `transformers`).")
    if library == "timm":
        return _from_timm(name, kwargs)
    if library != "transformers":
        raise ValueError(f"Model `{name}` is a {library} model on the Hub; estimate-memory builds transformers and "
                         "timm models: pass `--library_name transformers` if it is one.")
    from hasten.big_modeling import init_empty_weights
    from hasten.core.imports import require_extra

    try:
        transformers = require_extra("transformers", "Estimating a Hub model")
    except ImportError as error:
        raise CommandError(str(error)) from None
    auto_map = (getattr(info, "config", None) or {}).get("auto_map")
    if auto_map and not trust_remote_code:
        raise ValueError(f"Model `{name}` runs code of its own (its config's auto_map). Read it, then pass "
                         f"{TRUST_FLAG} to allow it to run.")
    try:
        config = transformers.AutoConfig.from_pretrained(name, trust_remote_code=trust_remote_code, token=token)
    except ValueError as error:
        if "trust_remote_code" in str(error):
            raise ValueError(f"Model `{name}` runs code of its own: pass {TRUST_FLAG} to allow it ({error}).") from None
        raise
    with init_empty_weights():
        try:
            model = transformers.AutoModel.from_config(config, trust_remote_code=trust_remote_code, **kwargs)
        except (ValueError, KeyError) as error:
            raise RuntimeError(f"Tried to load `{name}` with `transformers` but a possible model to load was not "
                               f"found inside the repo ({type(error).__name__}: {error}).") from error
    return _checked_module(model, name)


def _from_timm(name: str, kwargs: dict):
    from hasten.big_modeling import init_empty_weights
    from hasten.core.imports import require_extra

    try:
        timm = require_extra("timm", "Building a timm model")
    except ImportError as error:
        raise CommandError(str(error)) from None
    with init_empty_weights():
        return _checked_module(timm.create_model(add_timm_hub_prefix(name), pretrained=False, **kwargs), name)


def build_empty_model(spec: str, kwargs: dict, trust_remote_code: bool = False) -> nn.Module:
    """The model named by ``spec`` (see the module docstring), built on the meta device."""
    from hasten.big_modeling import init_empty_weights

    if os.path.exists(spec):
        return _from_local_config(spec, kwargs, trust_remote_code)
    factory = _resolve_factory(spec)
    with init_empty_weights():
        try:
            model = factory(**kwargs)
        except Exception as error:
            raise CommandError(f"Building {spec} with arguments {kwargs} failed: {type(error).__name__}: {error}") from error
    return _checked_module(model, spec)


def _resolve_factory(spec: str):
    location, sep, attribute = spec.rpartition(":")
    if not sep or not location or not attribute:
        raise CommandError(
            f"{spec!r} is neither an existing config path nor `module:Class` (e.g. `mypackage.model:GPT` or "
            "`model.py:GPT`)."
        )
    if location.endswith(".py") or os.sep in location:
        if not os.path.isfile(location):
            raise CommandError(f"{location} does not exist.")
        module_spec = importlib.util.spec_from_file_location(f"_hasten_estimate_{abs(hash(location))}", location)
        module = importlib.util.module_from_spec(module_spec)
        sys.path.insert(0, os.path.dirname(os.path.abspath(location)))
        try:
            module_spec.loader.exec_module(module)
        except Exception as error:
            raise CommandError(f"Running {location} failed: {type(error).__name__}: {error}") from error
        finally:
            sys.path.pop(0)
    else:
        if os.getcwd() not in sys.path and "" not in sys.path:
            sys.path.insert(0, os.getcwd())
        try:
            module = importlib.import_module(location)
        except ImportError as error:
            raise CommandError(f"Cannot import {location!r}: {error}") from error
    factory: Any = module
    for step in attribute.split("."):
        if not hasattr(factory, step):
            raise CommandError(f"{location} has no attribute {attribute!r}.")
        factory = getattr(factory, step)
    if not callable(factory):
        raise CommandError(f"{spec} is not a class or a function.")
    return factory


TRUST_FLAG = "--trust_remote_code"


def _from_local_config(path: str, kwargs: dict, trust_remote_code: bool):
    folder = os.path.isdir(path)
    config_file = os.path.join(path, "config.json") if folder else path
    if not os.path.isfile(config_file):
        raise CommandError(f"{path} holds no config.json: pass a config file or a `module:Class`.")
    try:
        with open(config_file, encoding="utf-8") as handle:
            config = json.load(handle)
    except json.JSONDecodeError as error:
        raise CommandError(f"{config_file} is not valid JSON: {error}") from None
    except UnicodeDecodeError:
        raise CommandError(f"{config_file} is not a JSON text file; pass a config file or a `module:Class`.") from None
    if isinstance(config, dict) and "model" in config:  # hasten's own: {"model": "module:Class", "kwargs": {...}}
        return _from_hasten_config(config_file, config, kwargs, trust_remote_code)
    return _from_transformers_config(path, config, kwargs, trust_remote_code)


def _from_hasten_config(config_file: str, config: dict, kwargs: dict, trust_remote_code: bool):
    """Build the class a hasten model config names: code named by a file runs only with ``--trust_remote_code``."""
    spec, file_kwargs = config["model"], config.get("kwargs", {})
    if not isinstance(spec, str) or not isinstance(file_kwargs, dict):
        raise CommandError(f"{config_file}: write {{\"model\": \"module:Class\", \"kwargs\": {{...}}}} "
                           "(model a string, kwargs an object).")
    if not trust_remote_code:
        raise CommandError(
            f"{config_file} names code to run ({spec!r}); hasten does not import code named in a file unless you "
            f"pass {TRUST_FLAG} (only for files whose code you have read). Or name the class yourself: "
            f"hasten estimate-memory module:Class --kwargs '...'."
        )
    location, sep, attribute = spec.rpartition(":")
    if sep and (location.endswith(".py") or "/" in location) and not os.path.isabs(location):
        # a model file next to the config, as a downloaded folder ships it (not the current folder's)
        spec = f"{os.path.join(os.path.dirname(os.path.abspath(config_file)), location)}:{attribute}"
    return build_empty_model(spec, {**file_kwargs, **kwargs})


def _from_transformers_config(path: str, config: dict, kwargs: dict, trust_remote_code: bool = False):
    import torch.nn as nn

    from hasten.big_modeling import init_empty_weights
    from hasten.core.imports import require_extra

    try:
        transformers = require_extra("transformers", "Reading a Transformers config")
    except ImportError as error:
        raise CommandError(str(error)) from None
    folder = path if os.path.isdir(path) else os.path.dirname(os.path.abspath(path))
    from hasten.planning.model_source import load_transformers_config

    auto_config = load_transformers_config(transformers, folder, config, kwargs, trust_remote_code)
    architectures = config.get("architectures") or []
    model_class = getattr(transformers, str(architectures[0]), None) if architectures else None
    if not (isinstance(model_class, type) and issubclass(model_class, nn.Module)):
        model_class = None  # the file names only a Transformers model class, never any other callable
    with init_empty_weights():
        if model_class is not None:
            model = model_class._from_config(auto_config) if hasattr(model_class, "_from_config") else model_class(auto_config)
        else:
            model = transformers.AutoModel.from_config(auto_config, trust_remote_code=trust_remote_code)
    return _checked_module(model, path)


def _checked_module(model, spec: str):
    import torch.nn as nn

    if not isinstance(model, nn.Module):
        raise CommandError(f"{spec} returned a {type(model).__name__}, not a torch.nn.Module.")
    return model


# ------------------------------------------------------------------ the figures
def _count(model) -> int:
    return sum(p.numel() for p in model.parameters())


def estimate(model: nn.Module, dtypes: Sequence[str], no_split: Optional[Sequence[str]] = None) -> list[dict]:
    """Per dtype: ``{"dtype", "largest_layer", "total_size", "training_adam"}`` in bytes (training None for
    integer dtypes). float32 / float16 / bfloat16: every floating parameter and buffer stored in that dtype,
    whatever dtype the model was built in (a config's ``torch_dtype``), integer tensors in theirs
    (``module_sizes_in_dtype``). int8 / int4 give what ``load_and_quantize_model`` allocates with a default
    ``BnbQuantizationConfig``: the linear layers quantized (with their scales), the output head / tied weights
    and every other floating tensor in float16."""
    from hasten.big_modeling.sizes import get_max_layer_size, module_sizes_in_dtype
    from hasten.config.quantization import BnbQuantizationConfig
    from hasten.quantization.sizes import quantized_module_sizes

    no_split = list(no_split) if no_split is not None else list(getattr(model, "_no_split_modules", None) or [])
    top = list(model.named_parameters(recurse=False)) + list(model.named_children()) + list(model.named_buffers(recurse=False))
    fp32_params = sum(p.numel() for p in model.parameters() if p.is_floating_point())
    int_bytes = sum(p.numel() * p.element_size() for p in model.parameters() if not p.is_floating_point())
    rows = []
    for name in dtypes:
        if name in ("int8", "int4"):
            config = BnbQuantizationConfig(load_in_8bit=name == "int8", load_in_4bit=name == "int4")
            sizes = quantized_module_sizes(model, config)
        else:
            sizes = module_sizes_in_dtype(model, name)
        largest, _ = get_max_layer_size(top, sizes, no_split)
        training = None
        if name in ("float32", "float16", "bfloat16"):
            training = estimate_training_usage(fp32_params * 4, name)["step"] + int_bytes
        rows.append({"dtype": name, "largest_layer": largest, "total_size": sizes[""], "training_adam": training})
    return rows


def human_bytes(size: Optional[float]) -> str:
    """``1536`` -> ``"1.5 KiB"``."""
    if size is None:
        return "N/A"
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1024
    return f"{value:.2f} PiB"


def estimate_training_usage(bytes: int, mixed_precision: str,  # noqa: A002
                            msamp_config: Optional[Any] = None) -> dict:
    """Training with Adam, by part, for a model of ``bytes`` in float32: ``{"model", "gradients", "optimizer",
    "step"}``, "step" being everything held at the optimizer step (16 bytes per parameter).

    Mixed precision (float16, bfloat16, fp8) autocasts the computation but keeps these float32 copies, so the
    figures are the same; -1 for dtypes that are not trained (int8, int4). ``msamp_config`` is not used.
    """
    if mixed_precision not in ("float32", "float16", "bfloat16", "fp8"):
        return {"model": -1, "optimizer": -1, "gradients": -1, "step": -1}
    parts = {"model": bytes, "optimizer": 2 * bytes, "gradients": bytes}  # weights, two Adam moments, gradients
    return {**parts, "step": sum(parts.values())}


def create_ascii_table(headers: list, rows: list, title: str) -> str:
    """``title`` over a table of ``rows`` (strings; the first column left-aligned, the others right-aligned)."""
    widths = [max(len(str(line[i])) for line in [headers, *rows]) for i in range(len(headers))]
    rule = "+" + "+".join("-" * (width + 2) for width in widths) + "+"

    def line(cells):
        return "| " + " | ".join(str(cell).rjust(width) if index else str(cell).ljust(width)
                                 for index, (cell, width) in enumerate(zip(cells, widths))) + " |"

    return "\n".join([title, rule, line(headers), rule, *(line(cells) for cells in rows), rule])


def format_table(title: str, parameters: int, rows: list[dict]) -> str:
    headers = ["dtype", "Largest layer", "Total size", "Training with Adam"]
    body = [[r["dtype"], human_bytes(r["largest_layer"]), human_bytes(r["total_size"]), human_bytes(r["training_adam"])]
            for r in rows]
    table = create_ascii_table(headers, body, f"Memory needed by {title} ({parameters:,} parameters)")
    return table + ("\nTraining with Adam: fp32 weights, gradients and two moments (16 bytes/parameter), activations "
                    "not included; int8/int4: linear layers quantized by bitsandbytes (scales included), the rest in float16.")


# ------------------------------------------------------------------ Accelerate's helpers
def gather_data(args: argparse.Namespace) -> list:
    """Accelerate's rows for ``args.model_name``: ``[dtype, largest layer, total size, training by part]`` (bytes)."""
    model = create_empty_model(args.model_name, getattr(args, "library_name", None),
                               getattr(args, "trust_remote_code", False), getattr(args, "access_token", None))
    fp32_bytes = 4 * sum(p.numel() for p in model.parameters() if p.is_floating_point())
    return [[row["dtype"], row["largest_layer"], row["total_size"], estimate_training_usage(fp32_bytes, row["dtype"])]
            for row in estimate(model, args.dtypes, getattr(args, "no_split", None))]


def check_has_model(error: BaseException) -> str:
    """Which library raised ``error`` on a model it could not find: ``"timm"``, ``"transformers"`` or ``"unknown"``."""
    message = str(error)
    if (isinstance(error, RuntimeError) and "Unknown model" in message) or (
            isinstance(error, KeyError) and "architecture" in message):
        return "timm"
    if isinstance(error, (OSError, ValueError)) and (
            "does not appear to have a file named" in message or "Unrecognized model in" in message):
        return "transformers"
    return "unknown"


def add_timm_hub_prefix(model_name: str) -> str:
    """``"org/model"`` -> ``"hf-hub:org/model"`` (timm's form for Hub ids); other names unchanged."""
    if ":" in model_name or "/" not in model_name:
        return model_name
    return f"hf-hub:{model_name}"


def verify_on_hub(repo: str, token: Optional[str] = None) -> Any:
    """The Hub's model info for ``repo``, ``"gated"`` or ``"repo"`` (not found). Needs ``huggingface_hub``;
    ``hasten estimate-memory`` asks it only for a name that is no local path nor ``module:Class``."""
    from hasten.core.imports import require_extra

    hub = require_extra("huggingface_hub", "Looking a model up on the Hugging Face Hub")
    from huggingface_hub.utils import GatedRepoError, RepositoryNotFoundError

    try:
        return hub.model_info(repo, token=token)
    except GatedRepoError:  # a subclass of RepositoryNotFoundError: asked first
        return "gated"
    except RepositoryNotFoundError:
        return "repo"
