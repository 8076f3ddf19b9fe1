"""Accelerate's ``ACCELERATE_*`` environment variables are aliases of hasten's ``HASTEN_*`` ones, everywhere."""
from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest
import torch
import torch.nn as nn

from hasten import Accelerator
from hasten.big_modeling import init_empty_weights
from hasten.config.dynamo import TorchDynamoPlugin
from hasten.config.enums import DynamoBackend
from hasten.core.env_aliases import (
    ConfigConflictError,
    EnvAliasConflictError,
    get_flag_setting,
    get_setting,
    read_setting,
    setting_is_set,
    setting_variables,
)
from hasten.config.resolution import ConfigConflictError as ResolutionConflictError
from hasten.config.resolution import resolve
from hasten.logging import get_logger
from hasten.state import AcceleratorState, GradientState, PartialState
from hasten.utils.environment import is_debug_mode

SRC = Path(__file__).resolve().parents[2] / "src" / "hasten"


def reset():
    AcceleratorState._reset_state(True)
    GradientState._reset_state()


def test_setting_variables_accepts_a_setting_or_either_variable():
    expected = ("HASTEN_MIXED_PRECISION", "ACCELERATE_MIXED_PRECISION")
    assert setting_variables("mixed_precision") == expected
    assert setting_variables("HASTEN_MIXED_PRECISION") == expected
    assert setting_variables("ACCELERATE_MIXED_PRECISION") == expected
    with pytest.raises(ValueError):
        setting_variables("")


def test_accelerates_bare_plugin_families_are_aliases_too(monkeypatch):
    assert setting_variables("fsdp_sharding_strategy") == (
        "HASTEN_FSDP_SHARDING_STRATEGY", "ACCELERATE_FSDP_SHARDING_STRATEGY", "FSDP_SHARDING_STRATEGY")
    assert setting_variables("megatron_lm_tp_degree")[-1] == "MEGATRON_LM_TP_DEGREE"
    assert setting_variables("parallelism_config_tp_size")[-1] == "PARALLELISM_CONFIG_TP_SIZE"
    assert len(setting_variables("use_fsdp")) == 2  # ACCELERATE_USE_FSDP is the Accelerate name there
    monkeypatch.setenv("FSDP_SHARDING_STRATEGY", "FULL_SHARD")  # what `accelerate launch` exports
    assert read_setting("fsdp_sharding_strategy") == ("FULL_SHARD", "FSDP_SHARDING_STRATEGY")
    monkeypatch.setenv("HASTEN_FSDP_SHARDING_STRATEGY", "SHARD_GRAD_OP")
    with pytest.raises(EnvAliasConflictError, match="HASTEN_FSDP_SHARDING_STRATEGY='SHARD_GRAD_OP' but "
                                                    "FSDP_SHARDING_STRATEGY='FULL_SHARD'"):
        read_setting("fsdp_sharding_strategy")


def test_either_variable_alone_is_read(monkeypatch):
    assert read_setting("mixed_precision") == (None, None)
    assert get_setting("mixed_precision", "no") == "no"
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "fp16")
    assert read_setting("mixed_precision") == ("fp16", "ACCELERATE_MIXED_PRECISION")
    assert setting_is_set("mixed_precision")
    monkeypatch.delenv("ACCELERATE_MIXED_PRECISION")
    monkeypatch.setenv("HASTEN_MIXED_PRECISION", "bf16")
    assert read_setting("mixed_precision") == ("bf16", "HASTEN_MIXED_PRECISION")


def test_empty_values_count_as_unset(monkeypatch):
    monkeypatch.setenv("HASTEN_MIXED_PRECISION", "")
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "  ")
    assert read_setting("mixed_precision") == (None, None)
    assert not setting_is_set("mixed_precision")
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "fp16")
    assert get_setting("mixed_precision") == "fp16"  # an empty HASTEN_ value does not contradict it


def test_equal_values_both_ways_are_fine(monkeypatch):
    monkeypatch.setenv("HASTEN_USE_CPU", "1")
    monkeypatch.setenv("ACCELERATE_USE_CPU", "true")
    assert get_flag_setting("use_cpu") is True  # 1 and true agree once parsed
    monkeypatch.setenv("HASTEN_MIXED_PRECISION", "bf16")
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "BF16")
    value, _ = resolve("mixed_precision", parse=lambda v: v.lower())
    assert value == "bf16"


def test_different_values_are_an_error_naming_both(monkeypatch):
    monkeypatch.setenv("HASTEN_MIXED_PRECISION", "bf16")
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "fp16")
    with pytest.raises(EnvAliasConflictError) as caught:
        read_setting("mixed_precision")
    message = str(caught.value)
    assert "HASTEN_MIXED_PRECISION='bf16'" in message and "ACCELERATE_MIXED_PRECISION='fp16'" in message
    assert isinstance(caught.value, ConfigConflictError) and ConfigConflictError is ResolutionConflictError
    monkeypatch.setenv("HASTEN_USE_CPU", "yes")
    monkeypatch.setenv("ACCELERATE_USE_CPU", "0")
    with pytest.raises(EnvAliasConflictError, match="HASTEN_USE_CPU='yes'.*ACCELERATE_USE_CPU='0'"):
        get_flag_setting("use_cpu")


def test_a_bad_value_names_the_variable_that_holds_it(monkeypatch):
    monkeypatch.setenv("ACCELERATE_USE_CPU", "maybe")
    with pytest.raises(ValueError, match="ACCELERATE_USE_CPU"):
        PartialState()


def test_mixed_precision_and_accumulation_reach_the_accelerator(monkeypatch):
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "bf16")
    monkeypatch.setenv("ACCELERATE_GRADIENT_ACCUMULATION_STEPS", "3")
    accelerator = Accelerator()
    assert accelerator.mixed_precision == "bf16" and accelerator.gradient_accumulation_steps == 3
    reset()
    with pytest.raises(ConfigConflictError, match="ACCELERATE_MIXED_PRECISION"):
        Accelerator(mixed_precision="fp16")
    reset()
    monkeypatch.setenv("HASTEN_MIXED_PRECISION", "fp16")
    with pytest.raises(EnvAliasConflictError, match="HASTEN_MIXED_PRECISION='fp16'"):
        Accelerator()


def test_accelerator_state_reads_the_alias(monkeypatch):
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "fp16")
    assert AcceleratorState().mixed_precision == "fp16"


def test_use_cpu_and_debug_mode(monkeypatch):
    monkeypatch.setenv("ACCELERATE_USE_CPU", "true")
    monkeypatch.setenv("ACCELERATE_DEBUG_MODE", "1")
    state = PartialState()
    assert state._cpu and state.device.type == "cpu" and state.debug and is_debug_mode()


def test_dynamo_settings(monkeypatch):
    monkeypatch.setenv("ACCELERATE_DYNAMO_BACKEND", "INDUCTOR")
    monkeypatch.setenv("ACCELERATE_DYNAMO_MODE", "max-autotune")
    monkeypatch.setenv("ACCELERATE_DYNAMO_USE_FULLGRAPH", "True")
    monkeypatch.setenv("ACCELERATE_DYNAMO_USE_DYNAMIC", "True")
    monkeypatch.setenv("ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION", "True")
    plugin = TorchDynamoPlugin()
    assert plugin.backend == DynamoBackend.INDUCTOR and plugin.mode == "max-autotune"
    assert plugin.fullgraph and plugin.dynamic and plugin.use_regional_compilation
    with pytest.raises(ConfigConflictError, match="ACCELERATE_DYNAMO_BACKEND"):
        TorchDynamoPlugin(backend="eager")


def test_init_include_buffers(monkeypatch):
    monkeypatch.setenv("ACCELERATE_INIT_INCLUDE_BUFFERS", "1")
    with init_empty_weights():
        norm = nn.BatchNorm1d(2)
    assert norm.running_mean.device.type == "meta"
    monkeypatch.setenv("HASTEN_INIT_INCLUDE_BUFFERS", "0")
    with pytest.raises(EnvAliasConflictError):
        with init_empty_weights():
            pass


def test_log_level(monkeypatch):
    monkeypatch.setenv("ACCELERATE_LOG_LEVEL", "debug")
    root_level = logging.getLogger().level
    try:
        assert get_logger("hasten.test_env_aliases").logger.level == logging.DEBUG
    finally:
        logging.getLogger().setLevel(root_level)


def test_config_file_and_config_home(monkeypatch, tmp_path):
    from hasten.config.config_file import default_config_path

    path = tmp_path / "cfg.yaml"
    path.write_text("compute_environment: LOCAL_MACHINE\ndistributed_type: NO\nmixed_precision: bf16\n"
                    "num_processes: 1\n")
    monkeypatch.setenv("ACCELERATE_CONFIG_FILE", str(path))
    assert Accelerator().mixed_precision == "bf16"
    monkeypatch.setenv("ACCELERATE_CONFIG_HOME", str(tmp_path))
    assert default_config_path() == str(tmp_path / "default_config.yaml")


# Reads of the environment that name a HASTEN_ variable (directly or through env_name) instead of going through
# hasten.config.env_aliases. Writes (building a child's environment) and listings are not reads.
_DIRECT_READ = re.compile(
    r"(environ\.get\(|environ\[|getenv\(|parse_flag_from_env\(|parse_choice_from_env\(|get_int_from_env\()"
    r"[^\n]*(HASTEN_|env_name\(|CONFIG_HOME_ENV)"
    r"|(HASTEN_\w*[\"']|env_name\([^)]*\)|CONFIG_HOME_ENV)\s+(not\s+)?in\s+os\.environ"
)

_WRITE = re.compile(r"environ\[[^\]]+\]\s*=[^=]")
# hasten's own switches with no Accelerate counterpart (an ACCELERATE_ alias would mean nothing): read directly
_HASTEN_ONLY = ("HASTEN_AS_ACCELERATE",)


def test_every_hasten_variable_is_read_through_the_alias_mechanism():
    offenders = []
    for path in sorted(SRC.rglob("*.py")):
        if path.name == "env_aliases.py":
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if _DIRECT_READ.search(line) and not _WRITE.search(line) and not line.lstrip().startswith("#") \
                    and not any(name in line for name in _HASTEN_ONLY):
                offenders.append(f"{path.relative_to(SRC)}:{number}: {line.strip()}")
    assert not offenders, ("read these through hasten.config.env_aliases (get_setting / get_flag_setting / "
                           "read_setting) so that ACCELERATE_* aliases work:\n" + "\n".join(offenders))


def test_accelerate_torch_device_chooses_the_device(monkeypatch):
    from hasten.state import PartialState

    monkeypatch.setenv("ACCELERATE_TORCH_DEVICE", "cpu")
    assert PartialState().device == torch.device("cpu")


def test_an_indexed_cpu_device_is_kept_as_named_with_a_warning(monkeypatch):
    from hasten import Accelerator

    monkeypatch.setenv("ACCELERATE_TORCH_DEVICE", "cpu:3")
    with pytest.warns(UserWarning, match="whatever the index"):
        accelerator = Accelerator()
    assert str(accelerator.device) == "cpu:3"
    model = accelerator.prepare(torch.nn.Linear(2, 2))  # torch places it on the one CPU
    assert next(model.parameters()).device.type == "cpu"


@pytest.mark.parametrize("value", ["not-a-device", "cuda:0"])
def test_a_torch_device_that_cannot_be_used_is_refused(monkeypatch, value):
    from hasten.state import PartialState

    if value.startswith("cuda") and torch.cuda.is_available():
        pytest.skip("this machine has a GPU: 'cuda:0' is usable here")
    monkeypatch.setenv("HASTEN_TORCH_DEVICE", value)
    with pytest.raises(ValueError, match="TORCH_DEVICE"):
        PartialState()
    assert not PartialState._shared_state  # nothing half-initialised is left behind
