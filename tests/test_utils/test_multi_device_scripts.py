"""hasten's ``test_utils/scripts`` that Accelerate's multi-device and CLI suites launch by path
(``test_ddp_comm_hook.py``, ``test_distributed_data_loop.py``, ``test_merge_weights.py``, ``test_notebook.py``): each
passes as those suites run it, here on two gloo processes, and refuses loudly to run where it cannot check anything.
"""
from __future__ import annotations

import subprocess
import sys

import pytest
from helpers import ROOT, clean_env, run_launch

SCRIPTS = ROOT / "src" / "hasten" / "test_utils" / "scripts"


def one_process(script: str, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPTS / script)], capture_output=True, text=True, timeout=240,
                          env=env or clean_env(), cwd=ROOT)


def test_ddp_comm_hooks_give_plain_ddps_gradients():
    result = run_launch(SCRIPTS / "test_ddp_comm_hook.py", timeout=300)
    assert "DDP COMM HOOKS PASSED" in result.stdout
    for checked in ("fp16, comm wrapper: no", "power_sgd, comm wrapper: fp16", "batched_power_sgd, comm wrapper: no",
                    "power_sgd, comm wrapper: no, state options: {'matrix_approximation_rank': 2}"):
        assert f"Test DDP comm hook: {checked}" in result.stdout, checked
    assert "Left out (gloo has no bf16 all-reduce)" in result.stdout  # torch refuses bf16 hooks on gloo


def test_distributed_data_loop_on_two_processes():
    result = run_launch(SCRIPTS / "test_distributed_data_loop.py", timeout=300)
    assert "DISTRIBUTED DATA LOOP PASSED" in result.stdout
    assert "check_stateful_resume" in result.stdout and "check_join_uneven_inputs" in result.stdout


def test_merged_fsdp_weights_equal_the_trained_ones_for_both_fsdp_versions(tmp_path):
    result = run_launch(SCRIPTS / "test_merge_weights.py", "--output_dir", tmp_path / "merge", timeout=300)
    assert "MERGE WEIGHTS PASSED" in result.stdout
    assert result.stdout.count(": the trained weights") == 8  # 2 FSDP versions x 2 ways x 2 formats
    assert not (tmp_path / "merge").exists()  # cleaned up


def test_notebook_launcher_scenarios_on_two_processes():
    result = one_process("test_notebook.py", env=clean_env(ACCELERATE_NUM_PROCESSES="2"))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    for check in ("check_rendezvous_backends", "check_restarts", "check_a_failure_stops_the_others"):
        assert check in result.stdout, check
    assert "NOTEBOOK LAUNCHER PASSED" in result.stdout


@pytest.mark.parametrize("script, phrase", [
    ("test_ddp_comm_hook.py", "needs two or more processes"),
    ("test_merge_weights.py", "needs two or more processes"),
    ("test_distributed_data_loop.py", "runs on exactly 2 processes"),
])
def test_a_script_that_needs_two_processes_fails_on_one(script, phrase):
    result = one_process(script)
    assert result.returncode != 0 and phrase in result.stderr, result.stderr[-3000:]
