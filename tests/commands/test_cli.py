"""The `hasten` command line without launching anything: parsing, validation, the launch plan, env, config."""
from __future__ import annotations

import json
import os
import platform
import socket
import subprocess
import sys
import textwrap

import pytest
import yaml

from helpers import ROOT, clean_env
from launch_fixtures import no_launch, script  # noqa: F401 - pytest fixtures
from hasten.commands import cli
from hasten.commands import launch as launch_command
from hasten.commands.errors import CommandError
from hasten.commands.launch_plan import RUNNER_MODULE, build_plan
from hasten.commands.launch import launch_command_parser, load_launch_config


def plan_for(argv, config=None, config_path=None, **machine):
    """The launch plan for `hasten launch ARGV` on a made-up machine (8 cores, no GPU, port 41234 free)."""
    args = launch_command_parser().parse_args(argv)
    machine.setdefault("environ", {})
    machine.setdefault("cpu_count", 8)
    machine.setdefault("count_accelerators", lambda: 0)
    machine.setdefault("find_free_port", lambda: 41234)
    machine.setdefault("is_port_in_use", lambda port, host: False)
    return build_plan(args, config, config_path, **machine)


def torchrun_view(plan):
    """The plan's torchrun arguments as torchrun itself parses them."""
    from torch.distributed import run as torchrun

    return torchrun.parse_args(plan.torchrun_args)


def write_config(path, **settings):
    path.write_text(yaml.safe_dump(settings))
    return str(path)


# ------------------------------------------------------------------------------------------ the command table
def test_help_lists_every_command(capsys):
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    for name in ("launch", "env", "config", "test", "estimate-memory"):
        assert name in out


def test_version_and_no_command(capsys):
    from hasten import __version__

    assert cli.main(["--version"]) == 0
    assert __version__ in capsys.readouterr().out
    assert cli.main([]) == 2
    assert "COMMAND" in capsys.readouterr().err


def test_unknown_command_is_a_usage_error(capsys):
    assert cli.main(["lanch", "x.py"]) == 2
    assert "invalid choice" in capsys.readouterr().err


def test_a_missing_command_module_breaks_only_itself(monkeypatch, capsys):
    monkeypatch.setitem(cli.COMMANDS, "broken", "hasten.commands._no_such_module_here")
    assert cli.main(["broken"]) == 2
    assert "`broken` command is not available" in capsys.readouterr().err
    assert cli.main(["--help"]) == 0
    assert "broken" in capsys.readouterr().out
    assert cli.main(["launch", "--help"]) == 0
    assert "--num_processes" in capsys.readouterr().out


def test_cli_start_up_does_not_import_torch():
    code = textwrap.dedent("""
        import sys
        from hasten.commands import cli
        for argv in (["--help"], ["launch", "--help"], ["config", "--help"], ["test", "--help"], ["env", "--help"]):
            assert cli.main(argv) == 0, argv
        heavy = [name for name in ("torch", "numpy") if name in sys.modules]
        assert not heavy, heavy
        print("light")
    """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=clean_env(), cwd=ROOT)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().endswith("light")


def test_console_script_is_the_same_command():
    executable = os.path.join(os.path.dirname(sys.executable), "hasten")
    if not os.path.exists(executable):
        pytest.skip("hasten console script not installed in this environment")
    result = subprocess.run([executable, "--version"], capture_output=True, text=True, env=clean_env())
    assert result.returncode == 0 and result.stdout.startswith("hasten ")


# ------------------------------------------------------------------------------------------ parsing
def test_every_multi_word_flag_accepts_dashes_and_underscores():
    parser = launch_command_parser()
    for action in parser._actions:
        for option in action.option_strings:
            if option.startswith("--") and "_" in option:
                assert option.replace("_", "-") in action.option_strings, option


def test_dashed_and_underscored_spellings_parse_the_same(script):
    parser = launch_command_parser()
    underscored = parser.parse_args(["--num_processes", "3", "--mixed_precision", "bf16", "--main_process_port", "0",
                                     "--gradient_accumulation_steps", "2", "--num_cpu_threads_per_process", "1",
                                     "--max_restarts", "1", script])
    dashed = parser.parse_args(["--num-processes", "3", "--mixed-precision", "bf16", "--main-process-port", "0",
                                "--gradient-accumulation-steps", "2", "--num-cpu-threads-per-process", "1",
                                "--max-restarts", "1", script])
    assert vars(underscored) == vars(dashed)
    assert underscored.num_processes == 3 and parser.parse_args(["-n", "3", script]).num_processes == 3


def test_arguments_after_the_script_belong_to_the_script(script):
    args = launch_command_parser().parse_args(["-n", "2", script, "-n", "5", "--cpu", "--mixed_precision", "x"])
    assert args.num_processes == 2 and args.cpu is False and args.mixed_precision is None
    assert args.nondefault == {"num_processes", "training_script", "training_script_args"}
    assert args.training_script == script
    assert args.training_script_args == ["-n", "5", "--cpu", "--mixed_precision", "x"]


# ------------------------------------------------------------------------------------------ the plan
def test_flags_become_hasten_environment_variables(script):
    plan = plan_for(["-n", "2", "--mixed_precision", "BF16", "--cpu", "--gradient_accumulation_steps", "4",
                     "--dynamo_backend", "inductor", "--debug", script])
    assert plan.env == {
        "HASTEN_MIXED_PRECISION": "bf16", "HASTEN_USE_CPU": "true", "HASTEN_GRADIENT_ACCUMULATION_STEPS": "4",
        "HASTEN_DYNAMO_BACKEND": "INDUCTOR", "HASTEN_DEBUG_MODE": "true", "OMP_NUM_THREADS": "4",
    }


def test_settings_not_given_are_not_exported(script):
    plan = plan_for(["-n", "2", script])
    assert not [key for key in plan.env if key.startswith("HASTEN_")]


def test_exported_settings_read_back_through_the_precedence_rule(script):
    from hasten.config.enums import PrecisionType
    from hasten.config.resolution import resolve
    from hasten.core.environment import is_debug_mode
    from hasten.core.env_vars import parse_flag_from_env, patch_environment

    plan = plan_for(["-n", "2", "--mixed_precision", "fp16", "--cpu", "--debug", script])
    with patch_environment(**plan.env):
        value, source = resolve("mixed_precision", parse=lambda v: PrecisionType.parse(v, "mixed_precision"))
        assert value == PrecisionType.FP16 and source.kind == "environment"
        assert parse_flag_from_env("HASTEN_USE_CPU") and is_debug_mode()


def test_single_machine_plan_is_what_torchrun_expects(script):
    plan = plan_for(["-n", "3", script, "--lr", "0.1"])
    parsed = torchrun_view(plan)
    assert parsed.nproc_per_node == "3" and parsed.nnodes == "1" and parsed.node_rank == 0
    assert parsed.rdzv_backend == "static" and parsed.master_addr == "127.0.0.1" and parsed.master_port == 41234
    assert parsed.module and parsed.training_script == RUNNER_MODULE
    assert parsed.training_script_args == ["path", script, "--lr", "0.1"]
    assert parsed.max_restarts == 0 and parsed.monitor_interval == pytest.approx(0.1)


def test_module_and_no_python_forms(script, tmp_path, monkeypatch):
    package = tmp_path / "my_pkg_for_launch"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "train.py").write_text("")
    monkeypatch.chdir(tmp_path)
    parsed = torchrun_view(plan_for(["-n", "2", "-m", "my_pkg_for_launch.train", "--x", "1"]))
    assert parsed.module and parsed.training_script_args == ["module", "my_pkg_for_launch.train", "--x", "1"]
    parsed = torchrun_view(plan_for(["-n", "2", "--no_python", "true", "a"]))
    assert parsed.no_python and not parsed.module and parsed.training_script == "true"
    assert parsed.training_script_args == ["a"]


def test_num_processes_is_the_total_over_machines(script):
    plan = plan_for(["--num_processes", "8", "--num_machines", "2", "--machine_rank", "1", "--main_process_ip",
                     "10.0.0.1", script])
    parsed = torchrun_view(plan)
    assert (parsed.nproc_per_node, parsed.nnodes, parsed.node_rank) == ("4", "2", 1)
    assert (parsed.master_addr, parsed.master_port) == ("10.0.0.1", 29500)


def test_multi_machine_layout_matches_accelerate(script, tmp_path, monkeypatch):
    pytest.importorskip("accelerate")
    from accelerate.commands.launch import _validate_launch_command
    from accelerate.commands.launch import launch_command_parser as accelerate_parser
    from accelerate.utils.launch import prepare_multi_gpu_env
    from torch.distributed.run import get_rdzv_endpoint

    monkeypatch.setenv("HF_HOME", str(tmp_path))  # no Accelerate config file of this machine
    flags = ["--num_processes", "8", "--num_machines", "2", "--machine_rank", "1", "--main_process_ip",
             "10.0.0.1", "--main_process_port", "29555"]
    theirs, _, _ = _validate_launch_command(accelerate_parser().parse_args(["--multi_gpu", *flags, script]))
    prepare_multi_gpu_env(theirs)
    ours = torchrun_view(plan_for([*flags, script]))
    assert (ours.nproc_per_node, ours.nnodes, ours.node_rank) == (theirs.nproc_per_node, theirs.nnodes,
                                                                   theirs.node_rank)
    assert get_rdzv_endpoint(ours) == theirs.rdzv_endpoint


def test_other_rendezvous_backends_use_an_endpoint(script):
    parsed = torchrun_view(plan_for(["-n", "4", "--num_machines", "2", "--main_process_ip", "node0",
                                     "--main_process_port", "29600", "--rdzv_backend", "c10d", "--rdzv_conf",
                                     "join_timeout=60", script]))
    assert parsed.rdzv_backend == "c10d" and parsed.rdzv_endpoint == "node0:29600"
    assert parsed.rdzv_conf == "join_timeout=60"


def test_restarts_monitoring_and_logs_pass_through(script, tmp_path):
    parsed = torchrun_view(plan_for(["-n", "2", "--max_restarts", "3", "--monitor_interval", "0.5", "-t", "3",
                                     "--log_dir", str(tmp_path), "--rdzv_backend", "c10d", script]))
    assert parsed.max_restarts == 3 and parsed.monitor_interval == 0.5
    assert parsed.tee == "3" and parsed.log_dir == str(tmp_path)


def test_restarts_use_a_rendezvous_that_can_form_the_group_again(script):
    plan = plan_for(["-n", "2", "--max_restarts", "2", script])
    parsed = torchrun_view(plan)
    assert parsed.rdzv_backend == "c10d" and parsed.rdzv_endpoint == "localhost:0" and parsed.max_restarts == 2
    assert plan.env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"
    parsed = torchrun_view(plan_for(["-n", "2", "--max_restarts", "1", "--main_process_port", "29611", script]))
    assert parsed.rdzv_backend == "c10d" and parsed.rdzv_endpoint == "127.0.0.1:29611"
    assert "TORCH_DISABLE_SHARE_RDZV_TCP_STORE" not in plan_for(["-n", "2", script]).env
    with pytest.raises(CommandError, match="--rdzv_backend c10d"):
        plan_for(["-n", "4", "--num_machines", "2", "--main_process_ip", "h", "--max_restarts", "1", script])
    parsed = torchrun_view(plan_for(["-n", "4", "--num_machines", "2", "--main_process_ip", "h", "--max_restarts",
                                     "1", "--rdzv_backend", "c10d", script]))
    assert parsed.rdzv_endpoint == "h:29500"


def test_root_cause_is_the_failure_that_was_not_stopped_by_the_launcher():
    from types import SimpleNamespace

    victim = SimpleNamespace(exitcode=-15, timestamp=100)  # stopped by the agent, recorded a secondary error early
    culprit = SimpleNamespace(exitcode=5, timestamp=101)
    assert launch_command.root_cause({0: victim, 1: culprit}) == (1, culprit)
    assert launch_command.root_cause({0: victim}) == (0, victim)
    first = SimpleNamespace(exitcode=1, timestamp=100)
    assert launch_command.root_cause({3: SimpleNamespace(exitcode=1, timestamp=102), 2: first}) == (2, first)


def test_default_number_of_processes(script):
    assert plan_for([script], count_accelerators=lambda: 0).settings["num_processes"] == 1
    plan = plan_for([script], count_accelerators=lambda: 4)
    assert plan.settings["num_processes"] == 4 and torchrun_view(plan).nproc_per_node == "4"
    assert any("one per accelerator" in note for note in plan.notes)
    assert plan_for(["--cpu", script], count_accelerators=lambda: 4).settings["num_processes"] == 1


# ------------------------------------------------------------------------------------------ threads and ports
@pytest.mark.parametrize("argv, cores, expected", [
    (["-n", "2"], 8, "4"),
    (["-n", "3"], 8, "2"),
    (["-n", "16"], 8, "1"),
    (["-n", "8", "--num_machines", "2", "--main_process_ip", "h"], 8, "2"),  # 4 processes on this machine
])
def test_default_threads_share_the_cores_of_this_machine(script, argv, cores, expected):
    assert plan_for([*argv, script], cpu_count=cores).env["OMP_NUM_THREADS"] == expected


def test_threads_already_set_or_given_explicitly(script):
    assert "OMP_NUM_THREADS" not in plan_for(["-n", "2", script], environ={"OMP_NUM_THREADS": "7"}).env
    plan = plan_for(["-n", "2", "--num_cpu_threads_per_process", "3", script], environ={"OMP_NUM_THREADS": "7"})
    assert plan.env["OMP_NUM_THREADS"] == "3"


def test_a_free_port_is_picked_on_one_machine(script):
    for argv in (["-n", "2"], ["-n", "2", "--main_process_port", "0"]):
        args = launch_command_parser().parse_args([*argv, script])
        port = int(torchrun_view(build_plan(args, environ={}, count_accelerators=lambda: 0)).master_port)
        assert 0 < port < 65536
        with socket.socket() as sock:  # really free: we can listen on it
            sock.bind(("127.0.0.1", port))
    assert torchrun_view(plan_for(["-n", "2", "--main_process_port", "29777", script])).master_port == 29777


def test_a_busy_port_is_an_error_before_launch(script):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(1)
        busy = sock.getsockname()[1]
        args = launch_command_parser().parse_args(["-n", "2", "--main_process_port", str(busy), script])
        with pytest.raises(CommandError, match="already in use"):
            build_plan(args, environ={}, count_accelerators=lambda: 0)


# ------------------------------------------------------------------------------------------ bad input
@pytest.mark.parametrize("argv, message", [
    (["--mixed_precision", "fp32", "{script}"], "Unknown mixed precision 'fp32'"),
    (["-n", "0", "{script}"], "at least 1"),
    (["-n", "3", "--num_machines", "2", "--main_process_ip", "h", "{script}"], "divisible by --num_machines 2"),
    (["-n", "2", "no_such_script_here.py"], "does not exist"),
    (["-n", "4", "--num_machines", "2", "{script}"], "needs --main_process_ip"),
    (["-n", "2", "--num_machines", "2", "--machine_rank", "2", "--main_process_ip", "h", "{script}"],
     "--machine_rank 2 must be smaller"),
    (["-n", "2", "--num_machines", "2", "--main_process_ip", "h", "--main_process_port", "0", "{script}"],
     "only works on one machine"),
    (["-m", "--no_python", "x"], "cannot be used together"),
    (["-n", "2", "-m", "no_such_module_anywhere_xyz"], "no module named"),
    (["-n", "2", "--no_python", "no-such-executable-xyz"], "no such executable"),
    (["--rdzv_backend", "zookeeper", "{script}"], "unknown rendezvous backend"),
    (["--rdzv_conf", "timeout", "{script}"], "key=value"),
    (["--tee", "9", "{script}"], "--tee '9'"),
    (["--gradient_accumulation_steps", "0", "{script}"], "at least 1"),
    (["--dynamo_backend", "warp", "{script}"], "Unknown dynamo backend"),
    (["--config_file", "/no/such/config.yaml", "{script}"], "no such file"),
])
def test_bad_input_is_reported_before_anything_starts(script, no_launch, capsys, argv, message):
    argv = [item.replace("{script}", script) for item in argv]
    assert cli.main(["launch", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hasten launch: error:") and message in err, err


def test_missing_script_argument_is_a_usage_error(no_launch, capsys):
    assert cli.main(["launch", "-n", "2"]) == 2
    assert "SCRIPT" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------ config files
def test_config_values_equal_to_the_defaults_are_not_exported(script, tmp_path):
    """`hasten config default` writes mixed_precision: no; exporting it would contradict a choice made in code."""
    path = write_config(tmp_path / "cfg.yaml", num_processes=1, mixed_precision="no", use_cpu=False,
                        gradient_accumulation_steps=1, dynamo_config={"dynamo_backend": "NO"})
    config_path, config = load_launch_config(path)
    plan = plan_for(["--config_file", path, script], config, config_path)
    assert not {"HASTEN_MIXED_PRECISION", "HASTEN_USE_CPU", "HASTEN_GRADIENT_ACCUMULATION_STEPS",
                "HASTEN_DYNAMO_BACKEND"} & set(plan.env)
    flagged = plan_for(["--config_file", path, "--mixed_precision", "no", script], config, config_path)
    assert flagged.env["HASTEN_MIXED_PRECISION"] == "no"  # an explicit flag is always the launcher's word


def test_config_file_drives_the_launch(script, tmp_path):
    path = write_config(tmp_path / "cfg.yaml", num_processes=2, mixed_precision="fp16", use_cpu=True,
                        gradient_accumulation_steps=3, debug=True,
                        dynamo_config={"dynamo_backend": "EAGER", "dynamo_mode": "default"})
    config_path, config = load_launch_config(path)
    plan = plan_for(["--config_file", path, script], config, config_path)
    assert plan.notes == []
    assert torchrun_view(plan).nproc_per_node == "2"
    assert plan.env == {
        "HASTEN_MIXED_PRECISION": "fp16", "HASTEN_USE_CPU": "true", "HASTEN_GRADIENT_ACCUMULATION_STEPS": "3",
        "HASTEN_DEBUG_MODE": "true", "HASTEN_DYNAMO_BACKEND": "EAGER",
        "HASTEN_CONFIG_FILE": path, "HASTEN_CONFIG_FILE_APPLIED": "true", "OMP_NUM_THREADS": "4",
    }


def test_a_flag_overrides_the_config_file_and_says_so(script, tmp_path, no_launch):
    path = write_config(tmp_path / "cfg.yaml", num_processes=2, mixed_precision="fp16")
    config_path, config = load_launch_config(path)
    plan = plan_for(["--config_file", path, "--num_processes", "4", "--mixed_precision", "bf16", script], config,
                    config_path)
    assert plan.notes == [f"hasten launch: --num_processes 4 overrides num_processes: 2 from {path}",
                          f"hasten launch: --mixed_precision bf16 overrides mixed_precision: fp16 from {path}"]
    assert plan.env["HASTEN_MIXED_PRECISION"] == "bf16" and torchrun_view(plan).nproc_per_node == "4"
    same = plan_for(["--config_file", path, "-n", "2", script], config, config_path)
    assert same.notes == []


def test_strategy_from_the_config_file_is_announced(script, tmp_path):
    path = write_config(tmp_path / "cfg.yaml", distributed_type="FSDP", num_processes=2,
                        fsdp_config={"fsdp_version": 2})
    config_path, config = load_launch_config(path)
    assert plan_for([script], config, config_path).env["HASTEN_USE_FSDP"] == "true"


def test_the_default_config_file_is_used_when_present(tmp_path, monkeypatch):
    monkeypatch.setenv("HASTEN_CONFIG_HOME", str(tmp_path))
    assert load_launch_config(None) == (None, None)
    write_config(tmp_path / "default_config.yaml", num_processes=3)
    path, config = load_launch_config(None)
    assert path == str(tmp_path / "default_config.yaml") and config["num_processes"] == 3


def test_a_broken_config_file_is_an_error(tmp_path):
    path = write_config(tmp_path / "cfg.yaml", mixed_precision="fp7")
    with pytest.raises(CommandError, match="fp7"):
        load_launch_config(path)


# ------------------------------------------------------------------------------------------ the worker-side runner
def _runner(*argv, env=None, cwd=None):
    return subprocess.run([sys.executable, "-m", RUNNER_MODULE, *argv], capture_output=True, text=True,
                          env=clean_env(**(env or {})), cwd=cwd or ROOT, timeout=120)


def test_runner_runs_a_script_like_python_does(tmp_path):
    script = tmp_path / "show.py"
    script.write_text("import json, sys\nprint(json.dumps([__name__, sys.argv, sys.path[0], __file__]))\n")
    result = _runner("path", str(script), "--a", "two words")
    assert result.returncode == 0, result.stderr
    plain = subprocess.run([sys.executable, str(script), "--a", "two words"], capture_output=True, text=True)
    assert json.loads(result.stdout) == json.loads(plain.stdout)
    folder = tmp_path / "app"  # a folder with __main__.py, like `python app`
    folder.mkdir()
    (folder / "__main__.py").write_text(script.read_text())
    result = _runner("path", str(folder), "x")
    plain = subprocess.run([sys.executable, str(folder), "x"], capture_output=True, text=True)
    assert result.returncode == 0 and json.loads(result.stdout)[:3] == json.loads(plain.stdout)[:3]


def test_runner_runs_a_module_like_python_m_does(tmp_path):
    package = tmp_path / "runner_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "show.py").write_text("import json, sys\nprint(json.dumps([__name__, __spec__.name, sys.argv]))\n")
    result = _runner("module", "runner_pkg.show", "x", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    plain = subprocess.run([sys.executable, "-m", "runner_pkg.show", "x"], capture_output=True, text=True,
                           cwd=tmp_path)
    assert json.loads(result.stdout) == json.loads(plain.stdout)


def test_runner_records_the_traceback_for_torchrun(tmp_path):
    script = tmp_path / "boom.py"
    script.write_text("def step():\n    raise ValueError('boom at step 3')\n\nstep()\n")
    error_file = tmp_path / "error.json"
    result = _runner("path", str(script), env={"TORCHELASTIC_ERROR_FILE": str(error_file)})
    assert result.returncode == 1
    assert "ValueError: boom at step 3" in result.stderr and "runpy" not in result.stderr
    assert result.stderr.splitlines()[1].strip().startswith(f'File "{script}"')  # the user's frame comes first
    recorded = json.loads(error_file.read_text())["message"]
    assert recorded["message"] == "ValueError: boom at step 3"
    assert "in step" in recorded["extraInfo"]["py_callstack"]


def test_runner_keeps_the_exit_status_of_sys_exit(tmp_path):
    script = tmp_path / "leave.py"
    script.write_text("import sys\nsys.exit(3)\n")
    assert _runner("path", str(script)).returncode == 3


# ------------------------------------------------------------------------------------------ env, config, test
def test_env_report(tmp_path, monkeypatch, capsys):
    import numpy
    import torch

    monkeypatch.setenv("HASTEN_CONFIG_HOME", str(tmp_path))
    write_config(tmp_path / "default_config.yaml", num_processes=2, mixed_precision="bf16")
    assert cli.main(["env"]) == 0
    out = capsys.readouterr().out
    for fact in (f"PyTorch version: {torch.__version__}", f"Python version: {platform.python_version()}",
                 f"NumPy version: {numpy.__version__}", str(tmp_path / "default_config.yaml"),
                 "mixed_precision: bf16", "```yaml", "Platform: "):
        assert fact in out, fact
    try:
        import accelerate
    except ImportError:
        assert "Accelerate (reference): not installed" in out
    else:
        assert f"Accelerate (reference): {accelerate.__version__}" in out


def test_env_report_without_config(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HASTEN_CONFIG_HOME", str(tmp_path))
    assert cli.main(["env"]) == 0
    out = capsys.readouterr().out
    assert "does not exist" in out and ("GPUs: " in out or "GPU: " in out)


def test_config_default_writes_once_and_never_overwrites(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HASTEN_CONFIG_HOME", str(tmp_path))
    assert cli.main(["config", "default", "--mixed_precision", "bf16"]) == 0
    path = tmp_path / "default_config.yaml"
    written = yaml.safe_load(path.read_text())
    assert written["mixed_precision"] == "bf16" and written["num_processes"] >= 1
    assert str(path) in capsys.readouterr().out
    before = path.read_text()
    assert cli.main(["config", "default", "--mixed_precision", "fp16"]) == 1
    assert "already exists" in capsys.readouterr().err
    assert path.read_text() == before


def test_config_default_elsewhere_and_bad_precision(tmp_path, capsys):
    target = tmp_path / "sub" / "mine.yaml"
    assert cli.main(["config", "default", "--config-file", str(target)]) == 0
    assert yaml.safe_load(target.read_text())["mixed_precision"] == "no"
    assert cli.main(["config", "default", "--config_file", str(tmp_path / "x.yaml"), "--mixed_precision", "fp3"]) == 2
    assert "fp3" in capsys.readouterr().err and not (tmp_path / "x.yaml").exists()
    assert cli.main(["config"]) == 2


def test_test_command_launches_the_bundled_sanity_script(tmp_path):
    from hasten.commands.test import sanity_launch_command

    command = sanity_launch_command(tmp_path / "cfg.yaml", 2)
    assert command[:4] == [sys.executable, "-m", "hasten", "launch"]
    assert command[4:8] == ["--config_file", str(tmp_path / "cfg.yaml"), "--num_processes", "2"]
    assert os.path.isfile(command[-1]) and command[-1].endswith("sanity_check.py")


# ------------------------------------------------------------------------------------------ the benchmark harness
def _harness():
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import harness
    finally:
        sys.path.remove(str(ROOT / "bench"))
    return harness


def test_harness_medians_ratios_and_unavailable_variants(monkeypatch, capsys):
    harness = _harness()
    monkeypatch.delenv("BENCH_REPEATS", raising=False)
    torch_times, hasten_times = iter([9.0, 2.0, 4.0, 3.0]), iter([9.0, 3.0, 9.0, 6.0])
    rows = harness.compare("demo", {"torch": lambda: next(torch_times), "hasten": lambda: next(hasten_times),
                                    "accelerate": None}, repeats=3, warmup=1)
    by_name = {row["variant"]: row for row in rows}
    assert by_name["torch"]["median_s"] == 3.0 and by_name["torch"]["min_s"] == 2.0  # the warm-up 9.0 is dropped
    assert by_name["hasten"]["median_s"] == 6.0 and by_name["hasten"]["ratio"] == pytest.approx(2.0)
    assert by_name["accelerate"]["median_s"] is None and by_name["accelerate"]["note"] == "not available"
    printed = capsys.readouterr().out
    assert "demo" in printed and "2.00x" in printed
    markdown = harness.to_markdown(rows)
    assert "| hasten | 6.000 s | 3.000 s | 3 | 2.00x |  |" in markdown


def test_harness_times_calls_and_honours_bench_repeats(monkeypatch):
    harness = _harness()
    monkeypatch.setenv("BENCH_REPEATS", "2")
    calls = []
    rows = harness.compare("timed", {"torch": lambda: calls.append(1)}, repeats=9, warmup=0, show=False)
    assert rows[0]["repeats"] == 2 and len(calls) == 2 and rows[0]["median_s"] >= 0 and rows[0]["ratio"] == 1.0
    with pytest.raises(ValueError, match="at least 1"):
        monkeypatch.setenv("BENCH_REPEATS", "0")
        harness.compare("none", {"torch": lambda: None})


def test_run_all_finds_the_benchmarks():
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import run_all
    finally:
        sys.path.remove(str(ROOT / "bench"))
    names = [path.name for path in run_all.discover()]
    assert "bench_launcher.py" in names and names == sorted(names)
    assert [path.name for path in run_all.discover(["launcher"])] == ["bench_launcher.py"]
    with pytest.raises(SystemExit, match="no benchmark named"):
        run_all.discover(["no_such_bench"])


def test_cpu_affinity_flag_reaches_the_script(script, tmp_path):
    plan = plan_for(["--enable_cpu_affinity", script], None, None)
    assert plan.env["HASTEN_CPU_AFFINITY"] == "true"
    path = write_config(tmp_path / "cfg.yaml", num_processes=1, enable_cpu_affinity=False)
    config_path, config = load_launch_config(path)
    assert "HASTEN_CPU_AFFINITY" not in plan_for(["--config_file", path, script], config, config_path).env


def test_prepare_multi_gpu_env_takes_a_namespace_built_by_hand(monkeypatch):
    """Callers build the Namespace with the options they care about (no script): the rest take the launcher's
    defaults, and torchrun's settings come back on it, the port as a string of digits (picked when 0)."""
    import argparse

    from hasten.utils.launch import prepare_multi_gpu_env

    monkeypatch.delenv("HASTEN_CONFIG_FILE", raising=False)
    args = argparse.Namespace(num_processes=1, num_machines=1, main_process_ip="127.0.0.1", main_process_port=0,
                              machine_rank=0, module=False, no_python=False, mixed_precision="bf16", use_fsdp=False,
                              config_file=None)
    env = prepare_multi_gpu_env(args)
    assert args.master_port.isdigit() and args.master_port != "0" and args.nproc_per_node == "1"
    assert env["HASTEN_MIXED_PRECISION"] == "bf16"


def test_convert_nargs_to_dict_types_name_value_pairs_and_refuses_a_mix_with_bare_flags():
    from hasten.utils.launch import _convert_nargs_to_dict

    converted = _convert_nargs_to_dict(["--model", "bert", "--do_train", "False", "--epochs", "3", "--lr", "5e-5",
                                        "--offset", "-1"])
    assert converted == {"model": "bert", "do_train": False, "epochs": 3, "lr": 5e-5, "offset": -1}
    assert isinstance(converted["epochs"], int) and isinstance(converted["lr"], float)
    assert _convert_nargs_to_dict(["--fast", "--quiet"]) == {"fast": True, "quiet": True}
    assert _convert_nargs_to_dict([]) == {}
    with pytest.raises(ValueError, match="--do_train, --do_predict"):
        _convert_nargs_to_dict(["--model", "bert", "--do_train", "--do_test", "False", "--do_predict"])
