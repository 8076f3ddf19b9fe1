"""``DeepSpeedPlugin`` and ``HfDeepSpeedConfig``: the DeepSpeed ZeRO configuration.

Both are real configuration objects: the plugin resolves unset fields from the launcher's environment
(``HASTEN_DEEPSPEED_<OPTION>``, or ``ACCELERATE_DEEPSPEED_<OPTION>``), validates them, and builds (or fills in) the
DeepSpeed config dict exactly as Accelerate does, so ``plugin.deepspeed_config`` can be inspected and written out.
``Accelerator(deepspeed_plugin=...)`` trains with it (``strategies/deepspeed/auto_config.py`` fills the ``"auto"``
values, ``strategies/deepspeed/strategy.py`` builds the engines); deepspeed is imported here only by ``zero3_init``
and ``set_moe_leaf_modules``.

``fill_auto`` is the one filler of ``"auto"`` values: it walks to a dotted key, fills an ``"auto"`` there, and
otherwise compares the set value and returns a ``ConfigMismatch``. Two callers decide what a mismatch means:
``DeepSpeedPlugin.fill_match`` / ``deepspeed_config_process`` (Accelerate's API) collect them and raise one
``ValueError`` listing all (``must_match=False`` keeps the config's values without comparing), and
``strategies/deepspeed/auto_config.py``, when an engine is built, keeps the config's value and names every
mismatch in one warning.
"""
from __future__ import annotations

import base64
import json
import os
import warnings
from contextlib import contextmanager
from copy import deepcopy
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterator, Literal, Mapping, NoReturn, Optional, Union

from .env_fields import as_bool, as_choice, as_int, from_env

if TYPE_CHECKING:
    import deepspeed
    import torch

__all__ = ["HfDeepSpeedConfig", "DeepSpeedPlugin", "mark_selected"]

_OFFLOAD_DEVICES = ("none", "cpu", "nvme")


def config_node(config: dict, dotted: str) -> tuple[Optional[dict], str]:
    """``(the dict that holds the last part of the dotted key, that part)``; the dict is None when a part before the
    last is absent, None, or not a dict (the key cannot be there)."""
    *parents, key = dotted.split(".")
    node = config
    for part in parents:
        node = node.get(part) if isinstance(node, dict) else None
        if node is None:
            return None, key
    return (node if isinstance(node, dict) else None), key


@dataclass(frozen=True)
class ConfigMismatch:
    """A value the DeepSpeed config sets (not ``"auto"``) that differs from the one another source gives."""

    key: str  # the dotted key
    config_value: Any
    other_value: Any
    source: str  # where other_value came from ("kwargs", "Accelerator(gradient_accumulation_steps=...)", ...)


def fill_auto(config: dict, dotted: str, values: Mapping, *, source: str = "kwargs",
              compare: bool = True) -> Optional[ConfigMismatch]:
    """Fill or check the DeepSpeed ``config`` (in place) at the dotted key from ``values`` (dotted key -> value).

    - The key, or a dict on its way, is absent, or its value is None: nothing is done.
    - Its value is ``"auto"``: it becomes ``values[dotted]``; a ``ValueError`` naming the key and ``source`` when
      ``values`` has no such entry.
    - Another value: kept. With ``compare`` and an entry in ``values`` that differs, the difference is returned;
      the caller decides whether it is an error or a warning. Otherwise None is returned.
    """
    node, key = config_node(config, dotted)
    current = None if node is None else node.get(key)
    if current is None:
        return None
    if isinstance(current, str) and current == "auto":
        if dotted not in values:
            raise ValueError(f"`{dotted}` not found in {source}. Please specify `{dotted}` without `auto` (set to "
                             f"correct value) in the DeepSpeed config file or pass it in {source}.")
        node[key] = values[dotted]
        return None
    if compare and dotted in values and current != values[dotted]:
        return ConfigMismatch(dotted, current, values[dotted], source)
    return None


class HfDeepSpeedConfig:
    """A DeepSpeed config dict, read from a dict, a JSON file, a JSON string or base64-encoded JSON, with queries.

    ``get_value("zero_optimization.stage")`` reads a dotted key; ``is_zero3()``, ``is_offload()`` answer the usual
    questions.
    """

    def __init__(self, config_file_or_dict: Union[str, os.PathLike, dict]):
        if isinstance(config_file_or_dict, dict):
            config = deepcopy(config_file_or_dict)  # the caller may reuse theirs: "auto" values get replaced here
        elif isinstance(config_file_or_dict, (str, os.PathLike)) and os.path.exists(config_file_or_dict):
            with open(config_file_or_dict, encoding="utf-8") as f:
                config = json.load(f)
        else:
            try:
                try:
                    config = json.loads(config_file_or_dict)
                except json.JSONDecodeError:
                    config = json.loads(base64.urlsafe_b64decode(config_file_or_dict).decode("utf-8"))
            except (UnicodeDecodeError, AttributeError, ValueError, TypeError):
                raise ValueError("Expected the path of an existing DeepSpeed config file, a dict, a JSON string or "
                                 f"base64-encoded JSON; got {config_file_or_dict!r}.") from None
        if not isinstance(config, dict):
            raise ValueError(f"A DeepSpeed config must be a JSON object (a dict), got {type(config).__name__}.")
        self.config = config
        self.set_stage_and_offload()

    def set_stage_and_offload(self) -> None:
        self._stage = self.get_value("zero_optimization.stage", -1)
        self._offload = False
        if self.is_zero2() or self.is_zero3():
            devices = {self.get_value("zero_optimization.offload_optimizer.device"),
                       self.get_value("zero_optimization.offload_param.device")}
            self._offload = bool(devices & {"cpu", "nvme"})

    def find_config_node(self, ds_key_long: str) -> tuple[Optional[dict], str]:
        """``(the dict holding the last part of the dotted key, that part)``; ``(None, part)`` when absent."""
        return config_node(self.config, ds_key_long)

    def get_value(self, ds_key_long: str, default: Any = None) -> Any:
        """The value at the dotted key, or ``default`` when it is not set."""
        config, ds_key = self.find_config_node(ds_key_long)
        if config is None:
            return default
        return config.get(ds_key, default)

    def del_config_sub_tree(self, ds_key_long: str, must_exist: bool = False) -> None:
        """Remove the sub-tree at the dotted key (an error only if ``must_exist`` and it is absent)."""
        config, parent, node = self.config, None, None
        for node in ds_key_long.split("."):
            parent, config = config, config.get(node)
            if config is None:
                if must_exist:
                    raise ValueError(f"Can't find {ds_key_long} entry in the config: {self.config}")
                return
        if parent is not None:
            parent.pop(node)

    def is_true(self, ds_key_long: str) -> bool:
        """True only when the key is set to a true value."""
        value = self.get_value(ds_key_long)
        return False if value is None else bool(value)

    def is_false(self, ds_key_long: str) -> bool:
        """True only when the key is set to a false value."""
        value = self.get_value(ds_key_long)
        return False if value is None else not bool(value)

    def is_zero2(self) -> bool:
        return self._stage == 2

    def is_zero3(self) -> bool:
        return self._stage == 3

    def is_offload(self) -> bool:
        return self._offload


def _auto_or(parse):
    return lambda value: "auto" if str(value).strip().lower() == "auto" else parse(value)


def _positive_float(what):
    def parse(value) -> float:
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise ValueError(f"{what} must be a number or 'auto', got {value!r}.") from None
        if isinstance(value, bool) or number < 0:
            raise ValueError(f"{what} must be a number >= 0 or 'auto', got {value!r}.")
        return number

    return parse


# plugin field -> dotted key of the DeepSpeed config it fills
_PLUGIN_TO_CONFIG = {
    "gradient_accumulation_steps": "gradient_accumulation_steps",
    "gradient_clipping": "gradient_clipping",
    "zero_stage": "zero_optimization.stage",
    "offload_optimizer_device": "zero_optimization.offload_optimizer.device",
    "offload_param_device": "zero_optimization.offload_param.device",
    "offload_param_nvme_path": "zero_optimization.offload_param.nvme_path",
    "offload_optimizer_nvme_path": "zero_optimization.offload_optimizer.nvme_path",
    "zero3_save_16bit_model": "zero_optimization.stage3_gather_16bit_weights_on_model_save",
}



def _stage(what: str):
    """A ZeRO stage: 0-3, also spelled as DeepSpeed's stage names ("zero2", "ZeRO-3", "stage_1")."""
    number = as_int(what, choices=(0, 1, 2, 3))

    def parse(value):
        if not isinstance(value, str):
            return number(value)
        text = value.strip().lower().replace("-", "").replace("_", "")
        for prefix in ("zero", "stage"):
            text = text[len(prefix):] if text.startswith(prefix) else text
        try:
            return number(text)
        except ValueError:
            raise ValueError(f"{what} must be a ZeRO stage, 0, 1, 2 or 3 (or its name, such as 'zero2'), got "
                             f"{value!r}.") from None

    return parse

@dataclass
class DeepSpeedPlugin:
    """Options of DeepSpeed ZeRO; each has Accelerate's meaning.

    hf_ds_config: a DeepSpeed config (path, dict, JSON / base64 string or ``HfDeepSpeedConfig``); when given, the
        fields below only fill its ``"auto"`` values. Otherwise a config is built from them.
    gradient_accumulation_steps, gradient_clipping: numbers or "auto" (default "auto": taken from the Accelerator).
    zero_stage: 0, 1, 2 (default) or 3. offload_optimizer_device / offload_param_device: "none", "cpu", "nvme"
        (with their nvme paths). zero3_init_flag, zero3_save_16bit_model: ZeRO-3 only.
    transformer_moe_cls_names: comma-separated MoE layer class names (ZeRO-3 leaf modules).
    enable_msamp, msamp_opt_level ("O1" or "O2"): MS-AMP fp8.
    """

    hf_ds_config: Any = None
    gradient_accumulation_steps: int = None
    gradient_clipping: float = None
    zero_stage: int = None
    is_train_batch_min: bool = True
    offload_optimizer_device: str = None
    offload_param_device: str = None
    offload_optimizer_nvme_path: str = None
    offload_param_nvme_path: str = None
    zero3_init_flag: bool = None
    zero3_save_16bit_model: bool = None
    transformer_moe_cls_names: str = None
    enable_msamp: bool = None
    msamp_opt_level: Optional[Literal["O1", "O2"]] = None

    def _env(self, field, default, parse, setting=None):
        return from_env("DeepSpeedPlugin", field, getattr(self, field), default, parse,
                        setting=setting or f"deepspeed_{field}")

    def __post_init__(self):
        what = "DeepSpeedPlugin.{}".format
        self.gradient_accumulation_steps = self._env(
            "gradient_accumulation_steps", "auto", _auto_or(as_int(what("gradient_accumulation_steps"), minimum=1)),
            setting="gradient_accumulation_steps")
        self.gradient_clipping = self._env("gradient_clipping", "auto", _auto_or(_positive_float(
            what("gradient_clipping"))), setting="gradient_clipping")
        self.zero_stage = self._env("zero_stage", 2, _stage(what("zero_stage")))
        for device in ("offload_optimizer_device", "offload_param_device"):
            setattr(self, device, self._env(device, "none", as_choice(what(device), _OFFLOAD_DEVICES)))
        for path in ("offload_optimizer_nvme_path", "offload_param_nvme_path"):
            setattr(self, path, self._env(path, "none", str))
        self.zero3_save_16bit_model = self._env("zero3_save_16bit_model", False,
                                                as_bool(what("zero3_save_16bit_model")))
        self.enable_msamp = bool(self.enable_msamp) if self.enable_msamp is not None else (
            from_env("DeepSpeedPlugin", "enable_msamp", None, "", str, setting="fp8_backend").upper() == "MSAMP")
        self.msamp_opt_level = self._env("msamp_opt_level", "O1",
                                         as_choice(what("msamp_opt_level"), ("O1", "O2"), str.upper),
                                         setting="fp8_opt_level")
        self.hf_ds_config = self._env("hf_ds_config", "none", lambda value: value, setting="deepspeed_config_file")

        if isinstance(self.hf_ds_config, (dict, HfDeepSpeedConfig)) or (
                isinstance(self.hf_ds_config, (str, os.PathLike)) and str(self.hf_ds_config) != "none"):
            self._use_given_config()
        else:
            self.hf_ds_config = HfDeepSpeedConfig(self._built_config())

        self.deepspeed_config = self.hf_ds_config.config
        self.deepspeed_config["steps_per_print"] = float("inf")  # keep DeepSpeed from printing every step
        self.zero3_init_flag = self._env("zero3_init_flag", self.hf_ds_config.is_zero3(),
                                         as_bool(what("zero3_init_flag")), setting="deepspeed_zero3_init")
        if self.zero3_init_flag and not self.hf_ds_config.is_zero3():
            warnings.warn("zero3_init_flag only applies to ZeRO stage 3: it is set to False.")
            self.zero3_init_flag = False
        self._set_selected(False)  # the Accelerator selects its first plugin
        if self.enable_msamp and "msamp" not in self.deepspeed_config:
            if self.zero_stage == 3:
                raise NotImplementedError("MS-AMP does not support ZeRO stage 3: use stage 0, 1 or 2.")
            self.deepspeed_config["msamp"] = {"enabled": True, "opt_level": self.msamp_opt_level}

    def _use_given_config(self):
        if not isinstance(self.hf_ds_config, HfDeepSpeedConfig):
            self.hf_ds_config = HfDeepSpeedConfig(self.hf_ds_config)
        self._config_given = True  # its explicit values are the user's: a contradiction is an error
        config = self.hf_ds_config.config
        # absent, it follows the Accelerator (strategies/deepspeed/auto_config.py); 1 here, as the reference has it
        self._accumulation_given = "gradient_accumulation_steps" in config
        config.setdefault("gradient_accumulation_steps", 1)
        if "zero_optimization" not in config:
            raise ValueError("Please specify the ZeRO optimization config in the DeepSpeed config. It has no "
                             "'zero_optimization' section: add one (with its 'stage').")
        self._deepspeed_config_checks()
        values = {key: getattr(self, field) for field, key in _PLUGIN_TO_CONFIG.items()
                  if getattr(self, field) is not None}
        for key in values:
            self.fill_match(key, **values, must_match=False)
        self.hf_ds_config.set_stage_and_offload()
        for field, key in _PLUGIN_TO_CONFIG.items():  # the config file's values win over the defaults
            value = self.hf_ds_config.get_value(key)
            if value is not None and value != "auto":
                setattr(self, field, value)

    def _built_config(self) -> dict:
        config = {
            "train_batch_size": "auto",
            "train_micro_batch_size_per_gpu": "auto",
            "gradient_accumulation_steps": self.gradient_accumulation_steps,
            "zero_optimization": {
                "stage": self.zero_stage,
                "offload_optimizer": {
                    "device": self.offload_optimizer_device,
                    "nvme_path": self.offload_optimizer_nvme_path if self.offload_optimizer_device == "nvme" else None,
                },
                "offload_param": {
                    "device": self.offload_param_device,
                    "nvme_path": self.offload_param_nvme_path if self.offload_param_device == "nvme" else None,
                },
                "stage3_gather_16bit_weights_on_model_save": self.zero3_save_16bit_model,
            },
        }
        if self.gradient_clipping:
            config["gradient_clipping"] = self.gradient_clipping
        return config

    def fill_match(self, ds_key_long: str, mismatches: Optional[list[str]] = None, must_match: bool = True,
                   **kwargs: Any) -> None:
        """Fill an ``"auto"`` value at the dotted key from ``kwargs`` (``fill_auto``; an ``"auto"`` that ``kwargs``
        does not give raises). With ``must_match``, a set value that differs from ``kwargs``' is appended to
        ``mismatches`` as a line naming both; without, the config's value is kept unchecked."""
        mismatches = [] if mismatches is None else mismatches
        mismatch = fill_auto(self.hf_ds_config.config, ds_key_long, kwargs, compare=must_match)
        if mismatch is not None:
            mismatches.append(f"- ds {ds_key_long}={mismatch.config_value} vs arg {ds_key_long}="
                              f"{mismatch.other_value}")

    def is_auto(self, ds_key_long: str) -> bool:
        """Whether the dotted key is set to ``"auto"``."""
        return self.hf_ds_config.get_value(ds_key_long) == "auto"

    def get_value(self, ds_key_long: str, default: Any = None) -> Any:
        return self.hf_ds_config.get_value(ds_key_long, default)

    def deepspeed_config_process(self, prefix: str = "", mismatches: Optional[list[str]] = None,
                                 config: Optional[dict] = None, must_match: bool = True, **kwargs: Any) -> None:
        """Fill every ``"auto"`` value of the config from ``kwargs`` (``fill_match`` on each key). With
        ``must_match``, the set values that differ from ``kwargs`` are collected over the whole config and one
        ``ValueError`` lists them all; with ``must_match=False`` the config's values are kept."""
        mismatches = [] if mismatches is None else mismatches
        if config is None:
            config = self.deepspeed_config
        for key, value in config.items():
            if isinstance(value, dict):
                self.deepspeed_config_process(prefix=prefix + key + ".", mismatches=mismatches, config=value,
                                              must_match=must_match, **kwargs)
            else:
                self.fill_match(prefix + key, mismatches, must_match=must_match, **kwargs)
        if mismatches and prefix == "":
            raise ValueError("Please correct the following DeepSpeed config values that mismatch kwargs values:\n"
                             + "\n".join(mismatches) + "\nThe easiest method is to set these DeepSpeed config "
                             "values to 'auto'.")

    def set_mixed_precision(self, mixed_precision: str) -> None:
        """Enable fp16 or bf16 (bf16 for fp8 too) in the DeepSpeed config, refusing a contradiction."""
        ds_config = self.deepspeed_config
        kwargs = {"fp16.enabled": mixed_precision == "fp16", "bf16.enabled": mixed_precision in ("bf16", "fp8")}
        if mixed_precision == "fp16":
            ds_config.setdefault("fp16", {"enabled": True, "auto_cast": True})
        elif mixed_precision in ("bf16", "fp8"):
            ds_config.setdefault("bf16", {"enabled": True})
        if mixed_precision == "fp8" and self.enable_msamp:
            ds_config.setdefault("msamp", {"enabled": True, "opt_level": self.msamp_opt_level})
        if mixed_precision != "no":
            other = "bf16" if mixed_precision == "fp16" else "fp16"
            if str(ds_config.get(other, {}).get("enabled", "False")).lower() == "true":
                raise ValueError(f"`--mixed_precision` arg cannot be set to `{mixed_precision}` when `{other}` is set "
                                 f"in the DeepSpeed config file. mixed_precision={mixed_precision!r} contradicts the "
                                 f"config's enabled {other} section: choose one of them.")
        for dtype in ("fp16", "bf16"):
            ds_config.setdefault(dtype, {"enabled": False})
        self.fill_match("fp16.enabled", must_match=False, **kwargs)
        self.fill_match("bf16.enabled", must_match=False, **kwargs)

    def _config_for_construction(self) -> dict:
        """The config with the batch-size ``"auto"`` values replaced: what ``deepspeed.zero.Init`` and transformers'
        ``HfDeepSpeedConfig`` read before any loader is prepared (they only need the ZeRO and precision sections)."""
        config = deepcopy(self.deepspeed_config)
        for key in ("gradient_accumulation_steps", "train_micro_batch_size_per_gpu"):
            if config.get(key, "auto") == "auto":
                config[key] = 1
        if config.get("train_batch_size") == "auto":
            del config["train_batch_size"]
        for dtype in ("fp16", "bf16"):
            if isinstance(config.get(dtype), dict) and config[dtype].get("enabled") == "auto":
                config[dtype]["enabled"] = False
        return config

    def set_deepspeed_weakref(self) -> None:
        """Point transformers (when installed) at this config: its ``deepspeed_config()`` returns it, and with ZeRO-3
        and ``zero3_init_flag`` its ``from_pretrained`` builds models already partitioned (``deepspeed.zero.Init``).
        ZeRO-3 without ``zero3_init_flag`` is not announced: transformers would partition the models anyway."""
        if self._config_stage() == 3 and not self.zero3_init_flag:
            self._unset_deepspeed_weakref()
            return
        try:
            from transformers.integrations import HfDeepSpeedConfig as TransformersDeepSpeedConfig
            from transformers.integrations.deepspeed import unset_hf_deepspeed_config
        except ImportError:
            return
        unset_hf_deepspeed_config()
        self.dschf = TransformersDeepSpeedConfig(self._config_for_construction())

    def _config_stage(self):
        return (self.deepspeed_config.get("zero_optimization") or {}).get("stage", self.zero_stage)

    def _unset_deepspeed_weakref(self):
        self.__dict__.pop("dschf", None)
        try:
            from transformers.integrations.deepspeed import unset_hf_deepspeed_config
        except ImportError:
            return
        unset_hf_deepspeed_config()

    def is_zero3_init_enabled(self) -> bool:
        return self.zero3_init_flag

    @contextmanager
    def zero3_init_context_manager(self, enable: bool = False) -> Iterator[None]:
        """Run the block with ``zero3_init_flag`` set to ``enable`` (transformers then builds models partitioned or
        whole), and restore it after."""
        previous = self.zero3_init_flag
        if previous == enable:
            yield
            return
        self.zero3_init_flag = enable
        if enable:
            self.set_deepspeed_weakref()
        else:
            self._unset_deepspeed_weakref()
        try:
            yield
        finally:
            self.zero3_init_flag = previous
            if previous:
                self.set_deepspeed_weakref()
            else:
                self._unset_deepspeed_weakref()

    def zero3_init(self, **kwargs: Any) -> deepspeed.zero.Init:
        """A context in which models are built already partitioned over the ranks (``deepspeed.zero.Init`` with
        this config): a model too large for one process's memory never exists whole. ZeRO stage 3 only;
        ``kwargs`` go to ``deepspeed.zero.Init`` (``remote_device``, ``dtype`` ...)."""
        if not self.hf_ds_config.is_zero3():
            raise ValueError("zero3_init builds models partitioned for ZeRO stage 3, and this plugin's stage is "
                             f"{self.hf_ds_config.get_value('zero_optimization.stage')}: use zero_stage=3.")
        from ..core.imports import require_deepspeed

        deepspeed = require_deepspeed()
        return deepspeed.zero.Init(config_dict_or_path=self._config_for_construction(), **kwargs)

    def _deepspeed_config_checks(self):
        ignored = ["gradient_accumulation_steps", "gradient_clipping", "zero_stage", "offload_optimizer_device",
                   "offload_param_device", "offload_param_nvme_path", "offload_optimizer_nvme_path",
                   "zero3_save_16bit_model", "mixed_precision"]
        fields = from_env("DeepSpeedPlugin", "hf_ds_config", None, "", str, setting="config_ds_fields").split(",")
        if any(name in ignored for name in fields):
            raise ValueError(f"With a DeepSpeed config file, these config settings are ignored: {ignored}. Set them "
                             "in the DeepSpeed config file instead. If you are using an accelerate config file, remove "
                             "others config variables mentioned in the above specified list.")

    def set_moe_leaf_modules(self, model: torch.nn.Module) -> None:
        """Make the modules of the classes named in ``transformer_moe_cls_names`` ZeRO-3 leaf modules (gathered
        whole, as MoE layers route tokens to a subset of experts); an unknown name lists the model's classes."""
        if self.transformer_moe_cls_names is None:
            self.transformer_moe_cls_names = from_env("DeepSpeedPlugin", "transformer_moe_cls_names", None, None,
                                                      str, setting="deepspeed_moe_layer_cls_names")
        if not self.transformer_moe_cls_names:
            return
        wanted = [name.strip() for name in str(self.transformer_moe_cls_names).split(",") if name.strip()]
        present = {type(module).__name__: type(module) for module in model.modules()}
        missing = [name for name in wanted if name not in present]
        if missing:
            raise ValueError(f"transformer_moe_cls_names names {missing}, which the model does not have; its module "
                             f"classes are: {sorted(present)}.")
        from ..core.imports import require_deepspeed

        require_deepspeed()
        from deepspeed.utils import set_z3_leaf_modules

        set_z3_leaf_modules(model, [present[name] for name in wanted])

    def select(self, _from_accelerator_state: bool = False) -> None:
        """Make this the active DeepSpeed configuration (through ``AcceleratorState`` only)."""
        if not _from_accelerator_state:
            raise ValueError("A DeepSpeedPlugin is enabled through AcceleratorState().select_deepspeed_plugin(name).")
        self.set_deepspeed_weakref()
        self._set_selected(True)

    def _unselect(self):
        self._set_selected(False)

    def _set_selected(self, value: bool):
        self._selected = value

    @property
    def selected(self) -> bool:
        return self._selected

    @selected.setter
    def selected(self, value: bool) -> NoReturn:
        raise NotImplementedError("'selected' can only be set through AcceleratorState().select_deepspeed_plugin(key).")


def mark_selected(plugins: Mapping[Optional[str], DeepSpeedPlugin], name: Optional[str]) -> None:
    """Flag ``plugins[name]`` as the selected plugin and every other one as not (``DeepSpeedPlugin.selected``, which
    scripts written for Accelerate read)."""
    for plugin in plugins.values():
        plugin._unselect()
    plugins[name].select(_from_accelerator_state=True)
