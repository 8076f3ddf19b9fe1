"""Accelerate's `accelerate.commands.*` and `accelerate.utils.launch` names in hasten, used the way Accelerate's
code and users use them: parsers, `*_command` functions, config objects, the terminal menu, estimate helpers."""
from __future__ import annotations

import argparse
import builtins
import importlib
import json
import os
import subprocess
import sys
import textwrap

import pytest
import yaml

from helpers import ROOT, clean_env
from hasten.commands import cli
from hasten.commands.errors import CommandError
from hasten.core.planned import NotYetSupportedError

# (module, the names it must define): the reference's layout, checked here without the reference installed
SURFACE = {
    "hasten.commands.hasten_cli": ["main"],
    "hasten.commands.launch": ["launch_command_parser", "launch_command", "main", "CustomHelpFormatter", "clean_option",
                               "options_to_group", "simple_launcher", "multi_gpu_launcher", "deepspeed_launcher",
                               "tpu_launcher", "tpu_pod_launcher", "sagemaker_launcher"],
    "hasten.commands.env": ["env_command_parser", "env_command", "main"],
    "hasten.commands.estimate": ["estimate_command_parser", "estimate_command", "main", "create_ascii_table",
                                 "gather_data", "estimate_training_usage", "create_empty_model", "check_has_model",
                                 "verify_on_hub", "add_timm_hub_prefix"],
    "hasten.commands.test": ["test_command_parser", "test_command", "main"],
    "hasten.commands.merge": ["merge_command_parser", "merge_command", "main", "description"],
    "hasten.commands.to_fsdp2": ["to_fsdp2_command_parser", "to_fsdp2_command", "convert_config_to_fsdp2",
                                 "load_config", "ConversionStatus", "ARGUMENT_KEY_MAPPING", "ARGUMENT_VALUE_MAPPING"],
    "hasten.commands.tpu": ["tpu_command_parser", "tpu_command_launcher", "main"],
    "hasten.commands.utils": ["CustomArgumentParser", "CustomArgumentGroup"],
    "hasten.commands.config": ["get_config_parser", "main", "config_command_parser", "default_command_parser",
                               "update_command_parser", "default_config_file", "load_config_from_file"],
    "hasten.commands.config.config_args": ["BaseConfig", "ClusterConfig", "SageMakerConfig", "load_config_from_file",
                                           "default_config_file", "default_json_config_file",
                                           "default_yaml_config_file", "cache_dir", "hf_cache_home"],
    "hasten.commands.config.config_utils": ["DYNAMO_BACKENDS", "SubcommandHelpFormatter"],
    "hasten.commands.config.config": ["config_command_parser", "config_command", "get_user_input", "description",
                                      "main"],
    "hasten.commands.config.default": ["default_command_parser", "default_config_command", "write_basic_config",
                                       "description"],
    "hasten.commands.config.update": ["update_command_parser", "update_config_command", "update_config",
                                      "description"],
    "hasten.commands.config.cluster": ["get_cluster_input"],
    "hasten.commands.config.sagemaker": ["get_sagemaker_input"],
    "hasten.commands.menu": ["BulletMenu"],
    "hasten.commands.menu.cursor": ["hide", "hide_cursor", "show_cursor"],
    "hasten.commands.menu.helpers": ["CURSOR_TO_CHAR", "Direction", "clear_line", "forceWrite", "linebreak",
                                     "move_cursor", "reset_cursor", "writeColor"],
    "hasten.commands.menu.input": ["KeyHandler", "mark", "mark_multiple", "register"],
    "hasten.commands.menu.keymap": ["ARROW_KEY_FLAG", "KEYMAP", "get_character", "get_raw_chars"],
    "hasten.commands.menu.selection_menu": ["BulletMenu", "in_colab"],
    "hasten.utils.launch": ["PrepareForLaunch", "prepare_simple_launcher_cmd_env", "prepare_multi_gpu_env",
                            "prepare_deepspeed_cmd_env", "prepare_tpu", "prepare_sagemager_args_inputs",
                            "prepare_extend_env_parallelism_config", "setup_fp8_env", "env_var_path_add"],
}


def test_every_module_defines_the_reference_names():
    missing = [f"{module}.{name}" for module, names in SURFACE.items() for name in names
               if not hasattr(importlib.import_module(module), name)]
    assert not missing, missing
    import hasten.utils

    for name in SURFACE["hasten.utils.launch"][:6]:
        assert getattr(hasten.utils, name) is getattr(importlib.import_module("hasten.utils.launch"), name)


def test_no_command_help_imports_torch():
    code = textwrap.dedent("""
        import sys
        from hasten.commands import cli
        for name in cli.COMMANDS:
            assert cli.main([name, "--help"]) == 0, name
        import hasten.commands.menu, hasten.commands.config.config_args, hasten.commands.hasten_cli
        heavy = [name for name in ("torch", "numpy") if name in sys.modules]
        assert not heavy, heavy
        print("light")
    """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=clean_env(), cwd=ROOT)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().endswith("light")


# ------------------------------------------------------------------------------------------ parsers
@pytest.mark.parametrize("module, function, argv", [
    ("launch", "launch_command_parser", ["-n", "2", "train.py"]),
    ("env", "env_command_parser", ["--config_file", "c.yaml"]),
    ("estimate", "estimate_command_parser", ["torch.nn:Linear", "--trust_remote_code"]),
    ("test", "test_command_parser", ["--config-file", "c.yaml"]),
    ("merge", "merge_command_parser", ["ckpt", "out", "--unsafe_serialization"]),
    ("to_fsdp2", "to_fsdp2_command_parser", ["--config_file", "c.yaml", "--overwrite"]),
    ("tpu", "tpu_command_parser", ["--tpu_name", "pod", "--command", "echo", "hi"]),
])
def test_command_parsers_stand_alone_or_register_with_their_command(module, function, argv):
    module = importlib.import_module(f"hasten.commands.{module}")
    make = getattr(module, function)
    alone = make()
    assert alone.prog.startswith("hasten ") and not hasattr(alone.parse_args(argv), "func")
    top = argparse.ArgumentParser()
    sub = make(top.add_subparsers())
    assert sub.parse_args(argv).func.__module__ == module.__name__


def test_the_cli_module_under_hasten_name():
    from hasten.commands.hasten_cli import main

    assert main is cli.main


def test_custom_argument_parser_takes_both_spellings_and_records_what_was_given(capsys):
    from hasten.commands.utils import CustomArgumentParser

    parser = CustomArgumentParser(prog="tool")
    parser.add_argument("--num_steps", type=int, default=3)
    group = parser.add_argument_group("extra")
    group.add_argument("--use_cache", action="store_true")
    args = parser.parse_args(["--num-steps", "5", "--use-cache"])
    assert (args.num_steps, args.use_cache, args.nondefault) == (5, True, {"num_steps", "use_cache"})
    assert parser.parse_args([]).num_steps == 3 and not hasattr(parser.parse_args([]), "nondefault")
    with pytest.raises(SystemExit):
        parser.parse_args(["--help"])
    out = capsys.readouterr().out
    assert "--num_steps" in out and "--num-steps" not in out and "--use-cache" not in out


# ------------------------------------------------------------------------------------------ config
def test_config_objects_read_write_and_check_files(tmp_path):
    from hasten.commands.config.config_args import ClusterConfig, SageMakerConfig, load_config_from_file
    from hasten.config.enums import ComputeEnvironment, DistributedType

    path = tmp_path / "c.yaml"
    path.write_text("distributed_type: MULTI_GPU\nnum_processes: 4\nfp16: true\ngpu_ids: '0,1'\n")
    config = load_config_from_file(str(path))
    assert isinstance(config, ClusterConfig) and config.distributed_type == DistributedType.MULTI_GPU
    assert config.compute_environment == ComputeEnvironment.LOCAL_MACHINE
    assert (config.num_processes, config.mixed_precision, config.use_cpu, config.fsdp_config) == (4, "fp16", False, {})
    config.to_json_file(tmp_path / "c.json")
    assert json.loads((tmp_path / "c.json").read_text())["distributed_type"] == "MULTI_GPU"
    assert ClusterConfig.from_json_file(str(tmp_path / "c.json")).to_dict() == config.to_dict()
    config.to_yaml_file(tmp_path / "again.yaml")
    assert ClusterConfig.from_yaml_file(str(tmp_path / "again.yaml")).to_dict() == config.to_dict()
    sage = tmp_path / "s.yaml"
    sage.write_text("compute_environment: AMAZON_SAGEMAKER\ndistributed_type: DATA_PARALLEL\nec2_instance_type: "
                    "ml.p3.2xlarge\niam_role_name: role\nmixed_precision: 'no'\n")
    assert isinstance(load_config_from_file(str(sage)), SageMakerConfig)
    (tmp_path / "typo.yaml").write_text("distributed_type: NO\nnum_procesess: 2\n")
    with pytest.raises(ValueError, match="did you mean 'num_processes'"):
        load_config_from_file(str(tmp_path / "typo.yaml"))
    (tmp_path / "untyped.yaml").write_text("num_processes: 2\n")
    with pytest.raises(ValueError, match="distributed_type"):
        load_config_from_file(str(tmp_path / "untyped.yaml"))
    with pytest.raises(FileNotFoundError, match="hasten config"):
        load_config_from_file(str(tmp_path / "missing.yaml"))


def test_config_update_rewrites_an_old_file_in_todays_format(tmp_path, capsys):
    path = tmp_path / "old.yaml"
    path.write_text("distributed_type: MULTI_CPU\nnum_processes: 2\nfp16: true\ndynamo_backend: EAGER\n")
    assert cli.main(["config", "update", "--config_file", str(path)]) == 0
    assert "updated" in capsys.readouterr().out
    written = yaml.safe_load(path.read_text())
    assert written["mixed_precision"] == "fp16" and written["dynamo_config"] == {"dynamo_backend": "EAGER"}
    assert "fp16" not in written and written["num_processes"] == 2
    assert cli.main(["config", "update", "--config_file", str(tmp_path / "none.yaml")]) == 2


def test_config_default_through_accelerates_parser(tmp_path):
    from hasten.commands.config import get_config_parser

    target = tmp_path / "d.yaml"
    args = get_config_parser().parse_args(["default", "--config-file", str(target), "--mixed_precision", "bf16"])
    assert args.func(args) == 0 and yaml.safe_load(target.read_text())["mixed_precision"] == "bf16"


class Answers:
    """Scripted answers for `input()` (the menu reads numbers with it when there is no terminal)."""

    def __init__(self, *answers):
        self.answers = list(answers)

    def __call__(self, prompt=""):
        return self.answers.pop(0)


def test_the_questionnaire_writes_a_config_that_hasten_launch_reads(tmp_path, monkeypatch, capsys):
    from hasten.commands.config import config as config_module
    from hasten.commands.launch import load_launch_config

    # this machine, multi-CPU, 2 machines, rank 1, address, port (default), same network (default),
    # 4 processes, DDP (menu), debug checks, no compile, bf16 (menu)
    monkeypatch.setattr(builtins, "input", Answers("0", "1", "2", "1", "10.0.0.1", "", "", "4", "0", "yes", "no",
                                                   "2"))
    monkeypatch.setattr(sys.stdin, "isatty", lambda: True, raising=False)
    target = tmp_path / "asked.yaml"
    assert config_module.config_command(argparse.Namespace(config_file=str(target))) == 0
    assert f"saved {target}" in capsys.readouterr().out
    path, settings = load_launch_config(str(target))
    assert settings["distributed_type"] == "MULTI_CPU" and settings["use_cpu"] is True
    assert (settings["num_machines"], settings["machine_rank"], settings["main_process_ip"]) == (2, 1, "10.0.0.1")
    assert (settings["num_processes"], settings["mixed_precision"], settings["debug"]) == (4, "bf16", True)


def test_the_questionnaire_needs_a_terminal_and_sagemaker_is_not_there_yet(monkeypatch, capsys):
    from hasten.commands.config.sagemaker import get_sagemaker_input

    monkeypatch.setattr(sys.stdin, "isatty", lambda: False, raising=False)
    assert cli.main(["config"]) == 2
    assert "needs a terminal" in capsys.readouterr().err
    with pytest.raises(NotYetSupportedError, match="SageMaker"):
        get_sagemaker_input()


def test_questions_ask_again_until_the_answer_fits(monkeypatch, capsys):
    from hasten.commands.config.config_utils import _ask_field, _convert_yes_no_to_bool

    monkeypatch.setattr(builtins, "input", Answers("maybe", "YES"))
    assert _ask_field("ok? ", _convert_yes_no_to_bool, default=False, error_message="yes or no") is True
    assert "yes or no" in capsys.readouterr().out
    monkeypatch.setattr(builtins, "input", Answers(""))
    assert _ask_field("ok? ", _convert_yes_no_to_bool, default=False) is False


# ------------------------------------------------------------------------------------------ the menu
def _press(monkeypatch, *keys):
    """Feed raw characters to the menu as if typed on a terminal."""
    from hasten.commands.menu import keymap, selection_menu

    chars = list("".join(keys))
    monkeypatch.setattr(keymap, "get_raw_chars", lambda: chars.pop(0))
    monkeypatch.setattr(selection_menu, "_line_mode", lambda: False)


UP, DOWN, ENTER = "\x1b[A", "\x1b[B", "\r"


@pytest.mark.parametrize("keys, chosen", [
    ((DOWN, DOWN, ENTER), 2), ((DOWN, DOWN, DOWN, ENTER), 2), ((DOWN, UP, UP, ENTER), 0), (("2", "0", ENTER), 0),
    (("1", "x", "\x1b[C", ENTER), 1), ((ENTER,), 1),
])
def test_the_bullet_menu_follows_the_keys(monkeypatch, capsys, keys, chosen):
    from hasten.commands.menu import BulletMenu

    _press(monkeypatch, *keys)
    assert BulletMenu("Pick one", ["a", "b", "c"]).run(default_choice=1 if keys == (ENTER,) else 0) == chosen
    out = capsys.readouterr().out
    assert "Pick one" in out and "\033[?25l" in out and out.endswith("\033[?25h")  # cursor hidden, then shown


def test_ctrl_c_in_the_menu_interrupts_and_shows_the_cursor(monkeypatch, capsys):
    from hasten.commands.menu import BulletMenu

    _press(monkeypatch, DOWN, "\x03")
    with pytest.raises(KeyboardInterrupt):
        BulletMenu("Pick", ["a", "b"]).run()
    assert capsys.readouterr().out.endswith("\033[?25h")


def test_without_a_terminal_the_menu_reads_a_number(monkeypatch, capsys):
    from hasten.commands.menu import BulletMenu, selection_menu

    monkeypatch.setattr(selection_menu, "_line_mode", lambda: True)
    monkeypatch.setattr(builtins, "input", Answers("7", "x", "2"))
    assert BulletMenu("Pick", ["a", "b", "c"]).run() == 2
    assert "[2] c" in capsys.readouterr().out
    monkeypatch.setattr(builtins, "input", Answers(""))
    assert BulletMenu(None, ["a", "b"]).run(default_choice=1) == 1


def test_keys_bind_to_methods():
    from hasten.commands.menu import input as menu_input
    from hasten.commands.menu.keymap import KEYMAP

    @menu_input.register
    class Counter:
        count = 0

        @menu_input.mark(KEYMAP["up"])
        def up(self):
            return "up"

        @menu_input.mark_multiple(KEYMAP["1"], KEYMAP["2"])
        def digit(self):
            return chr(self.current_selection)

    assert type(Counter) is menu_input.KeyHandler
    assert set(Counter.key_handler) == {KEYMAP["up"], KEYMAP["1"], KEYMAP["2"]}


# ------------------------------------------------------------------------------------------ merge, to-fsdp2, tpu
def test_merge_weights_refuses_what_is_not_a_sharded_checkpoint(tmp_path, capsys):
    assert cli.main(["merge-weights", str(tmp_path / "missing"), str(tmp_path / "out")]) == 2
    assert "is not a folder" in capsys.readouterr().err
    assert cli.main(["merge-weights", str(tmp_path), str(tmp_path / "out")]) == 2
    assert "not a sharded (DCP) checkpoint" in capsys.readouterr().err


def test_tpu_config_builds_one_gcloud_call_from_flags_and_the_config_file(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("HASTEN_CONFIG_FILE", raising=False)
    commands = tmp_path / "setup.sh"
    commands.write_text('echo "one"\n\necho "two"\n')
    config = tmp_path / "tpu.yaml"
    config.write_text(yaml.safe_dump({"compute_environment": "LOCAL_MACHINE", "distributed_type": "NO",
                                      "tpu_name": "pod-a", "tpu_zone": "europe-west4-a",
                                      "command_file": str(commands)}))
    gcloud = "Running gcloud compute tpus tpu-vm ssh"
    assert cli.main(["tpu-config", "--config_file", str(config), "--debug"]) == 0
    assert (f'{gcloud} pod-a --zone europe-west4-a --command cd /usr/share; echo "one"; echo "two" --worker all'
            in capsys.readouterr().out)
    assert cli.main(["tpu-config", "--config_file", str(config), "--tpu_name", "pod-b", "--command", "ls", "/tmp",
                     "--command", "pwd", "--install_accelerate", "--accelerate_version", "1.15.0", "--use_alpha",
                     "--debug"]) == 0
    assert ("Running gcloud alpha compute tpus tpu-vm ssh pod-b --zone europe-west4-a --command cd /usr/share; "
            "pip install accelerate==1.15.0; ls /tmp; pwd --worker all") in capsys.readouterr().out
    assert cli.main(["tpu-config", "--tpu_zone", "z", "--command", "ls", "--debug"]) == 2  # no pod named
    assert "--tpu_name" in capsys.readouterr().err
    assert cli.main(["tpu-config", "--tpu_name", "p", "--tpu_zone", "z", "--debug"]) == 2  # nothing to run
    assert "--command" in capsys.readouterr().err
    assert cli.main(["tpu-config", "--tpu_name", "p", "--tpu_zone", "z", "--command", "ls",
                     "--install_accelerate", "--accelerate_version", "newest", "--debug"]) == 2
    monkeypatch.setenv("PATH", str(tmp_path))  # no gcloud here: said, not a traceback
    assert cli.main(["tpu-config", "--tpu_name", "p", "--tpu_zone", "z", "--command", "ls"]) == 2
    assert "gcloud" in capsys.readouterr().err


def test_to_fsdp2_converts_fsdp1_settings(tmp_path, capsys, caplog):
    from hasten.commands.to_fsdp2 import convert_config_to_fsdp2

    source = tmp_path / "fsdp1.yaml"
    source.write_text(yaml.safe_dump({"distributed_type": "FSDP", "num_processes": 8, "fsdp_config": {
        "fsdp_sharding_strategy": "SHARD_GRAD_OP", "fsdp_sync_module_states": True, "fsdp_forward_prefetch": False,
        "fsdp_offload_params": False, "fsdp_transformer_layer_cls_to_wrap": ["Block"], "fsdp_custom": 1}}))
    target = tmp_path / "fsdp2.yaml"
    assert cli.main(["to-fsdp2", "--config_file", str(source), "--output_file", str(target)]) == 0
    converted = yaml.safe_load(target.read_text())
    assert converted["num_processes"] == 8 and converted["fsdp_config"] == {
        "fsdp_reshard_after_forward": False, "fsdp_offload_params": False, "fsdp_version": 2,
        "fsdp_transformer_layer_cls_to_wrap": ["Block"], "fsdp_custom": 1}
    assert "fsdp_sync_module_states" in caplog.text
    assert cli.main(["to-fsdp2", "--config_file", str(source), "--output_file", str(target)]) == 2
    assert "--overwrite" in capsys.readouterr().err
    assert cli.main(["to-fsdp2", "--config_file", str(source)]) == 2
    assert convert_config_to_fsdp2({"fsdp_config": {"fsdp_version": 2, "x": 1}}) == {"fsdp_config": {"fsdp_version": 2,
                                                                                                   "x": 1}}
    assert convert_config_to_fsdp2({"num_processes": 1}) == {"num_processes": 1}
    # called from Python, the errors are also the built-in ones the reference's command raises
    from hasten.commands.to_fsdp2 import to_fsdp2_command, to_fsdp2_command_parser

    parser = to_fsdp2_command_parser()
    with pytest.raises(FileNotFoundError, match="Config file `.*missing.yaml` not found"):
        to_fsdp2_command(parser.parse_args(["--config_file", str(tmp_path / "missing.yaml")]))
    with pytest.raises(FileExistsError, match="already exists and --overwrite is not set"):
        to_fsdp2_command(parser.parse_args(["--config_file", str(source), "--output_file", str(target)]))


# ------------------------------------------------------------------------------------------ estimate helpers
def test_estimate_helpers():
    from hasten.commands.estimate import (add_timm_hub_prefix, check_has_model, create_ascii_table,
                                          estimate_training_usage)

    table = create_ascii_table(["dtype", "Size"], [["float32", "1 KiB"], ["int8", "256 B"]], "Title")
    assert table.splitlines()[0] == "Title" and "| float32 | 1 KiB |" in table and "| int8    | 256 B |" in table
    assert estimate_training_usage(400, "float32") == {"model": 400, "optimizer": 800, "gradients": 400, "step": 1600}
    assert estimate_training_usage(400, "bfloat16")["step"] == 1600  # fp32 master weights and moments stay
    assert set(estimate_training_usage(400, "int8").values()) == {-1}
    assert check_has_model(OSError("x does not appear to have a file named config.json")) == "transformers"
    assert check_has_model(RuntimeError("Unknown model (resnet9000)")) == "timm"
    assert check_has_model(ValueError("other")) == "unknown"
    assert add_timm_hub_prefix("org/model") == "hf-hub:org/model" and add_timm_hub_prefix("resnet50") == "resnet50"


def test_gather_data_and_create_empty_model(tmp_path, monkeypatch):
    from hasten.commands.estimate import create_empty_model, gather_data

    model = create_empty_model("torch.nn:Linear", kwargs={"in_features": 10, "out_features": 10})
    assert model.weight.device.type == "meta"
    (tmp_path / "tiny_net.py").write_text("import torch.nn as nn\ndef make():\n    return nn.Linear(10, 10)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    rows = gather_data(argparse.Namespace(model_name="tiny_net:make", dtypes=["float32", "int8"],
                                          library_name=None, trust_remote_code=False))
    assert rows[0] == ["float32", 400, 440, {"model": 440, "optimizer": 880, "gradients": 440, "step": 1760}]
    assert rows[1][:3] == ["int8", 200, 220] and rows[1][3]["step"] == -1  # a bare Linear root is not quantized
    with pytest.raises(CommandError, match="library_name"):
        create_empty_model("x", library_name="keras")


def test_code_named_inside_a_model_folder_runs_only_when_trusted(tmp_path, monkeypatch, capsys):
    from hasten.commands import estimate

    folder = tmp_path / "downloaded"
    folder.mkdir()
    marker = tmp_path / "ran.txt"
    (tmp_path / "evil_mod.py").write_text(
        f"import torch.nn as nn\nopen({str(marker)!r}, 'w').write('ran')\nclass Net(nn.Linear):\n"
        "    def __init__(self):\n        super().__init__(2, 2)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    (folder / "config.json").write_text(json.dumps({"model": "evil_mod:Net"}))
    with pytest.raises(CommandError, match="--trust_remote_code"):
        estimate.create_empty_model(str(folder))
    assert cli.main(["estimate-memory", str(folder)]) == 2 and not marker.exists()
    assert "--trust_remote_code" in capsys.readouterr().err
    assert cli.main(["estimate-memory", str(folder), "--trust_remote_code", "--json"]) == 0 and marker.exists()
    assert json.loads(capsys.readouterr().out)["parameters"] == 2 * 2 + 2
    (tmp_path / "mine.json").write_text(json.dumps({"model": "torch.nn:Linear", "kwargs": {"in_features": 3,
                                                                                         "out_features": 1}}))
    with pytest.raises(CommandError, match="--trust_remote_code"):  # code named in a file, even one you name
        estimate.create_empty_model(str(tmp_path / "mine.json"))
    assert estimate.create_empty_model(str(tmp_path / "mine.json"), trust_remote_code=True).weight.shape == (1, 3)


def test_transformers_folders_never_run_their_modeling_code_by_default(tmp_path, monkeypatch):
    import types

    import torch.nn as nn

    from hasten.commands import estimate

    calls = []
    fake = types.ModuleType("transformers")

    class AutoConfig:
        @staticmethod
        def from_pretrained(folder, local_files_only, **kwargs):
            calls.append(kwargs["trust_remote_code"])
            return types.SimpleNamespace()

    class AutoModel:
        @staticmethod
        def from_config(config, trust_remote_code=False):
            calls.append(trust_remote_code)
            return nn.Linear(2, 2)

    fake.AutoConfig, fake.AutoModel = AutoConfig, AutoModel
    monkeypatch.setitem(sys.modules, "transformers", fake)
    monkeypatch.setattr("hasten.core.imports.require_extra", lambda module, feature=None: fake)
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["CustomModel"],
                                                      "auto_map": {"AutoModel": "modeling_custom.CustomModel"}}))
    estimate.create_empty_model(str(tmp_path))
    estimate.create_empty_model(str(tmp_path), "transformers", trust_remote_code=True)
    assert calls == [False, False, True, True]


# ------------------------------------------------------------------------------------------ utils.launch
@pytest.fixture
def script(tmp_path, monkeypatch):
    monkeypatch.setenv("HASTEN_CONFIG_HOME", str(tmp_path / "no-config"))
    for name in [name for name in os.environ if name.startswith("SLURM_")]:
        monkeypatch.delenv(name)
    path = tmp_path / "train.py"
    path.write_text("print('hello')\n")
    return str(path)


def test_launch_helpers_build_what_hasten_launch_runs(script):
    from torch.distributed import run as torchrun

    from hasten.commands.launch import launch_command_parser
    from hasten.utils.launch import _filter_args, prepare_multi_gpu_env, prepare_simple_launcher_cmd_env

    args = launch_command_parser().parse_args(["-n", "2", "--mixed_precision", "bf16", script, "--lr", "1"])
    command, env = prepare_simple_launcher_cmd_env(args)
    assert command[:3] == [sys.executable, "-m", "torch.distributed.run"]
    parsed = torchrun.parse_args(command[3:])
    assert parsed.nproc_per_node == "2" and parsed.training_script_args[-3:] == [script, "--lr", "1"]
    assert env["HASTEN_MIXED_PRECISION"] == "bf16" and env["PATH"] == os.environ["PATH"]
    env = prepare_multi_gpu_env(args)
    assert (args.nproc_per_node, args.nnodes, args.rdzv_backend) == ("2", "1", "static")
    filtered = _filter_args(args, torchrun.get_args_parser(),
                            ["--training_script", args.training_script, "--training_script_args",
                             args.training_script_args])
    assert filtered.nproc_per_node == "2" and filtered.master_port == args.master_port
    assert filtered.training_script == script and env["HASTEN_MIXED_PRECISION"] == "bf16"


def test_prepare_deepspeed_cmd_env_builds_the_deepspeed_launch(script, tmp_path):
    from hasten.commands.launch import launch_command_parser
    from hasten.utils.launch import prepare_deepspeed_cmd_env

    args = launch_command_parser().parse_args(["-n", "2", "--zero_stage", "3", script])
    command, env = prepare_deepspeed_cmd_env(args)  # one machine: torchrun's agent, DeepSpeed switched on
    assert command[:3] == [sys.executable, "-m", "torch.distributed.run"]
    assert env["HASTEN_USE_DEEPSPEED"] == "true" and env["HASTEN_DEEPSPEED_ZERO_STAGE"] == "3"
    pytest.importorskip("deepspeed")
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("node-a slots=1\nnode-b slots=1\n")
    args = launch_command_parser().parse_args(
        ["--num_machines", "2", "-n", "2", "--main_process_ip", "10.0.0.1", "--use_deepspeed",
         "--deepspeed_hostfile", str(hostfile), "--deepspeed_multinode_launcher", "pdsh", script])
    command, env = prepare_deepspeed_cmd_env(args)  # several machines: DeepSpeed's own runner
    assert command[1:4] == ["-u", "-m", "deepspeed.launcher.runner"] and "--hostfile" in command
    assert command[command.index("--launcher") + 1] == "pdsh" and env["HASTEN_USE_DEEPSPEED"] == "true"


def test_launch_helpers_of_missing_backends_and_small_helpers(script, monkeypatch):
    from hasten.utils import launch

    args = argparse.Namespace(fp8_backend=None, fp8_margin=None)
    assert launch.setup_fp8_env(args, {"A": "1"}) == {"A": "1"}
    with pytest.raises(NotYetSupportedError, match="--fp8_margin"):
        launch.setup_fp8_env(argparse.Namespace(fp8_margin=2), {})
    for call in (lambda: launch.prepare_tpu(args, {}), lambda: launch.prepare_sagemager_args_inputs(None, args)):
        with pytest.raises(NotYetSupportedError):
            call()
    monkeypatch.setenv("MY_PATH", os.pathsep.join(["/a", "", "/b"]))
    assert launch.env_var_path_add("MY_PATH", "/c") == os.pathsep.join(["/a", "/b", "/c"])
    assert launch.env_var_path_add("NO_SUCH_PATH_VAR", "/c") == "/c"


def test_prepare_extend_env_parallelism_config_adds_the_parallelism_variables():
    """Accelerate's helper: the switch and every option given become the variables ParallelismConfig reads."""
    from hasten.commands.errors import CommandError
    from hasten.utils import launch

    args = argparse.Namespace(parallelism_config_dp_shard_size=2, parallelism_config_tp_size=2,
                              parallelism_config_cp_size=None, num_processes=4)
    env = launch.prepare_extend_env_parallelism_config(args, {"A": "1"})
    assert env == {"A": "1", "HASTEN_USE_PARALLELISM_CONFIG": "true", "HASTEN_PARALLELISM_CONFIG_DP_SHARD_SIZE": "2",
                   "HASTEN_PARALLELISM_CONFIG_TP_SIZE": "2"}
    assert launch.prepare_extend_env_parallelism_config(argparse.Namespace(), {}) == {
        "HASTEN_USE_PARALLELISM_CONFIG": "true"}
    with pytest.raises(CommandError, match="dp_shard_size=2 x tp_size=2 = 4 processes, but the job has 2"):
        launch.prepare_extend_env_parallelism_config(
            argparse.Namespace(parallelism_config_dp_shard_size=2, parallelism_config_tp_size=2, num_processes=2), {})


def test_prepare_for_launch_gives_each_spawned_process_its_ranks(monkeypatch):
    from hasten.utils.launch import PrepareForLaunch

    for name in ("LOCAL_RANK", "RANK", "FORK_LAUNCHED"):
        monkeypatch.setenv(name, "unset")
    monkeypatch.setenv("NPROC", "4")
    monkeypatch.setenv("NODE_RANK", "1")
    seen = []
    PrepareForLaunch(lambda value: seen.append((value, os.environ["LOCAL_RANK"], os.environ["RANK"])),
                     "MULTI_CPU")(2, "x")
    assert seen == [("x", "2", "6")] and os.environ["FORK_LAUNCHED"] == "1"
    PrepareForLaunch(seen.append)(0, "single")
    assert seen[-1] == "single"
