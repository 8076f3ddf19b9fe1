"""``hasten estimate-memory``: how much memory a model needs, per dtype, without downloading or allocating it.

The model is built on the meta device from a class (``package.module:Class`` or ``path/to/file.py:Class``,
with constructor arguments) or from a local config (a hasten model config naming such a class, or a
Transformers ``config.json`` / folder, which needs ``transformers``). Nothing is fetched from the network.
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import sys
from typing import Any

from ._errors import CommandError

DTYPES = ("float32", "float16", "bfloat16", "int8", "int4")
DEFAULT_DTYPES = ("float32", "float16", "int8", "int4")
_BYTES_PER_WEIGHT = {"float32": 4, "float16": 2, "bfloat16": 2, "int8": 1, "int4": 0.5}
# Adam training holds fp32 weights, fp32 gradients and two fp32 moments, whatever the compute dtype
# (mixed precision autocasts activations; the stored state stays fp32): 16 bytes per parameter.
_ADAM_BYTES_PER_PARAMETER = 16


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "estimate-memory",
        help="estimate the memory a model needs to load and train",
        description="Build a model on the meta device (no weights allocated, nothing downloaded) and print, per "
                    "dtype, the size of its largest layer, its total size and what training it with Adam needs.",
    )
    parser.add_argument("model", help="`package.module:Class`, `path/to/file.py:Class` (a class or a function "
                                      "returning an nn.Module), or a local config: a JSON file "
                                      '{"model": "module:Class", "kwargs": {...}}, or a Transformers config.json '
                                      "or model folder (needs `transformers`).")
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
    return parser


def run(args) -> int:
    model = build_empty_model(args.model, _constructor_kwargs(args.kwargs, args.arg))
    rows = estimate(model, args.dtypes, args.no_split)
    if args.json:
        print(json.dumps({"model": args.model, "parameters": _count(model), "rows": rows}, indent=2))
    else:
        print(format_table(args.model, _count(model), rows))
    return 0


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


def build_empty_model(spec: str, kwargs: dict):
    """The model named by ``spec`` (see the module docstring), built on the meta device."""
    from hasten.big_modeling import init_empty_weights

    if os.path.exists(spec):
        return _from_local_config(spec, kwargs)
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


def _from_local_config(path: str, kwargs: dict):
    config_file = os.path.join(path, "config.json") if os.path.isdir(path) else path
    if not os.path.isfile(config_file):
        raise CommandError(f"{path} holds no config.json: pass a config file or a `module:Class`.")
    try:
        with open(config_file, encoding="utf-8") as handle:
            config = json.load(handle)
    except json.JSONDecodeError as error:
        raise CommandError(f"{config_file} is not valid JSON: {error}") from None
    if isinstance(config, dict) and "model" in config:  # hasten's own: {"model": "module:Class", "kwargs": {...}}
        merged = {**config.get("kwargs", {}), **kwargs}
        return build_empty_model(config["model"], merged)
    return _from_transformers_config(path, config, kwargs)


def _from_transformers_config(path: str, config: dict, kwargs: dict):
    from hasten.big_modeling import init_empty_weights
    from hasten.utils.imports import require_extra

    try:
        transformers = require_extra("transformers", "Reading a Transformers config")
    except ImportError as error:
        raise CommandError(str(error)) from None
    folder = path if os.path.isdir(path) else os.path.dirname(os.path.abspath(path))
    auto_config = transformers.AutoConfig.from_pretrained(folder, local_files_only=True, **kwargs)
    architectures = config.get("architectures") or []
    model_class = getattr(transformers, architectures[0], None) if architectures else None
    with init_empty_weights():
        if model_class is not None:
            model = model_class._from_config(auto_config) if hasattr(model_class, "_from_config") else model_class(auto_config)
        else:
            model = transformers.AutoModel.from_config(auto_config)
    return _checked_module(model, path)


def _checked_module(model, spec: str):
    import torch.nn as nn

    if not isinstance(model, nn.Module):
        raise CommandError(f"{spec} returned a {type(model).__name__}, not a torch.nn.Module.")
    return model


# ------------------------------------------------------------------ the figures
def _count(model) -> int:
    return sum(p.numel() for p in model.parameters())


def estimate(model, dtypes, no_split=None) -> list[dict]:
    """Per dtype: ``{"dtype", "largest_layer", "total_size", "training_adam"}`` in bytes (training None for
    integer dtypes). Floating weights take the dtype's size (never more than they have); integer tensors keep
    theirs; int8 / int4 count every floating weight quantized, a lower bound."""
    import torch

    from hasten.big_modeling.sizes import compute_module_sizes, get_max_layer_size

    no_split = list(no_split) if no_split is not None else list(getattr(model, "_no_split_modules", None) or [])
    top = list(model.named_parameters(recurse=False)) + list(model.named_children()) + list(model.named_buffers(recurse=False))
    fp32_params = sum(p.numel() for p in model.parameters() if p.is_floating_point())
    int_bytes = sum(p.numel() * p.element_size() for p in model.parameters() if not p.is_floating_point())
    rows = []
    for name in dtypes:
        target = {"int8": torch.int8, "int4": torch.uint4}.get(name) or getattr(torch, name)
        sizes = compute_module_sizes(model, dtype=target)
        largest, _ = get_max_layer_size(top, sizes, no_split)
        training = None
        if name in ("float32", "float16", "bfloat16"):
            training = fp32_params * _ADAM_BYTES_PER_PARAMETER + int_bytes
        rows.append({"dtype": name, "largest_layer": largest, "total_size": sizes[""], "training_adam": training})
    return rows


def human_bytes(size) -> str:
    """``1536`` -> ``"1.5 KiB"``."""
    if size is None:
        return "N/A"
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1024
    return f"{value:.2f} PiB"


def format_table(title: str, parameters: int, rows: list[dict]) -> str:
    headers = ["dtype", "Largest layer", "Total size", "Training with Adam"]
    body = [[r["dtype"], human_bytes(r["largest_layer"]), human_bytes(r["total_size"]), human_bytes(r["training_adam"])]
            for r in rows]
    widths = [max(len(str(line[i])) for line in [headers] + body) for i in range(len(headers))]
    rule = "+" + "+".join("-" * (w + 2) for w in widths) + "+"

    def line(cells):
        return "| " + " | ".join(str(c).rjust(w) if i else str(c).ljust(w) for i, (c, w) in enumerate(zip(cells, widths))) + " |"

    lines = [f"Memory needed by {title} ({parameters:,} parameters)", rule, line(headers), rule]
    lines += [line(cells) for cells in body]
    lines += [rule, "Training with Adam: fp32 weights, gradients and two moments (16 bytes/parameter), activations "
                    "not included; int8/int4 count every floating weight quantized."]
    return "\n".join(lines)
