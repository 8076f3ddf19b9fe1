import json
import logging
import re
from pathlib import Path

import pytest
import torch
import yaml

from hasten.config.config_file import default_config_path, load_config_file, normalize_config
from hasten.utils import default_config_file, write_basic_config

DOCS = Path(__file__).resolve().parents[2] / "docs" / "config-file.md"


def write(path, text):
    path.write_text(text)
    return path


# ----------------------------------------------------------------------------- where the default file lives
def test_default_path_honours_hasten_config_home(monkeypatch, tmp_path):
    monkeypatch.setenv("HASTEN_CONFIG_HOME", str(tmp_path / "cfg"))
    assert default_config_path() == str(tmp_path / "cfg" / "default_config.yaml")


def test_default_path_uses_xdg_cache_home(monkeypatch, tmp_path):
    monkeypatch.delenv("HASTEN_CONFIG_HOME", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert default_config_path() == str(tmp_path / "cache" / "hasten" / "default_config.yaml")


def test_default_path_falls_back_to_home_cache(monkeypatch, tmp_path):
    monkeypatch.delenv("HASTEN_CONFIG_HOME", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert default_config_path() == str(tmp_path / ".cache" / "hasten" / "default_config.yaml")


def test_module_attribute_for_compatibility():
    assert isinstance(default_config_file, str) and default_config_file.endswith("default_config.yaml")


# ----------------------------------------------------------------------------- write_basic_config
def expected_devices():
    if torch.cuda.is_available():
        count = torch.cuda.device_count()
        return ("MULTI_GPU" if count > 1 else "NO"), count, False
    return "NO", 1, True


def test_writes_a_config_for_this_machine(tmp_path):
    path = write_basic_config(save_location=tmp_path / "a" / "config.yaml")
    assert Path(path) == tmp_path / "a" / "config.yaml"
    written = yaml.safe_load(Path(path).read_text())
    distributed_type, num_processes, use_cpu = expected_devices()
    assert written["compute_environment"] == "LOCAL_MACHINE"
    assert written["distributed_type"] == distributed_type
    assert written["num_processes"] == num_processes and written["use_cpu"] is use_cpu
    assert written["mixed_precision"] == "no" and written["debug"] is False
    assert load_config_file(path)["mixed_precision"] == "no"


@pytest.mark.parametrize("count, distributed_type", [(1, "NO"), (4, "MULTI_GPU")])
def test_gpus_are_counted(tmp_path, monkeypatch, count, distributed_type):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    written = yaml.safe_load(write_basic_config("bf16", tmp_path / "c.yaml").read_text())
    assert (written["distributed_type"], written["num_processes"]) == (distributed_type, count)
    assert written["use_cpu"] is False
    assert written["mixed_precision"] == "bf16"


@pytest.mark.parametrize("given, stored", [("fp16", "fp16"), ("BF16", "bf16"), ("fp8", "fp8"), ("NO", "no")])
def test_mixed_precision_is_normalised(tmp_path, given, stored):
    path = write_basic_config(given, tmp_path / "c.yaml")
    assert yaml.safe_load(path.read_text())["mixed_precision"] == stored


@pytest.mark.parametrize("bad", ["fp32", "int8", ""])
def test_bad_mixed_precision_writes_nothing(tmp_path, bad):
    with pytest.raises(ValueError, match="mixed_precision"):
        write_basic_config(bad, tmp_path / "sub" / "c.yaml")
    assert not (tmp_path / "sub").exists()


def test_existing_file_is_never_overwritten(tmp_path, caplog):
    path = write(tmp_path / "c.yaml", "mixed_precision: fp16\n# my edits\n")
    with caplog.at_level(logging.WARNING):
        assert write_basic_config("bf16", path) is False
    assert path.read_text() == "mixed_precision: fp16\n# my edits\n"
    assert "already exists" in caplog.text and "delete" in caplog.text


def test_default_location_is_computed_when_called(tmp_path, monkeypatch):
    monkeypatch.setenv("HASTEN_CONFIG_HOME", str(tmp_path / "home"))
    path = write_basic_config()
    assert Path(path) == tmp_path / "home" / "default_config.yaml" and Path(path).is_file()


def test_same_file_as_accelerate(tmp_path):
    accelerate_utils = pytest.importorskip("accelerate.utils")
    ours = yaml.safe_load(write_basic_config("bf16", tmp_path / "ours.yaml").read_text())
    theirs_path = accelerate_utils.write_basic_config("bf16", str(tmp_path / "theirs.yaml"))
    theirs = json.loads(Path(theirs_path).read_text())
    assert ours == theirs
    from accelerate.commands.config.config_args import load_config_from_file

    assert load_config_from_file(str(tmp_path / "ours.yaml")).mixed_precision == "bf16"  # Accelerate reads ours


# ----------------------------------------------------------------------------- load_config_file
ACCELERATE_STYLE = """\
compute_environment: LOCAL_MACHINE
debug: false
distributed_type: MULTI_GPU
downcast_bf16: 'no'
enable_cpu_affinity: false
gpu_ids: all
machine_rank: 0
main_training_function: main
mixed_precision: bf16
num_machines: 1
num_processes: 8
rdzv_backend: static
same_network: true
tpu_env: []
tpu_use_cluster: false
tpu_use_sudo: false
use_cpu: false
"""


def test_reads_an_accelerate_file(tmp_path):
    config = load_config_file(write(tmp_path / "default_config.yaml", ACCELERATE_STYLE))
    assert config["distributed_type"] == "MULTI_GPU" and config["num_processes"] == 8
    assert config["mixed_precision"] == "bf16" and config["downcast_bf16"] is False
    assert config["gpu_ids"] == "all" and config["same_network"] is True and config["tpu_env"] == []
    assert list(config) == list(yaml.safe_load(ACCELERATE_STYLE))  # every key kept, in file order


def test_reads_json(tmp_path):
    path = write(tmp_path / "c.json", json.dumps({"distributed_type": "multi_cpu", "num_processes": "4"}))
    assert load_config_file(path) == {"distributed_type": "MULTI_CPU", "num_processes": 4}


def test_yaml_booleans_for_no(tmp_path):
    config = load_config_file(write(tmp_path / "c.yaml", "mixed_precision: no\ndistributed_type: NO\n"))
    assert config == {"mixed_precision": "no", "distributed_type": "NO"}


def test_only_present_keys_and_nulls_mean_unset(tmp_path):
    config = load_config_file(write(tmp_path / "c.yaml", "mixed_precision: fp16\nmain_process_ip: null\n"))
    assert config == {"mixed_precision": "fp16"}
    with pytest.raises(ValueError, match="empty"):  # an empty file is an error (tests/accelerator/test_input_edges.py)
        load_config_file(write(tmp_path / "empty.yaml", ""))


def test_num_processes_minus_one_means_decided_at_launch(tmp_path):
    assert load_config_file(write(tmp_path / "c.yaml", "num_processes: -1\n")) == {}


def test_nested_sections(tmp_path):
    text = ("distributed_type: FSDP\nfsdp_config:\n  fsdp_version: 2\n  fsdp_offload_params: false\n"
            "dynamo_config:\n  dynamo_backend: inductor\n  dynamo_mode: default\n")
    config = load_config_file(write(tmp_path / "c.yaml", text))
    assert config["fsdp_config"] == {"fsdp_version": 2, "fsdp_offload_params": False}
    assert config["dynamo_config"] == {"dynamo_backend": "INDUCTOR", "dynamo_mode": "default"}


def test_old_accelerate_keys_are_upgraded(tmp_path):
    config = load_config_file(write(tmp_path / "c.yaml", "distributed_type: NO\nfp16: true\ndynamo_backend: EAGER\n"))
    assert config == {"distributed_type": "NO", "mixed_precision": "fp16", "dynamo_config": {"dynamo_backend": "EAGER"}}
    config = load_config_file(write(tmp_path / "d.yaml", "fp16: false\ndynamo_backend: 'NO'\n"))
    assert config == {"dynamo_config": {}}


@pytest.mark.parametrize("line, key", [
    ("distributed_type: MULTI_TPU", "distributed_type"),
    ("mixed_precision: fp32", "mixed_precision"),
    ("num_processes: 0", "num_processes"),
    ("num_processes: two", "num_processes"),
    ("num_processes: true", "num_processes"),
    ("num_machines: 0", "num_machines"),
    ("main_process_port: 70000", "main_process_port"),
    ("use_cpu: maybe", "use_cpu"),
    ("compute_environment: MY_LAPTOP", "compute_environment"),
    ("fsdp_config: [1, 2]", "fsdp_config"),
    ("dynamo_config: {dynamo_backend: turbo}", "dynamo_config"),
    ("commands: [1, 2]", "commands"),
    ("fp16: perhaps", "fp16"),
])
def test_bad_values_name_the_file_and_the_key(tmp_path, line, key):
    path = write(tmp_path / "bad.yaml", line + "\n")
    with pytest.raises(ValueError) as info:
        load_config_file(path)
    assert str(path) in str(info.value) and repr(key) in str(info.value)


def test_machine_rank_must_be_below_num_machines(tmp_path):
    with pytest.raises(ValueError, match="machine_rank 2 must be smaller than num_machines 2"):
        load_config_file(write(tmp_path / "c.yaml", "num_machines: 2\nmachine_rank: 2\n"))


def test_unknown_keys_are_an_error_that_suggests_the_known_key(tmp_path):
    path = write(tmp_path / "c.yaml", "mixed_precison: bf16\nnum_processes: 2\nmy_setting: {a: 1}\n")
    with pytest.raises(ValueError) as error:
        load_config_file(path)
    message = str(error.value)
    assert str(path) in message
    assert "'mixed_precison' (did you mean 'mixed_precision'?), 'my_setting'" in message


def test_unknown_dynamo_config_keys_are_an_error(tmp_path):
    path = write(tmp_path / "c.yaml", "dynamo_config:\n  dynamo_backend: INDUCTOR\n  dynamo_mod: default\n")
    with pytest.raises(ValueError, match=r"'dynamo_config'.*'dynamo_mod' \(did you mean 'dynamo_mode'\?\)"):
        load_config_file(path)
    assert load_config_file(write(tmp_path / "ok.yaml", "dynamo_config:\n  backend: eager\n  mode: default\n"))


def test_sagemaker_distributed_types(tmp_path):
    path = write(tmp_path / "c.yaml", "compute_environment: AMAZON_SAGEMAKER\ndistributed_type: data_parallel\n"
                                      "ec2_instance_type: ml.p3.2xlarge\n")
    assert load_config_file(path)["distributed_type"] == "DATA_PARALLEL"
    with pytest.raises(ValueError, match="distributed_type"):
        load_config_file(write(tmp_path / "d.yaml", "compute_environment: AMAZON_SAGEMAKER\ndistributed_type: FSDP\n"))


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_config_file(tmp_path / "nope.yaml")


@pytest.mark.parametrize("name, text", [("c.yaml", "a: [1, 2\n"), ("c.json", "{not json"), ("c.yaml", "- a\n- b\n")])
def test_unreadable_files_name_the_file(tmp_path, name, text):
    path = write(tmp_path / name, text)
    with pytest.raises(ValueError, match=re.escape(str(path))):
        load_config_file(path)


def test_normalize_config_rejects_non_string_keys():
    with pytest.raises(ValueError, match="keys must be strings"):
        normalize_config({1: "x"}, "somewhere")


def test_the_documented_example_is_valid(tmp_path):
    blocks = re.findall(r"```yaml\n(.*?)```", DOCS.read_text(), flags=re.S)
    assert blocks, "docs/config-file.md should show an example config"
    for index, block in enumerate(blocks):
        config = load_config_file(write(tmp_path / f"example{index}.yaml", block))
        assert config  # every documented example parses to something
