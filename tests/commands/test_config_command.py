"""`hasten config default` and `hasten config update`, and config files written by Accelerate itself (YAML and JSON)
read by `hasten config update`, `load_config_from_file` and `hasten launch`."""
import json

import pytest
import yaml

from hasten.commands import cli
from launch_fixtures import no_launch, plan_for, script  # noqa: F401 - fixtures


def test_config_default_writes_the_precision_asked_and_never_replaces_a_file(tmp_path, capsys):
    target = tmp_path / "d.yaml"
    assert cli.main(["config", "default", "--config_file", str(target), "--mixed_precision", "fp16"]) == 0
    written = yaml.safe_load(target.read_text())
    assert written["mixed_precision"] == "fp16" and written["compute_environment"] == "LOCAL_MACHINE"
    assert cli.main(["config", "default", "--config_file", str(target), "--mixed_precision", "bf16"]) == 1
    assert "already exists" in capsys.readouterr().err and yaml.safe_load(target.read_text()) == written
    assert cli.main(["config", "default", "--config_file", str(tmp_path / "x.yaml"), "--mixed_precision", "fp32"]) == 2
    assert "mixed_precision" in capsys.readouterr().err and not (tmp_path / "x.yaml").exists()


def test_config_update_adds_todays_keys_and_keeps_the_users_values(tmp_path):
    path = tmp_path / "old.yaml"
    path.write_text("distributed_type: FSDP\nnum_processes: 4\ngpu_ids: '0,1,2,3'\nfp16: true\n"
                    "fsdp_config:\n  fsdp_version: 2\n  fsdp_offload_params: true\n")
    assert cli.main(["config", "update", "--config_file", str(path)]) == 0
    written = yaml.safe_load(path.read_text())
    assert (written["num_processes"], written["gpu_ids"], written["mixed_precision"]) == (4, "0,1,2,3", "fp16")
    assert written["fsdp_config"] == {"fsdp_version": 2, "fsdp_offload_params": True}
    for key in ("compute_environment", "num_machines", "machine_rank", "rdzv_backend", "use_cpu", "debug",
                "enable_cpu_affinity", "main_training_function"):
        assert key in written, key  # the keys an old file lacked are there now, with their defaults
    assert "fp16" not in written


def _accelerate_config(**fields):
    from accelerate.commands.config.config_args import ClusterConfig
    from accelerate.utils import ComputeEnvironment, DistributedType

    defaults = dict(compute_environment=ComputeEnvironment.LOCAL_MACHINE, mixed_precision="bf16", use_cpu=False,
                    debug=False)
    defaults.update(fields)
    defaults["distributed_type"] = DistributedType(defaults["distributed_type"])
    return ClusterConfig(**defaults)


ACCELERATE_FSDP = dict(
    distributed_type="FSDP", num_processes=4, dynamo_config={"dynamo_backend": "INDUCTOR"},
    fsdp_config={"fsdp_version": 2, "fsdp_reshard_after_forward": True, "fsdp_offload_params": False,
                 "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP", "fsdp_transformer_layer_cls_to_wrap": "GPT2Block",
                 "fsdp_state_dict_type": "SHARDED_STATE_DICT", "fsdp_cpu_ram_efficient_loading": True,
                 "fsdp_activation_checkpointing": False},
    parallelism_config={"parallelism_config_dp_replicate_size": 1, "parallelism_config_dp_shard_size": 2,
                        "parallelism_config_tp_size": 2, "parallelism_config_cp_size": 1})
ACCELERATE_DEEPSPEED = dict(
    distributed_type="DEEPSPEED", num_processes=2, deepspeed_config={
        "zero_stage": 3, "offload_optimizer_device": "cpu", "offload_param_device": "none",
        "gradient_accumulation_steps": 2, "zero3_init_flag": False, "zero3_save_16bit_model": True})


@pytest.mark.parametrize("suffix", ["yaml", "json"])
@pytest.mark.parametrize("fields, expected_env", [
    (ACCELERATE_FSDP, {"HASTEN_USE_FSDP": "true", "HASTEN_FSDP_TRANSFORMER_CLS_TO_WRAP": "GPT2Block",
                       "HASTEN_PARALLELISM_CONFIG_TP_SIZE": "2", "HASTEN_DYNAMO_BACKEND": "INDUCTOR"}),
    (ACCELERATE_DEEPSPEED, {"HASTEN_USE_DEEPSPEED": "true", "HASTEN_DEEPSPEED_ZERO_STAGE": "3",
                            "HASTEN_DEEPSPEED_ZERO3_SAVE_16BIT_MODEL": "true"}),
], ids=["fsdp", "deepspeed"])
def test_files_written_by_accelerate_are_read_updated_and_launched(tmp_path, script, no_launch,  # noqa: F811
                                                                  suffix, fields, expected_env):
    from hasten.commands.config.config_args import ClusterConfig, load_config_from_file
    from hasten.commands.launch import load_launch_config

    path = tmp_path / f"accelerate.{suffix}"
    theirs = _accelerate_config(**fields)
    (theirs.to_json_file if suffix == "json" else theirs.to_yaml_file)(str(path))
    ours = load_config_from_file(str(path))
    assert isinstance(ours, ClusterConfig) and ours.distributed_type.value == fields["distributed_type"]
    section = "fsdp_config" if "fsdp_config" in fields else "deepspeed_config"
    assert getattr(ours, section) == fields[section] and ours.mixed_precision == "bf16"

    assert cli.main(["config", "update", "--config_file", str(path)]) == 0
    text = path.read_text()
    updated = json.loads(text) if suffix == "json" else yaml.safe_load(text)
    assert updated[section] == fields[section] and updated["num_processes"] == fields["num_processes"]

    config_path, settings = load_launch_config(str(path))
    env = plan_for(["--config_file", config_path, script], settings, config_path).env
    assert {name: env.get(name) for name in expected_env} == expected_env


def test_accelerates_basic_file_is_read_as_is(tmp_path):
    from accelerate.utils import write_basic_config as accelerate_write_basic_config

    from hasten.commands.config.config_args import load_config_from_file

    path = accelerate_write_basic_config("fp16", str(tmp_path / "basic.yaml"))
    config = load_config_from_file(str(path))
    assert config.mixed_precision == "fp16" and config.num_machines == 1


def test_a_sagemaker_config_without_num_processes_loads(tmp_path):
    """A local config of distributed_type NO gets num_processes=1; a SageMaker config has no such key, and
    loading one must not add it (it would then be refused as a key SageMakerConfig does not take)."""
    from hasten.commands.config.config_args import SageMakerConfig, load_config_from_file

    path = tmp_path / "sagemaker.yaml"
    path.write_text(yaml.safe_dump({"compute_environment": "AMAZON_SAGEMAKER", "distributed_type": "NO",
                                    "mixed_precision": "fp16", "use_cpu": False, "debug": False,
                                    "ec2_instance_type": "MY_TYPE", "iam_role_name": "MY_ROLE"}))
    config = load_config_from_file(str(path))
    assert isinstance(config, SageMakerConfig) and config.ec2_instance_type == "MY_TYPE"
    assert not hasattr(config, "num_processes")
