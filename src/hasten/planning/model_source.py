"""What a plan is asked about: a model that can be built again with fewer layers or narrower layers, and its batch.

``transformers_source(config)`` wraps a Transformers config (read from a local folder or the Hub by
``load_transformers_config``: nothing named in the folder runs without ``trust_remote_code``); ``factory_source``
wraps the user's own function returning an ``nn.Module``. A ``ModelSource`` answers what the planner needs to know:

- ``build(layers, narrowed_by, dtype)``: the model, its weights in ``dtype``, with ``layers`` repeated blocks (the
  planner traces two small counts and scales, so a model of any depth plans in seconds) and, with
  ``narrowed_by=t``, the attention heads and the MLP's inner width divided by ``t``: what one rank of a ``t``-way
  tensor-parallel run computes (hidden size and head size kept, so the replicated parts and the all-reduced outputs
  stay full size; an output layer and an input embedding the model's plan splits by vocabulary hold their shares,
  ``narrowed_vocabulary.py``);
- ``batch(micro_batch_size, seq_len)``: a training batch of that shape;
- the shapes that decide which layouts can exist (layers, heads, key/value heads, maximum positions).
"""
from __future__ import annotations

import contextlib
import copy
import json
import logging
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional

import torch
from torch import nn

from .narrowed_vocabulary import narrow_vocabulary

__all__ = ["ModelSource", "PlanInputError", "transformers_source", "factory_source", "load_transformers_config",
           "source_from_name"]

TRUST_FLAG = "--trust_remote_code"


class PlanInputError(ValueError):
    """A model, an option or a layout the planner cannot plan, found before any work: the message says why."""


@dataclass
class ModelSource:
    """A model the planner can build at any depth (see the module docstring)."""

    name: str
    build: Callable[[Optional[int], int, torch.dtype], nn.Module]
    batch: Callable[[int, int], Any]
    layers: Optional[int] = None  # the repeated blocks (None: always built whole)
    heads: Optional[int] = None
    kv_heads: Optional[int] = None
    max_positions: Optional[int] = None
    hidden_size: Optional[int] = None
    vocab_size: Optional[int] = None
    tensor_parallel: Optional[str] = None  # None: tensor parallelism can be planned; else why not
    context_parallel: Optional[str] = None  # None: context parallelism can be planned; else why not
    stored_bytes_per_parameter: int = 4  # in the checkpoint a job loads (the config's dtype)
    notes: list[str] = field(default_factory=list)


def _unresolved_dtypes(config: dict) -> dict:
    """``{"torch_dtype": None}`` / ``{"dtype": None}`` for each of a Transformers config's dtype keys whose value
    names no torch dtype (``"auto"``: "the checkpoint's"), which Transformers cannot read a config with."""
    def unresolved(value: Any) -> bool:
        return isinstance(value, str) and not isinstance(getattr(torch, value.replace("torch.", ""), None), torch.dtype)

    return {key: None for key in ("torch_dtype", "dtype") if unresolved(config.get(key))}


def load_transformers_config(transformers: Any, folder: str, config: dict, kwargs: dict,
                             trust_remote_code: bool) -> Any:
    """The local folder's (or config file's) ``AutoConfig`` with ``kwargs`` applied (``estimate-memory`` and the
    plan read configs here). A dtype naming no torch dtype (``"auto"``) is unset. ``trust_remote_code`` is always
    passed to Transformers: False keeps the folder's own modeling files (``auto_map``) from running."""
    overrides = _unresolved_dtypes({**(config if isinstance(config, dict) else {}), **kwargs})
    # unsetting "torch_dtype" makes Transformers 5 warn that the name is deprecated: the user did not write it
    config_logger = logging.getLogger("transformers.configuration_utils")
    level = config_logger.level
    if overrides:
        config_logger.setLevel(logging.ERROR)
    try:
        return transformers.AutoConfig.from_pretrained(
            folder, local_files_only=True, **{**kwargs, **overrides, "trust_remote_code": trust_remote_code})
    finally:
        config_logger.setLevel(level)


def _transformers() -> Any:
    from ..core.imports import require_extra

    try:
        return require_extra("transformers", "Planning a Transformers model")
    except ImportError as error:
        raise PlanInputError(str(error)) from None


def source_from_name(name: str, trust_remote_code: bool = False, token: Optional[str] = None) -> ModelSource:
    """The model a local folder (or its ``config.json``) or a Hub model id names: its config alone is read."""
    transformers = _transformers()
    if os.path.exists(name):
        folder = name if os.path.isdir(name) else os.path.dirname(os.path.abspath(name))
        config_file = os.path.join(folder, "config.json") if os.path.isdir(name) else name
        if not os.path.isfile(config_file):
            raise PlanInputError(f"{name} holds no config.json: give a model folder or its config.json, or "
                                 "--factory module:function.")
        try:
            with open(config_file, encoding="utf-8") as handle:
                raw = json.load(handle)
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise PlanInputError(f"{config_file} is not a JSON config ({error}).") from None
        if not isinstance(raw, dict):
            raise PlanInputError(f"{config_file} is not a Transformers config (a JSON object).")
        if raw.get("auto_map") and not trust_remote_code:
            raise PlanInputError(f"{config_file} names modeling code of its own (auto_map): hasten does not run code "
                                 f"named in a file unless you pass {TRUST_FLAG} (only for code you have read).")
        try:
            config = load_transformers_config(transformers, config_file, raw, {}, trust_remote_code)
        except (ValueError, KeyError, OSError) as error:
            raise PlanInputError(f"{config_file}: Transformers cannot read this config ({_one_line(error)}).") from None
    else:
        try:
            config = transformers.AutoConfig.from_pretrained(name, trust_remote_code=trust_remote_code, token=token)
        except ValueError as error:
            if "trust_remote_code" in str(error):
                raise PlanInputError(f"{name} runs modeling code of its own: read it, then pass {TRUST_FLAG}.") \
                    from None
            raise PlanInputError(f"{name}: {_one_line(error)}") from None
        except OSError as error:
            raise PlanInputError(f"{name} is no local folder and its config could not be read from the Hugging Face "
                                 f"Hub ({_one_line(error)}).") from None
    return transformers_source(config, name=name, trust_remote_code=trust_remote_code)


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype) -> Iterator[None]:
    """New floating tensors in ``dtype`` while a model is built (converting a built model is impossible on fake
    tensors: PyTorch cannot swap a parameter the fake mode holds a weak reference to)."""
    saved = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(saved)


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split())[:300]


def _model_class(transformers: Any, config: Any, trust_remote_code: bool) -> Callable[[Any], nn.Module]:
    """How to build ``config``'s model: the class its ``architectures`` names (a Transformers class, never any other
    callable), else a causal LM when Transformers has one for the type, else the bare model."""
    for architecture in getattr(config, "architectures", None) or []:
        found = getattr(transformers, str(architecture), None)
        if isinstance(found, type) and issubclass(found, nn.Module):
            return found._from_config if hasattr(found, "_from_config") else found
    for auto in (transformers.AutoModelForCausalLM, transformers.AutoModel):
        if type(config) in auto._model_mapping:
            return lambda config, auto=auto: auto.from_config(config)
    if trust_remote_code and getattr(config, "auto_map", None):
        return lambda config: transformers.AutoModel.from_config(config, trust_remote_code=True)
    raise PlanInputError(f"Transformers has no model class for the model type {getattr(config, 'model_type', '?')!r} "
                         "(architectures: " + ", ".join(getattr(config, "architectures", None) or ["none"]) + ").")


def _tensor_parallel_refusal(config: Any, heads: Optional[int]) -> Optional[str]:
    """Why tensor parallelism cannot be planned for ``config`` (None: it can)."""
    if not getattr(config, "base_model_tp_plan", None):
        return f"{type(config).__name__} has no tensor-parallel plan (base_model_tp_plan)"
    if heads is None or not hasattr(config, "intermediate_size") or not hasattr(config, "head_dim"):
        return f"{type(config).__name__} does not name its heads, head size and MLP width"
    return None


_ATTENTION_DROPOUT = ("attention_dropout", "attn_pdrop", "attention_probs_dropout_prob")


def _context_parallel_refusal(config: Any) -> Optional[str]:
    """Why context parallelism cannot run ``config``'s model (None: it can): hasten refuses attention dropout."""
    for key in _ATTENTION_DROPOUT:
        value = getattr(config, key, None)
        if isinstance(value, (int, float)) and value > 0:
            return f"context parallelism needs attention dropout 0 (the config's {key} is {value})"
    return None


def transformers_source(config: Any, name: Optional[str] = None, trust_remote_code: bool = False) -> ModelSource:
    """A ``ModelSource`` for a Transformers config object; the weights are built in the dtype asked (float32 by
    default: the master weights of mixed-precision training), whatever dtype the config names."""
    transformers = _transformers()
    build_class = _model_class(transformers, config, trust_remote_code)
    layers = getattr(config, "num_hidden_layers", None)
    heads = getattr(config, "num_attention_heads", None)
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    hidden = getattr(config, "hidden_size", None)
    vocab = getattr(config, "vocab_size", None)
    if not isinstance(vocab, int) or vocab < 1:
        raise PlanInputError(f"{name or type(config).__name__}: the config has no vocab_size, so no batch of token ids "
                             "can be made for it; plan it with --factory and --batch_factory instead.")
    head_dim = getattr(config, "head_dim", None) or (hidden // heads if hidden and heads else None)
    stored = vars(config).get("dtype") or vars(config).get("torch_dtype")
    stored_bytes = stored.itemsize if isinstance(stored, torch.dtype) else 4

    def build(depth: Optional[int] = None, narrowed_by: int = 1, dtype: torch.dtype = torch.float32) -> nn.Module:
        shaped = copy.deepcopy(config)
        key = "dtype" if hasattr(type(shaped), "dtype") or "dtype" in vars(shaped) else "torch_dtype"
        if vars(shaped).get(key) is not None or getattr(type(shaped), key, None) is not None:
            setattr(shaped, key, dtype)
        if depth is not None and layers is not None:
            shaped.num_hidden_layers = depth
            if isinstance(getattr(shaped, "layer_types", None), list):
                shaped.layer_types = shaped.layer_types[:depth]
        if narrowed_by > 1:
            shaped.head_dim = head_dim
            shaped.num_attention_heads = heads // narrowed_by
            shaped.num_key_value_heads = kv_heads // narrowed_by
            shaped.intermediate_size = config.intermediate_size // narrowed_by
        with _default_dtype(dtype):
            model = build_class(shaped)
        if narrowed_by > 1:
            narrow_vocabulary(model, narrowed_by)
        return model

    def batch(micro_batch_size: int, seq_len: int) -> dict:
        ids = torch.randint(0, vocab, (micro_batch_size, seq_len))
        return {"input_ids": ids, "labels": ids}

    return ModelSource(name=name or type(config).__name__, build=build, batch=batch,
                       layers=layers if isinstance(layers, int) and layers > 0 else None, heads=heads,
                       kv_heads=kv_heads, max_positions=getattr(config, "max_position_embeddings", None),
                       hidden_size=hidden, vocab_size=vocab,
                       tensor_parallel=_tensor_parallel_refusal(config, heads),
                       context_parallel=_context_parallel_refusal(config), stored_bytes_per_parameter=stored_bytes)


def factory_source(factory: Callable[[], nn.Module], batch: Optional[Callable[[int, int], Any]] = None,
                   name: Optional[str] = None) -> ModelSource:
    """A ``ModelSource`` for the user's own ``factory()``; ``batch(micro_batch_size, seq_len)`` makes its input.
    Without ``batch``, a factory returning a Transformers model (a ``config`` with ``vocab_size``) gets token ids."""
    label = name or getattr(factory, "__name__", "factory")
    vocab: list[int] = []  # the vocabulary of a Transformers model the factory returned, once built

    def build(depth: Optional[int] = None, narrowed_by: int = 1, dtype: torch.dtype = torch.float32) -> nn.Module:
        with _default_dtype(dtype):
            model = factory()
        if not isinstance(model, nn.Module):
            raise PlanInputError(f"{label} returned a {type(model).__name__}, not a torch.nn.Module.")
        size = getattr(getattr(model, "config", None), "vocab_size", None)
        if isinstance(size, int) and not vocab:
            vocab.append(size)
        return model

    def token_batch(micro_batch_size: int, seq_len: int) -> dict:
        if not vocab:
            raise PlanInputError(f"{label}: give batch= (--batch_factory module:function, called with the micro-batch "
                                 "size and the sequence length) to say what the model is fed.")
        ids = torch.randint(0, vocab[0], (micro_batch_size, seq_len))
        return {"input_ids": ids, "labels": ids}

    return ModelSource(name=label, build=build, batch=batch or token_batch,
                       tensor_parallel="a model from a factory has no tensor-parallel plan the planner can read")
