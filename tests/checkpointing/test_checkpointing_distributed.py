"""Checkpointing on 2 real processes (`hasten launch -n 2`): exact resume in a new process run, automatic resume
after a crash in the middle of a save, and checkpoints crossing over to and from the reference library."""
import importlib.util

import pytest

from helpers import run_launch


def test_a_run_stopped_mid_epoch_resumes_bitwise_exactly_in_a_new_process_run(tmp_path):
    result = run_launch("check_checkpoint_resume.py", "train", tmp_path, num_processes=2, timeout=300)
    assert "check_checkpoint_resume train OK" in result.stdout
    result = run_launch("check_checkpoint_resume.py", "resume", tmp_path, num_processes=2, timeout=300)
    assert "check_checkpoint_resume resume OK" in result.stdout
    for variant in ("skip", "stateful", "state"):
        assert f"rank 1: {variant} resume OK" in result.stdout


def test_a_job_killed_mid_save_is_restarted_from_the_newest_complete_checkpoint(tmp_path):
    result = run_launch("check_checkpoint_auto_resume.py", tmp_path, num_processes=2,
                        launch_args=("--max_restarts", "1"), timeout=300)
    shown = f"--- stdout\n{result.stdout}\n--- stderr\n{result.stderr[-6000:]}"
    assert "process 1 dies while .checkpoint_2.process_1.incomplete is being written" in result.stdout, shown
    assert "check_checkpoint_auto_resume OK after 1 restart" in result.stdout, shown


@pytest.mark.skipif(importlib.util.find_spec("accelerate") is None, reason="needs the `reference` extra")
def test_ddp_checkpoints_cross_over_with_the_reference_library(tmp_path):
    result = run_launch("check_checkpoint_reference.py", tmp_path, num_processes=2, timeout=300)
    assert "check_checkpoint_reference OK" in result.stdout
    for direction in ("hasten -> accelerate", "accelerate -> hasten"):
        assert f"rank 1: {direction} OK" in result.stdout
