"""The DeepSpeed group of a launch: its flags and a config file's ``deepspeed_config`` section turned into the
variables ``DeepSpeedPlugin`` reads, checked before anything starts. ``hasten launch`` (``commands/launch_plan.py``)
and a process started without it (``config/launch_file.py``, the section alone) both resolve it here.

The flags and the section use Accelerate's names (``--zero_stage``, ``zero_stage:``); a flag beats the section,
with a note when they differ. Each value reaches the script under the setting the plugin reads it from
(``zero_stage`` -> ``HASTEN_DEEPSPEED_ZERO_STAGE``, ``zero3_init_flag`` -> ``HASTEN_DEEPSPEED_ZERO3_INIT``,
``gradient_clipping`` -> ``HASTEN_GRADIENT_CLIPPING``). Every value is checked here.
"""
from __future__ import annotations

import argparse
import json
import os
from dataclasses import dataclass, field
from typing import Mapping, Optional

from ..core.env_vars import env_name, str_to_bool
from ..core.input_errors import CommandError

__all__ = ["ZERO_STAGES", "OFFLOAD_DEVICES", "MULTINODE_LAUNCHERS", "SECTION", "PLUGIN_SETTINGS", "CONFIG_FILE_FIELDS",
           "DeepSpeedSettings", "resolve_deepspeed", "config_fields"]

ZERO_STAGES = (0, 1, 2, 3)
OFFLOAD_DEVICES = ("none", "cpu", "nvme")
MULTINODE_LAUNCHERS = ("pdsh", "standard", "openmpi", "mvapich", "mpich", "nossh", "slurm")
SECTION = "deepspeed_config"


# ---------------------------------------------------------------------------------------------- parsing
def _stage(value) -> int:
    text = str(value).strip()
    if isinstance(value, bool) or not text.isdigit() or int(text) not in ZERO_STAGES:
        raise ValueError(f"the ZeRO stage is one of {', '.join(map(str, ZERO_STAGES))}")
    return int(text)


def _choice(what: str, choices: tuple):
    """A parser of one of ``choices`` (case-insensitive); the error says ``what`` and lists them."""
    def parse(value) -> str:
        text = str(value).strip().lower()
        if text not in choices:
            raise ValueError(f"{what} is one of {', '.join(choices)}")
        return text

    return parse


_device = _choice("an offload device", OFFLOAD_DEVICES)


def _boolean(value) -> bool:
    return value if isinstance(value, bool) else bool(str_to_bool(str(value)))


def _clipping(value):
    if str(value).strip().lower() == "auto":
        return "auto"
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = -1.0
    if isinstance(value, bool) or number < 0:
        raise ValueError("gradient clipping is a number >= 0 (or 'auto')")
    return number


def _steps(value) -> int:
    text = str(value).strip()
    if isinstance(value, bool) or not text.isdigit() or int(text) < 1:
        raise ValueError("gradient accumulation steps are a whole number >= 1")
    return int(text)


def _names(value) -> str:
    return ",".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)


_text = str
_launcher = _choice("the DeepSpeed multi-node launcher", MULTINODE_LAUNCHERS)


# flag dest / deepspeed_config key -> (parser, the setting DeepSpeedPlugin reads it from; None: the launcher's only)
PLUGIN_SETTINGS: dict = {
    "deepspeed_config_file": (_text, "deepspeed_config_file"),
    "zero_stage": (_stage, "deepspeed_zero_stage"),
    "offload_optimizer_device": (_device, "deepspeed_offload_optimizer_device"),
    "offload_param_device": (_device, "deepspeed_offload_param_device"),
    "offload_optimizer_nvme_path": (_text, "deepspeed_offload_optimizer_nvme_path"),
    "offload_param_nvme_path": (_text, "deepspeed_offload_param_nvme_path"),
    "gradient_accumulation_steps": (_steps, "gradient_accumulation_steps"),  # config key only (the flag is general)
    "gradient_clipping": (_clipping, "gradient_clipping"),
    "zero3_init_flag": (_boolean, "deepspeed_zero3_init"),
    "zero3_save_16bit_model": (_boolean, "deepspeed_zero3_save_16bit_model"),
    "deepspeed_moe_layer_cls_names": (_names, "deepspeed_moe_layer_cls_names"),
    "deepspeed_hostfile": (_text, None),
    "deepspeed_multinode_launcher": (_launcher, None),
    "deepspeed_exclusion_filter": (_text, None),
    "deepspeed_inclusion_filter": (_text, None),
}

# Settings a DeepSpeed config file must hold itself: the plugin refuses them from the hasten config file
# (it reads their names from HASTEN_CONFIG_DS_FIELDS), as Accelerate's does.
CONFIG_FILE_FIELDS = ("gradient_accumulation_steps", "gradient_clipping", "zero_stage", "offload_optimizer_device",
                      "offload_param_device", "offload_param_nvme_path", "offload_optimizer_nvme_path",
                      "zero3_save_16bit_model", "mixed_precision")


def _show(value) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def _sentence(error) -> str:
    text = str(error).strip()
    return text if text.endswith(".") else text + "."


# ---------------------------------------------------------------------------------------------- the settings
@dataclass
class DeepSpeedSettings:
    """The DeepSpeed group resolved: the values (flag > config section), the variables to export, notes."""

    enabled: bool  # --use_deepspeed, or distributed_type: DEEPSPEED in the config file
    values: dict = field(default_factory=dict)  # by flag / config key
    sources: dict = field(default_factory=dict)  # key -> "flag" | "config file"
    env: dict = field(default_factory=dict)
    notes: list = field(default_factory=list)


def _parse(key: str, raw, where: str):
    try:
        return PLUGIN_SETTINGS[key][0](raw)
    except ValueError as error:
        raise CommandError(f"{where}: {_sentence(error)}") from None


def _merge(args, section: Mapping, config_path: Optional[str], settings: DeepSpeedSettings) -> None:
    unknown = sorted(str(key) for key in section if key not in PLUGIN_SETTINGS)
    if unknown:
        raise CommandError(f"The config file {config_path}: {SECTION} has unknown keys {', '.join(unknown)}; the "
                           f"known keys are {', '.join(sorted(PLUGIN_SETTINGS))}.")
    for key in PLUGIN_SETTINGS:
        raw_flag = getattr(args, key, None) if key != "gradient_accumulation_steps" else None
        raw_file = section.get(key)
        from_file = None
        if raw_file is not None:
            from_file = _parse(key, raw_file, f"{SECTION}.{key}: {raw_file!r} in the config file {config_path}")
        if raw_flag is not None:
            value = _parse(key, raw_flag, f"--{key} {raw_flag!r}")
            settings.values[key], settings.sources[key] = value, "flag"
            if from_file is not None and from_file != value:
                settings.notes.append(f"hasten launch: --{key} {_show(value)} overrides {key}: {_show(from_file)} "
                                      f"from {config_path}")
        elif from_file is not None:
            settings.values[key], settings.sources[key] = from_file, "config file"


def _read_config_file(path: str, origin: str) -> dict:
    """The DeepSpeed config file's dict; a clear error when it is missing, not JSON or not usable."""
    if not os.path.isfile(path):
        raise CommandError(f"{origin}: the DeepSpeed config file {path!r} does not exist (looked from "
                           f"{os.getcwd()}). Pass the path of a JSON file.")
    try:
        with open(path, encoding="utf-8") as handle:
            config = json.load(handle)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise CommandError(f"{origin}: the DeepSpeed config file {path!r} is not JSON ({error}). DeepSpeed config "
                           "files are JSON objects, e.g. {\"zero_optimization\": {\"stage\": 2}}.") from None
    if not isinstance(config, dict):
        raise CommandError(f"{origin}: the DeepSpeed config file {path!r} holds a JSON {type(config).__name__}, "
                           "not an object.")
    if not isinstance(config.get("zero_optimization"), dict):
        raise CommandError(f"{origin}: the DeepSpeed config file {path!r} has no 'zero_optimization' section: add "
                           "one, with its 'stage' (e.g. {\"zero_optimization\": {\"stage\": 2}}).")
    return config


def _origin(settings: DeepSpeedSettings, key: str, config_path: Optional[str]) -> str:
    return f"--{key}" if settings.sources.get(key) == "flag" else f"{SECTION}.{key} in {config_path}"


def _check(settings: DeepSpeedSettings, config_path: Optional[str], section: Mapping, launcher: Mapping) -> None:
    """Offload paths, the DeepSpeed config file, fields it must hold, zero3_init_flag's stage, the filters."""
    values = settings.values
    ds_config = None
    if "deepspeed_config_file" in values:
        ds_config = _read_config_file(values["deepspeed_config_file"],
                                      _origin(settings, "deepspeed_config_file", config_path))
        moved = config_fields(section, launcher)
        refused = [name for name in moved if name in CONFIG_FILE_FIELDS]
        if refused:
            raise CommandError(
                f"The config file {config_path} sets {', '.join(refused)} while a DeepSpeed config file is used "
                f"({values['deepspeed_config_file']}): with a DeepSpeed config file these settings belong in it. Set "
                f"them in {values['deepspeed_config_file']} and remove them from {config_path}.")
    else:
        for part in ("optimizer", "param"):
            device, path = f"offload_{part}_device", f"offload_{part}_nvme_path"
            if values.get(device) == "nvme" and str(values.get(path) or "none").strip().lower() in ("", "none"):
                raise CommandError(f"{_origin(settings, device, config_path)} nvme needs the NVMe folder: pass "
                                   f"--{path} PATH (or set {path} in {SECTION}).")
    if values.get("zero3_init_flag"):
        stage = values.get("zero_stage", 2)
        if ds_config is not None:
            stage = ds_config["zero_optimization"].get("stage", stage)
        if stage != 3:
            settings.notes.append(f"hasten launch: warning: zero3_init_flag applies to ZeRO stage 3 only, and the "
                                  f"stage is {stage}: DeepSpeedPlugin sets it to false.")
    if "deepspeed_exclusion_filter" in values and "deepspeed_inclusion_filter" in values:
        raise CommandError("--deepspeed_exclusion_filter and --deepspeed_inclusion_filter cannot be used together: "
                           "DeepSpeed's runner takes one of them.")


def config_fields(section: Mapping, launcher: Mapping) -> list:
    """Accelerate's ``CONFIG_DS_FIELDS``: the keys the config file's ``deepspeed_config`` sets, and
    ``mixed_precision`` when the config file chose one (not the default ``no``)."""
    fields = [str(key) for key, value in section.items() if value is not None]
    if launcher.get("sources", {}).get("mixed_precision") == "config file" and \
            launcher.get("values", {}).get("mixed_precision") not in (None, "no"):
        fields.append("mixed_precision")
    return fields


def resolve_deepspeed(args: argparse.Namespace, config: Optional[Mapping], config_path: Optional[str], enabled: bool,
                      values: Mapping, sources: Mapping) -> DeepSpeedSettings:
    """The DeepSpeed group of a launch; raises ``CommandError`` for bad input. ``values`` / ``sources`` are the
    launcher's resolved settings (gradient accumulation and mixed precision meet the section's here)."""
    settings = DeepSpeedSettings(enabled=enabled)
    raw_section = (config or {}).get(SECTION) if enabled else None
    if raw_section is not None and not isinstance(raw_section, Mapping):
        raise CommandError(f"The config file {config_path}: {SECTION} must be a mapping of Accelerate's keys.")
    section = dict(raw_section or {})
    _merge(args, section, config_path, settings)
    _merge_accumulation(settings, values, sources, config_path)
    launcher = {"values": values, "sources": sources}
    _check(settings, config_path, section, launcher)
    if enabled:
        settings.env[env_name("use_deepspeed")] = "true"
        fields = config_fields(section, launcher)
        if fields:
            settings.env[env_name("config_ds_fields")] = ",".join(fields).lower()
    elif settings.values:
        given = ", ".join(f"--{key}" for key in settings.values)
        settings.notes.append(f"hasten launch: {given} given without --use_deepspeed: the values reach a "
                              "DeepSpeedPlugin built in the script, but DeepSpeed is not switched on; add "
                              "--use_deepspeed to train with it.")
    for key, value in settings.values.items():
        setting = PLUGIN_SETTINGS[key][1]
        if setting is not None:
            settings.env[env_name(setting)] = _show(value)
    return settings


def _merge_accumulation(settings: DeepSpeedSettings, values: Mapping, sources: Mapping,
                        config_path: Optional[str]) -> None:
    """``deepspeed_config.gradient_accumulation_steps`` against the launcher's own setting of the same name."""
    if "gradient_accumulation_steps" not in settings.values:
        return
    ours, theirs = settings.values["gradient_accumulation_steps"], values.get("gradient_accumulation_steps")
    if sources.get("gradient_accumulation_steps") == "flag":
        del settings.values["gradient_accumulation_steps"]  # the launcher exports the flag's value
        if theirs != ours:
            settings.notes.append(f"hasten launch: --gradient_accumulation_steps {theirs} overrides "
                                  f"{SECTION}.gradient_accumulation_steps: {ours} from {config_path}")
    elif sources.get("gradient_accumulation_steps") == "config file" and theirs != ours:
        raise CommandError(f"The config file {config_path} gives two gradient accumulation steps: "
                           f"gradient_accumulation_steps: {theirs} and {SECTION}.gradient_accumulation_steps: {ours}. "
                           "Keep one of them.")
