"""A config file named by HASTEN_CONFIG_FILE in a process `hasten launch` did not start (a pod's `python train.py`):
its backend, parallelism, fp8 and dynamo sections reach the plugins as the launcher would have exported them, with
the one precedence rule; the launcher's own workers do not reread it. Two processes with such a file train as one FSDP2 job:
tests/state/test_engine_variables.py."""
from __future__ import annotations

import os

import pytest
import yaml

from hasten import Accelerator, DeepSpeedPlugin, FullyShardedDataParallelPlugin
from hasten.utils import MegatronLMPlugin, TorchDynamoPlugin
from hasten.commands.launch import launch_command_parser
from hasten.commands.launch_plan import build_plan
from hasten.config.accelerator_settings import launcher_switches
from hasten.config.launch_file import config_file_env
from hasten.core.env_aliases import ConfigConflictError
from hasten.core.input_errors import CommandError
from hasten.core.planned import NotYetSupportedError
from hasten.parallel.resolve import resolve_parallelism_config

FSDP_FILE = {"distributed_type": "FSDP", "mixed_precision": "bf16", "num_processes": 2,
             "fsdp_config": {"fsdp_version": 2, "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
                             "fsdp_transformer_layer_cls_to_wrap": "Linear", "fsdp_reshard_after_forward": False,
                             "fsdp_state_dict_type": "SHARDED_STATE_DICT", "fsdp_cpu_ram_efficient_loading": True},
             "parallelism_config": {"parallelism_config_dp_shard_size": 2},
             "dynamo_config": {"dynamo_mode": "max-autotune", "dynamo_use_fullgraph": True}}
DEEPSPEED_FILE = {"distributed_type": "DEEPSPEED", "mixed_precision": "no", "num_processes": 2,
                  "deepspeed_config": {"zero_stage": 3, "offload_optimizer_device": "cpu",
                                       "gradient_accumulation_steps": 4, "zero3_init_flag": False}}
MEGATRON_FILE = {"distributed_type": "MEGATRON_LM", "num_processes": 2,
                 "megatron_lm_config": {"megatron_lm_tp_degree": 2, "megatron_lm_num_micro_batches": 3}}
FP8_FILE = {"distributed_type": "MULTI_CPU", "mixed_precision": "fp8", "num_processes": 2,
            "fp8_config": {"backend": "AO", "fp8_pad_inner_dim": True}}


def _named(monkeypatch, tmp_path, settings: dict, name: str = "config.yaml") -> str:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(settings))
    monkeypatch.setenv("HASTEN_CONFIG_FILE", str(path))
    return str(path)


@pytest.mark.parametrize("settings", [FSDP_FILE, DEEPSPEED_FILE, MEGATRON_FILE, FP8_FILE],
                         ids=["fsdp", "deepspeed", "megatron", "fp8"])
def test_a_process_without_the_launcher_reads_what_the_launcher_exports(tmp_path, settings):
    """One conversion: every variable the file stands for is in the launch plan's environment, with its value."""
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(settings))
    script = tmp_path / "train.py"
    script.write_text("")
    args = launch_command_parser().parse_args([str(script)])
    plan = build_plan(args, settings, str(path), environ={}, cpu_count=8, count_accelerators=lambda: 0,
                      find_free_port=lambda: 41234, is_port_in_use=lambda port, host: False)
    variables, _ = config_file_env(settings, str(path))
    assert variables and {name: plan.env.get(name) for name in variables} == variables
    assert plan.env["HASTEN_CONFIG_FILE_APPLIED"] == "true"


def test_the_sections_reach_the_plugins_and_the_accelerator(monkeypatch, tmp_path):
    _named(monkeypatch, tmp_path, FSDP_FILE)
    plugin = FullyShardedDataParallelPlugin()
    assert plugin.fsdp_version == 2 and plugin.transformer_cls_names_to_wrap == ["Linear"]
    assert plugin.reshard_after_forward is False and plugin.cpu_ram_efficient_loading is True
    assert plugin.state_dict_type.name == "SHARDED_STATE_DICT"
    assert FullyShardedDataParallelPlugin(fsdp_version=2).fsdp_version == 2  # an argument that agrees
    assert launcher_switches() == {"use_fsdp"}
    assert resolve_parallelism_config().dp_shard_size == 2
    dynamo = TorchDynamoPlugin()
    assert (dynamo.mode, dynamo.fullgraph, dynamo.dynamic) == ("max-autotune", True, None)
    monkeypatch.delenv("HASTEN_CONFIG_FILE")
    _named(monkeypatch, tmp_path, {**FSDP_FILE, "parallelism_config": {}}, "single.yaml")
    accelerator = Accelerator()  # one process: FSDP2 over a world of one, as `hasten launch -n 1` would give
    assert accelerator.distributed_type.value == "FSDP" and accelerator.mixed_precision == "bf16"
    assert accelerator.state.fsdp_plugin.fsdp_version == 2

    _named(monkeypatch, tmp_path, DEEPSPEED_FILE, "deepspeed.yaml")
    plugin = DeepSpeedPlugin()
    assert (plugin.zero_stage, plugin.offload_optimizer_device, plugin.gradient_accumulation_steps) == (3, "cpu", 4)
    assert launcher_switches() == {"use_deepspeed"}

    _named(monkeypatch, tmp_path, MEGATRON_FILE, "megatron.yaml")
    plugin = MegatronLMPlugin()
    assert (plugin.tp_degree, plugin.num_micro_batches) == (2, 3)


def test_the_launchers_workers_and_the_environment_come_first(monkeypatch, tmp_path):
    path = _named(monkeypatch, tmp_path, FSDP_FILE)
    monkeypatch.setenv("HASTEN_CONFIG_FILE_APPLIED", "true")  # hasten launch exported the file (and its flags)
    monkeypatch.setenv("HASTEN_USE_FSDP", "true")
    monkeypatch.setenv("HASTEN_FSDP_VERSION", "1")  # `--fsdp_version 1` beat the file in the launcher
    assert FullyShardedDataParallelPlugin().fsdp_version == 1
    monkeypatch.delenv("HASTEN_CONFIG_FILE_APPLIED")
    with pytest.raises(ConfigConflictError, match=f"HASTEN_FSDP_VERSION.*{path}"):
        FullyShardedDataParallelPlugin()  # a pod's variable and its file disagree: named, not guessed
    monkeypatch.setenv("FSDP_VERSION", "2")  # Accelerate's name for the same setting, agreeing with the file
    monkeypatch.delenv("HASTEN_FSDP_VERSION")
    assert FullyShardedDataParallelPlugin().fsdp_version == 2
    with pytest.raises(ConfigConflictError, match="dp_shard_size"):
        monkeypatch.setenv("PARALLELISM_CONFIG_DP_SHARD_SIZE", "1")
        resolve_parallelism_config()


def test_a_bad_file_is_refused_before_anything_and_an_edit_is_read(monkeypatch, tmp_path):
    path = _named(monkeypatch, tmp_path, {**FSDP_FILE, "fsdp_config": {"fsdp_verison": 2}})
    with pytest.raises(CommandError, match="fsdp_verison"):
        Accelerator()
    with open(path, "w") as handle:  # fixed in place: the next read sees the new version of the file
        yaml.safe_dump({**FSDP_FILE, "fsdp_config": {"fsdp_version": 1}, "parallelism_config": {}}, handle)
    os.utime(path, ns=(1, 1))
    assert FullyShardedDataParallelPlugin().fsdp_version == 1
    _named(monkeypatch, tmp_path, {**FP8_FILE, "fp8_config": {"backend": "TE"}}, "te.yaml")
    with pytest.raises(NotYetSupportedError, match="TE"):
        Accelerator()
    _named(monkeypatch, tmp_path, {**DEEPSPEED_FILE, "gradient_accumulation_steps": 2}, "two_steps.yaml")
    with pytest.raises(CommandError, match="two gradient accumulation steps"):
        DeepSpeedPlugin()
