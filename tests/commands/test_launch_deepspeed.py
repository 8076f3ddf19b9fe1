"""`hasten launch`'s DeepSpeed group: flags and the config file's deepspeed_config section become the variables
DeepSpeedPlugin reads, bad input stops the launch before anything starts, and a multi-machine job with a DeepSpeed
hostfile is handed to DeepSpeed's own runner."""
from __future__ import annotations

import json
import sys

import pytest
import yaml

from helpers import run_real_launch
from launch_fixtures import no_launch, plan_for, script  # noqa: F401 - pytest fixtures
from hasten.commands import cli
from hasten.commands import launch as launch_command
from hasten.commands import launch_deepspeed
from hasten.commands.errors import CommandError
from hasten.commands.launch import launch_command_parser, load_launch_config
from hasten.commands.launch_deepspeed import DeepSpeedRunner, env_file_text
from hasten.commands.launch_plan import RUNNER_MODULE, build_plan
from hasten.utils.environment import patch_environment


@pytest.fixture
def ds_json(tmp_path):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"zero_optimization": {"stage": 3}, "train_micro_batch_size_per_gpu": "auto"}))
    return str(path)


@pytest.fixture
def hostfile(tmp_path):
    path = tmp_path / "hostfile"
    path.write_text("# two machines\nnode0 slots=4\nnode1 slots=4\n")
    return str(path)


def hasten_env(plan) -> dict:
    return {key: value for key, value in plan.env.items() if key.startswith("HASTEN_")}


def ds_fields(env) -> set:
    """HASTEN_CONFIG_DS_FIELDS as a set (the order of the config file's keys does not matter to the plugin)."""
    return set(env.pop("HASTEN_CONFIG_DS_FIELDS").split(","))


def write_config(path, **settings):
    path.write_text(yaml.safe_dump(settings))
    return load_launch_config(str(path))


# ------------------------------------------------------------------------------------------ flags -> variables
def test_the_deepspeed_flags_become_the_variables_the_plugin_reads(script, ds_json):
    plan = plan_for(["--use_deepspeed", "--zero_stage", "2", "--offload_optimizer_device", "cpu",
                     "--offload_param_device", "nvme", "--offload_param_nvme_path", "/nvme",
                     "--gradient_clipping", "1.0", "--deepspeed_config_file", ds_json, "--zero3_init_flag", "true",
                     "--zero3_save_16bit_model", "true", "--deepspeed_moe_layer_cls_names", "X", "-n", "2", script])
    assert hasten_env(plan) == {
        "HASTEN_USE_DEEPSPEED": "true", "HASTEN_DEEPSPEED_ZERO_STAGE": "2",
        "HASTEN_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE": "cpu", "HASTEN_DEEPSPEED_OFFLOAD_PARAM_DEVICE": "nvme",
        "HASTEN_DEEPSPEED_OFFLOAD_PARAM_NVME_PATH": "/nvme", "HASTEN_GRADIENT_CLIPPING": "1.0",
        "HASTEN_DEEPSPEED_CONFIG_FILE": ds_json, "HASTEN_DEEPSPEED_ZERO3_INIT": "true",
        "HASTEN_DEEPSPEED_ZERO3_SAVE_16BIT_MODEL": "true", "HASTEN_DEEPSPEED_MOE_LAYER_CLS_NAMES": "X"}
    assert plan.notes == [] and plan.deepspeed_runner is None  # one machine: hasten's own torchrun launch
    assert "--nproc_per_node" in plan.torchrun_args


def test_the_plugin_takes_its_unset_fields_from_the_exported_variables(script):
    from hasten.config.deepspeed import DeepSpeedPlugin

    plan = plan_for(["--use_deepspeed", "--zero_stage", "3", "--offload_optimizer_device", "nvme",
                     "--offload_optimizer_nvme_path", "/fast", "--offload_param_device", "cpu",
                     "--gradient_clipping", "0.5", "--gradient_accumulation_steps", "4", "--zero3_init_flag", "true",
                     "--zero3_save_16bit_model", "true", script])
    with patch_environment(**plan.env):
        plugin = DeepSpeedPlugin()
    assert (plugin.zero_stage, plugin.offload_optimizer_device, plugin.offload_optimizer_nvme_path) == (3, "nvme", "/fast")
    assert (plugin.offload_param_device, plugin.gradient_clipping, plugin.gradient_accumulation_steps) == ("cpu", 0.5, 4)
    assert plugin.zero3_init_flag is True and plugin.zero3_save_16bit_model is True
    assert plugin.deepspeed_config["zero_optimization"]["offload_optimizer"] == {"device": "nvme", "nvme_path": "/fast"}


def test_accelerate_spellings_reach_the_plugin_too():
    from hasten.config.deepspeed import DeepSpeedPlugin

    with patch_environment(ACCELERATE_DEEPSPEED_ZERO_STAGE="1", ACCELERATE_DEEPSPEED_ZERO3_INIT="false",
                           ACCELERATE_GRADIENT_CLIPPING="2.0"):
        plugin = DeepSpeedPlugin()
    assert (plugin.zero_stage, plugin.zero3_init_flag, plugin.gradient_clipping) == (1, False, 2.0)


def test_flags_without_use_deepspeed_are_exported_with_a_note(script):
    plan = plan_for(["--zero_stage", "3", script])
    assert hasten_env(plan) == {"HASTEN_DEEPSPEED_ZERO_STAGE": "3"}
    assert plan.notes == ["hasten launch: --zero_stage given without --use_deepspeed: the values reach a "
                          "DeepSpeedPlugin built in the script, but DeepSpeed is not switched on; add --use_deepspeed "
                          "to train with it."]


def test_launcher_only_settings_are_not_exported(script, hostfile):
    plan = plan_for(["--use_deepspeed", "--deepspeed_hostfile", hostfile, "--deepspeed_inclusion_filter", "node0",
                     script])
    assert hasten_env(plan) == {"HASTEN_USE_DEEPSPEED": "true"}
    assert plan.notes == ["hasten launch: --deepspeed_hostfile / --deepspeed_multinode_launcher apply to several "
                          "machines only; this one-machine job is started by hasten launch itself."]


# ------------------------------------------------------------------------------------------ the config file
def test_a_deepspeed_config_section_exports_the_same_variables(script, tmp_path):
    path, config = write_config(tmp_path / "cfg.yaml", distributed_type="DEEPSPEED", num_processes=2, deepspeed_config={
        "zero_stage": 3, "offload_optimizer_device": "cpu", "offload_param_device": "none",
        "gradient_accumulation_steps": 2, "gradient_clipping": 1.0, "zero3_init_flag": True,
        "zero3_save_16bit_model": False, "deepspeed_moe_layer_cls_names": "MoE", "deepspeed_multinode_launcher": "pdsh"})
    plan = plan_for([script], config, path)
    env = hasten_env(plan)
    assert ds_fields(env) == set(config["deepspeed_config"])
    assert env == {
        "HASTEN_CONFIG_FILE": path, "HASTEN_CONFIG_FILE_APPLIED": "true", "HASTEN_USE_DEEPSPEED": "true",
        "HASTEN_DEEPSPEED_ZERO_STAGE": "3",
        "HASTEN_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE": "cpu", "HASTEN_DEEPSPEED_OFFLOAD_PARAM_DEVICE": "none",
        "HASTEN_GRADIENT_ACCUMULATION_STEPS": "2", "HASTEN_GRADIENT_CLIPPING": "1.0",
        "HASTEN_DEEPSPEED_ZERO3_INIT": "true", "HASTEN_DEEPSPEED_ZERO3_SAVE_16BIT_MODEL": "false",
        "HASTEN_DEEPSPEED_MOE_LAYER_CLS_NAMES": "MoE"}
    assert plan.notes == []


def test_the_section_is_read_only_for_a_deepspeed_job(script, tmp_path):
    path, config = write_config(tmp_path / "cfg.yaml", distributed_type="MULTI_GPU", deepspeed_config={"zero_stage": 3})
    assert "HASTEN_DEEPSPEED_ZERO_STAGE" not in plan_for([script], config, path).env


def test_a_flag_overrides_the_section_and_says_so(script, tmp_path):
    path, config = write_config(tmp_path / "cfg.yaml", distributed_type="DEEPSPEED", mixed_precision="bf16",
                                deepspeed_config={"zero_stage": 3, "gradient_accumulation_steps": 2,
                                                  "offload_optimizer_device": "cpu"})
    plan = plan_for(["--zero_stage", "1", "--gradient_accumulation_steps", "8", "--offload_optimizer_device", "cpu",
                     script], config, path)
    assert plan.notes == [f"hasten launch: --zero_stage 1 overrides zero_stage: 3 from {path}",
                          f"hasten launch: --gradient_accumulation_steps 8 overrides "
                          f"deepspeed_config.gradient_accumulation_steps: 2 from {path}"]
    env = hasten_env(plan)
    assert env["HASTEN_DEEPSPEED_ZERO_STAGE"] == "1" and env["HASTEN_GRADIENT_ACCUMULATION_STEPS"] == "8"
    # Accelerate's list: every key of the section, and mixed_precision since the config file chose it
    assert ds_fields(env) == {"zero_stage", "gradient_accumulation_steps", "offload_optimizer_device",
                              "mixed_precision"}


def test_the_plugin_refuses_the_listed_fields_with_a_deepspeed_config_file(script, tmp_path, ds_json):
    from hasten.config.deepspeed import DeepSpeedPlugin

    path, config = write_config(tmp_path / "cfg.yaml", distributed_type="DEEPSPEED",
                                deepspeed_config={"gradient_clipping": 1.0})
    plan = plan_for([script], config, path)
    assert plan.env["HASTEN_CONFIG_DS_FIELDS"] == "gradient_clipping"
    with patch_environment(**plan.env), pytest.raises(ValueError, match="ignored"):
        DeepSpeedPlugin(hf_ds_config=ds_json)


def test_a_deepspeed_flag_beats_another_backend_of_the_config_file(script, tmp_path):
    path, config = write_config(tmp_path / "cfg.yaml", distributed_type="FSDP", fsdp_config={"fsdp_version": 2})
    plan = plan_for(["--use_deepspeed", script], config, path)
    assert "HASTEN_USE_FSDP" not in plan.env and "HASTEN_FSDP_VERSION" not in plan.env
    assert plan.env["HASTEN_USE_DEEPSPEED"] == "true"
    assert plan.notes == [f"hasten launch: --use_deepspeed overrides distributed_type: FSDP from {path}"]


# ------------------------------------------------------------------------------------------ bad input
@pytest.mark.parametrize("argv, message", [
    (["--zero_stage", "4"], "--zero_stage 4: the ZeRO stage is one of 0, 1, 2, 3."),
    (["--zero_stage", "-1"], "the ZeRO stage is one of 0, 1, 2, 3"),
    (["--offload_optimizer_device", "disk"], "--offload_optimizer_device 'disk': an offload device is one of "
                                             "none, cpu, nvme."),
    (["--offload_param_device", "gpu"], "an offload device is one of none, cpu, nvme"),
    (["--offload_optimizer_device", "nvme"], "--offload_optimizer_device nvme needs the NVMe folder: pass "
                                             "--offload_optimizer_nvme_path PATH"),
    (["--offload_param_device", "nvme", "--offload_param_nvme_path", "none"], "--offload_param_nvme_path PATH"),
    (["--zero3_init_flag", "maybe"], "--zero3_init_flag 'maybe': Cannot read 'maybe' as a boolean"),
    (["--gradient_clipping", "-1"], "gradient clipping is a number >= 0"),
    (["--deepspeed_config_file", "missing.json"], "the DeepSpeed config file 'missing.json' does not exist"),
    (["--deepspeed_multinode_launcher", "ssh"], "the DeepSpeed multi-node launcher is one of pdsh, standard"),
    (["--deepspeed_exclusion_filter", "a", "--deepspeed_inclusion_filter", "b"], "cannot be used together"),
    (["--use_fsdp"], "--use_fsdp and --use_deepspeed cannot be used together"),
])
def test_bad_deepspeed_flags_stop_the_launch_before_anything_starts(script, no_launch, capsys, argv, message):
    with pytest.raises(CommandError) as error:
        plan_for(["--use_deepspeed", *argv, script])
    assert message in str(error.value)
    assert cli.main(["launch", "--use_deepspeed", *argv, script]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("text, message", [
    ("{not json", "is not JSON"),
    ("[1, 2]", "holds a JSON list, not an object"),
    ('{"train_batch_size": 8}', "has no 'zero_optimization' section"),
])
def test_a_deepspeed_config_file_that_is_not_usable_is_refused(script, tmp_path, text, message):
    path = tmp_path / "ds.json"
    path.write_text(text)
    with pytest.raises(CommandError, match=message):
        plan_for(["--use_deepspeed", "--deepspeed_config_file", str(path), script])


@pytest.mark.parametrize("section, message", [
    ({"zero_stage": 7}, "deepspeed_config.zero_stage: 7 in the config file"),
    ({"offload_param_device": "disk"}, "an offload device is one of none, cpu, nvme"),
    ({"zero_stages": 2}, "deepspeed_config has unknown keys zero_stages"),
    ({"gradient_accumulation_steps": 0}, "gradient accumulation steps are a whole number >= 1"),
])
def test_bad_section_values_stop_the_launch(script, tmp_path, section, message):
    path, config = write_config(tmp_path / "cfg.yaml", distributed_type="DEEPSPEED", deepspeed_config=section)
    with pytest.raises(CommandError, match=message):
        plan_for([script], config, path)


def test_two_gradient_accumulation_steps_in_one_config_file_are_an_error(script, tmp_path):
    path, config = write_config(tmp_path / "cfg.yaml", distributed_type="DEEPSPEED", gradient_accumulation_steps=4,
                                deepspeed_config={"gradient_accumulation_steps": 2})
    with pytest.raises(CommandError, match="two gradient accumulation steps"):
        plan_for([script], config, path)


def test_fields_a_deepspeed_config_file_must_hold_are_refused_from_the_config_file(script, tmp_path, ds_json):
    path, config = write_config(tmp_path / "cfg.yaml", distributed_type="DEEPSPEED", deepspeed_config={
        "deepspeed_config_file": ds_json, "zero_stage": 2, "zero3_init_flag": True})
    with pytest.raises(CommandError, match=r"sets zero_stage while a DeepSpeed config file is used"):
        plan_for([script], config, path)
    path, config = write_config(tmp_path / "ok.yaml", distributed_type="DEEPSPEED",
                                deepspeed_config={"deepspeed_config_file": ds_json, "zero3_init_flag": True})
    env = hasten_env(plan_for([script], config, path))
    assert env["HASTEN_DEEPSPEED_CONFIG_FILE"] == ds_json
    assert ds_fields(env) == {"deepspeed_config_file", "zero3_init_flag"}


def test_zero3_init_flag_below_stage_3_is_only_a_warning(script, tmp_path, ds_json):
    plan = plan_for(["--use_deepspeed", "--zero_stage", "2", "--zero3_init_flag", "true", script])
    assert plan.notes == ["hasten launch: warning: zero3_init_flag applies to ZeRO stage 3 only, and the stage is 2: "
                          "DeepSpeedPlugin sets it to false."]
    assert plan.env["HASTEN_DEEPSPEED_ZERO3_INIT"] == "true"
    assert plan_for(["--use_deepspeed", "--zero3_init_flag", "true", "--zero_stage", "3", script]).notes == []
    # the stage of a DeepSpeed config file counts (ds_json holds stage 3)
    assert plan_for(["--use_deepspeed", "--zero3_init_flag", "true", "--deepspeed_config_file", ds_json,
                     script]).notes == []


# ------------------------------------------------------------------------------------------ several machines
def _multinode(script, *extra):
    return ["--use_deepspeed", "--num_machines", "2", "-n", "8", "--main_process_ip", "10.0.0.1",
            "--main_process_port", "29600", *extra, script, "--lr", "0.1"]


def test_several_machines_with_a_hostfile_use_deepspeeds_runner(script, hostfile):
    plan = plan_for(_multinode(script, "--deepspeed_hostfile", hostfile, "--zero_stage", "3"))
    runner = plan.deepspeed_runner
    assert runner.argv == [sys.executable, "-u", "-m", "deepspeed.launcher.runner", "--hostfile", hostfile,
                           "--launcher", "pdsh", "--no_local_rank", "--num_nodes", "2", "--num_gpus", "4",
                           "--master_addr", "10.0.0.1", "--master_port", "29600",
                           "--module", RUNNER_MODULE, "path", script, "--lr", "0.1"]
    assert runner.env["HASTEN_USE_DEEPSPEED"] == "true" and runner.env["HASTEN_DEEPSPEED_ZERO_STAGE"] == "3"


def test_the_runner_command_line_is_one_deepspeed_accepts(script, hostfile):
    from deepspeed.launcher.runner import parse_args

    plan = plan_for(_multinode(script, "--deepspeed_hostfile", hostfile, "--deepspeed_multinode_launcher", "openmpi"))
    parsed = parse_args(plan.deepspeed_runner.argv[4:])
    assert (parsed.hostfile, parsed.launcher, parsed.num_nodes, parsed.num_gpus) == (hostfile, "openmpi", 2, 4)
    assert (parsed.master_addr, parsed.master_port, parsed.no_local_rank, parsed.module) == ("10.0.0.1", 29600,
                                                                                           True, True)
    assert parsed.user_script == RUNNER_MODULE and parsed.user_args == ["path", script, "--lr", "0.1"]


def test_runner_variants(script, hostfile):
    nossh = plan_for(_multinode(script, "--deepspeed_hostfile", hostfile, "--deepspeed_multinode_launcher", "nossh",
                                "--machine_rank", "1")).deepspeed_runner.argv
    assert nossh[6:10] == ["--no_ssh", "--node_rank", "1", "--no_local_rank"] and "--launcher" not in nossh
    include = plan_for(_multinode(script, "--deepspeed_hostfile", hostfile, "--deepspeed_inclusion_filter",
                                  "node0:0,1@node1")).deepspeed_runner.argv
    assert "--include" in include and include[include.index("--include") + 1] == "node0:0,1@node1"
    assert "--num_gpus" not in include  # DeepSpeed refuses a count together with a filter
    args = launch_command_parser().parse_args(["--use_deepspeed", "--num_machines", "2", "--main_process_ip", "h",
                                               "--deepspeed_hostfile", hostfile, "--no_python", "-n", "2", "ls", "-l"])
    no_python = build_plan(args, environ={}, cpu_count=8, count_accelerators=lambda: 0, find_free_port=lambda: 1,
                           is_port_in_use=lambda port, host: False).deepspeed_runner.argv
    assert no_python[-3:] == ["--no_python", "ls", "-l"]


def test_standard_or_no_deepspeed_launcher_keeps_one_hasten_launch_per_machine(script, hostfile):
    assert plan_for(_multinode(script)).deepspeed_runner is None
    plan = plan_for(_multinode(script, "--deepspeed_hostfile", hostfile, "--deepspeed_multinode_launcher", "standard"))
    assert plan.deepspeed_runner is None and "--nnodes" in plan.torchrun_args


@pytest.mark.parametrize("extra, message", [
    (["--deepspeed_multinode_launcher", "pdsh"], "needs --deepspeed_hostfile PATH"),
    (["--deepspeed_hostfile", "no-such-hostfile"], "--deepspeed_hostfile 'no-such-hostfile': no such file"),
    (["--deepspeed_hostfile", "HOSTFILE", "--gpu_ids", "0,1"], "--gpu_ids does not reach the other machines"),
])
def test_bad_multinode_input_is_refused(script, hostfile, extra, message):
    extra = [hostfile if item == "HOSTFILE" else item for item in extra]
    with pytest.raises(CommandError, match=message):
        plan_for(_multinode(script, *extra))


def test_a_hostfile_must_list_enough_machines_in_deepspeeds_format(script, tmp_path):
    short = tmp_path / "short"
    short.write_text("node0 slots=4\n")
    with pytest.raises(CommandError, match="lists 1 machine"):
        plan_for(_multinode(script, "--deepspeed_hostfile", str(short)))
    bad = tmp_path / "bad"
    bad.write_text("node0 slots=4\nnode1:4\n")
    with pytest.raises(CommandError, match="line 2 'node1:4' is not 'HOSTNAME slots=N'"):
        plan_for(_multinode(script, "--deepspeed_hostfile", str(bad)))


def test_without_deepspeed_installed_the_runner_names_the_extra(script, hostfile, monkeypatch):
    monkeypatch.setattr(launch_deepspeed, "deepspeed_installed", lambda: False)
    with pytest.raises(CommandError, match=r"pip install 'hasten\[deepspeed\]'"):
        plan_for(_multinode(script, "--deepspeed_hostfile", hostfile))
    assert plan_for(["--use_deepspeed", "-n", "2", script]).deepspeed_runner is None  # one machine needs no runner


def test_the_runner_gets_the_settings_directly_and_through_its_environment_file(tmp_path, monkeypatch):
    """What DeepSpeed's runner would see, with a stand-in for the runner (no pdsh, no ssh)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / ".deepspeed_env").write_text("NCCL_DEBUG=INFO\n")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    out = tmp_path / "out"
    show = (f"import os, sys; open({str(out)!r}, 'w').write(os.environ['HASTEN_DEEPSPEED_ZERO_STAGE'] + '|' + "
            "open(os.environ['DS_ENV_FILE']).read()); sys.exit(3)")
    runner = DeepSpeedRunner(argv=[sys.executable, "-c", show], env={"HASTEN_DEEPSPEED_ZERO_STAGE": "3"})
    assert launch_command.execute_deepspeed_runner(runner) == 3
    assert out.read_text() == "3|NCCL_DEBUG=INFO\nHASTEN_DEEPSPEED_ZERO_STAGE=3\n"
    assert (tmp_path / ".deepspeed_env").read_text() == "NCCL_DEBUG=INFO\n"  # the user's file is left as it was
    with pytest.raises(CommandError, match="line break"):
        env_file_text({"HASTEN_X": "a\nb"})


def test_launch_routes_a_runner_plan_to_deepspeeds_runner(script, hostfile, monkeypatch):
    ran = []
    monkeypatch.setattr(launch_command, "execute_deepspeed_runner", lambda runner: ran.append(runner) or 0)
    monkeypatch.setattr(launch_command, "execute", lambda plan: ran.append(plan) or 0)
    args = launch_command_parser().parse_args(_multinode(script, "--deepspeed_hostfile", hostfile))
    assert launch_command.run(args) == 0 and isinstance(ran[-1], DeepSpeedRunner)
    # Accelerate's deepspeed_launcher: the same launch with DeepSpeed switched on
    args = launch_command_parser().parse_args(["-n", "2", script])
    assert launch_command.deepspeed_launcher(args) is None and ran[-1].env["HASTEN_USE_DEEPSPEED"] == "true"


# ------------------------------------------------------------------------------------------ a real launch
def test_each_rank_receives_the_deepspeed_settings():
    result = run_real_launch("print_deepspeed_env.py", launch_args=["--use_deepspeed", "--zero_stage", "1"])
    lines = sorted(line for line in result.stdout.splitlines() if line.startswith("rank="))
    assert lines == ["rank=0 HASTEN_USE_DEEPSPEED=true HASTEN_DEEPSPEED_ZERO_STAGE=1",
                     "rank=1 HASTEN_USE_DEEPSPEED=true HASTEN_DEEPSPEED_ZERO_STAGE=1"], result.stdout


def test_deepspeeds_runner_starts_this_machines_share_of_the_job(tmp_path):
    """The real runner, with the nossh launcher (no ssh, no pdsh): machine 0 of two starts its one rank."""
    from hasten.core.network import find_free_port

    hostfile = tmp_path / "hostfile"
    hostfile.write_text("localhost slots=1\n127.0.0.1 slots=1\n")
    result = run_real_launch("print_deepspeed_env.py", launch_args=[
        "--use_deepspeed", "--zero_stage", "1", "--num_machines", "2", "--machine_rank", "0",
        "--main_process_ip", "127.0.0.1", "--main_process_port", str(find_free_port()),
        "--deepspeed_hostfile", str(hostfile), "--deepspeed_multinode_launcher", "nossh"])
    lines = [line for line in result.stdout.splitlines() if line.startswith("rank=")]
    assert lines == ["rank=0 HASTEN_USE_DEEPSPEED=true HASTEN_DEEPSPEED_ZERO_STAGE=1"], result.stdout
