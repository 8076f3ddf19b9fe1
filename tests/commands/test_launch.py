"""`hasten launch` for real: processes, settings, failures, `-m`, config files, `hasten test`.

Each launch costs a few seconds, so every launch checks many things at once (see the scripts in
tests/).
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import yaml
from helpers import ROOT, one_multiprocess_job_at_a_time, clean_env, run_real_launch

HERE = Path(__file__).resolve().parent  # the scripts these tests launch live beside them


def isolated_env(tmp_path, **extra):
    """A clean environment with no default config file and no inherited thread setting."""
    env = clean_env(HASTEN_CONFIG_HOME=str(tmp_path / "config-home"), **extra)
    env.pop("OMP_NUM_THREADS", None)
    return env


def run_hasten(*argv, env, timeout=240):
    """`python -m hasten ARGV` for the forms run_launch does not build (-m, no -n), one job at a time."""
    with one_multiprocess_job_at_a_time():
        return subprocess.run([sys.executable, "-m", "hasten", *argv], capture_output=True, text=True,
                              timeout=timeout, env=env, cwd=ROOT)


def usable_cores():
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def test_two_processes_get_ranks_and_settings(tmp_path):
    result = run_real_launch(
        "check_launch_env.py", "--world", "2", "--threads", "1", "--label", "two words",
        "--env", "HASTEN_MIXED_PRECISION=bf16", "--env", "HASTEN_GRADIENT_ACCUMULATION_STEPS=4",
        "--env", "HASTEN_DEBUG_MODE=true", "--env", "HASTEN_DYNAMO_BACKEND=NO",
        "--env", "HASTEN_USE_CPU=", "--env", "HASTEN_CONFIG_FILE=",
        num_processes=2, env=isolated_env(tmp_path),
        launch_args=("--mixed-precision", "bf16", "--gradient_accumulation_steps", "4", "--debug",
                     "--dynamo_backend", "no", "--num_cpu_threads_per_process", "1"),
    )
    assert "check_launch_env OK: 2 processes, MULTI_CPU" in result.stdout
    assert "port 29500" not in result.stdout  # a free port, not the fixed default


def test_four_processes_on_a_cpu_only_machine(tmp_path):
    threads = max(1, usable_cores() // 4)
    result = run_real_launch("check_launch_env.py", "--world", "4", "--threads", str(threads), "--env", "HASTEN_USE_CPU=",
                        num_processes=4, env=isolated_env(tmp_path))
    assert "check_launch_env OK: 4 processes, MULTI_CPU" in result.stdout


def test_a_failing_rank_ends_the_job_quickly_with_its_traceback(tmp_path):
    start = time.monotonic()
    result = run_real_launch("fail_one_rank.py", num_processes=2, env=isolated_env(tmp_path), check=False)
    elapsed = time.monotonic() - start
    assert result.returncode != 0
    assert elapsed < 60, f"the job took {elapsed:.0f} s to end; rank 0 was left waiting"
    output = result.stdout + result.stderr
    assert "ValueError: deliberate failure on rank 1" in output
    assert 'fail_one_rank.py", line' in output and "in load_batch" in output  # the traceback, not just the message
    assert "Root Cause" in result.stderr and "fail_one_rank.py FAILED" in result.stderr
    assert "passed the barrier" not in output


def test_launch_command_called_in_process_raises_when_the_job_fails(tmp_path):
    """Accelerate's ``launch_command(args)`` from Python (tools and tests call it): a failed job raises
    ``CalledProcessError`` with its exit status instead of returning it; a job that succeeds returns None."""
    failing, passing = tmp_path / "fails.py", tmp_path / "passes.py"
    failing.write_text("import sys\nsys.exit(3)\n")
    passing.write_text("print('fine')\n")
    program = (
        "import subprocess, sys\n"
        "from hasten.commands.launch import launch_command, launch_command_parser\n"
        "parser = launch_command_parser()\n"
        f"print('RESULT', launch_command(parser.parse_args(['--num_processes', '1', {str(passing)!r}])))\n"
        "try:\n"
        f"    launch_command(parser.parse_args(['--num_processes', '1', {str(failing)!r}]))\n"
        "except subprocess.CalledProcessError as failure:\n"
        "    print('RAISED', failure.returncode, failure.cmd[1])\n"
    )
    with one_multiprocess_job_at_a_time():
        result = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                                env=isolated_env(tmp_path), timeout=180)
    assert "RESULT None" in result.stdout and f"RAISED 3 {failing}" in result.stdout, result.stdout + result.stderr


def test_module_form_driven_by_a_config_file(tmp_path):
    package = tmp_path / "launch_probe_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    shutil.copy(HERE / "check_launch_env.py", package / "check_launch_env.py")
    config = tmp_path / "cfg.yaml"
    config.write_text(yaml.safe_dump({"num_processes": 2, "mixed_precision": "fp16", "use_cpu": True,
                                      "gradient_accumulation_steps": 3, "distributed_type": "MULTI_CPU"}))
    env = isolated_env(tmp_path)
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env["PYTHONPATH"]])
    module = "launch_probe_pkg.check_launch_env"
    result = run_hasten(
        "launch", "--config_file", str(config), "--mixed_precision", "bf16", "-m", module,
        "--world", "2", "--module-name", module, "--env", "HASTEN_MIXED_PRECISION=bf16",
        "--env", "HASTEN_GRADIENT_ACCUMULATION_STEPS=3", "--env", "HASTEN_USE_CPU=true",
        "--env", f"HASTEN_CONFIG_FILE={config}", "--env", "HASTEN_DEBUG_MODE=",
        env=env,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "check_launch_env OK: 2 processes" in result.stdout  # the number of processes came from the file
    assert f"hasten launch: --mixed_precision bf16 overrides mixed_precision: fp16 from {config}" in result.stderr


def test_hasten_test_passes_with_a_config_file(tmp_path):
    config = tmp_path / "cfg.yaml"
    config.write_text(yaml.safe_dump({"num_processes": 2, "use_cpu": True}))
    result = run_hasten("test", "--config_file", str(config), env=isolated_env(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "hasten sanity check passed: 2 process(es), MULTI_CPU" in result.stdout
    assert "hasten test: PASSED" in result.stdout


def test_a_restarted_job_forms_a_fresh_group_and_finishes(tmp_path):
    result = run_real_launch("launch_restart.py", num_processes=2, launch_args=("--max_restarts", "1"),
                        env=isolated_env(tmp_path), timeout=180)
    assert "launch_restart OK after 1 restart(s)" in result.stdout
    assert "deliberate failure in the first attempt" in result.stderr


def test_worker_exit_keeps_normal_exit_guarantees(tmp_path):
    result = run_real_launch("launch_clean_exit.py", str(tmp_path), num_processes=2, check=False)
    assert result.returncode == 3, result.stderr[-3000:]
    for rank in (0, 1):
        assert (tmp_path / f"unclosed-{rank}.txt").read_text() == "flushed"
        assert (tmp_path / f"thread-{rank}.txt").read_text() == "joined"
        assert (tmp_path / f"atexit-{rank}.txt").read_text() == "ran"
