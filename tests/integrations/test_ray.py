"""Ray Train, for real: a local Ray cluster with 2 CPU workers runs hasten unchanged, a worker SIGKILLed mid-run is
restarted by Ray, the group resumes from the checkpoint every rank reported (Ray merged their folders), and the
run ends with exactly the weights of the same training uninterrupted under `hasten launch -n 2`. Then, in the same
Ray session, the training function of Ray's guide for Accelerate runs with HASTEN_AS_ACCELERATE=1 as one job of two
workers."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from helpers import clean_env, one_multiprocess_job_at_a_time, run_launch, script_path

pytest.importorskip("ray.train", reason="the `ray` extra (in make test's extras)")


def test_a_killed_ray_worker_resumes_from_the_merged_checkpoint_with_the_uninterrupted_weights(tmp_path):
    from hasten.integrations.ray import report

    run_launch("check_ray_resume.py", "plain", tmp_path)
    env = clean_env(RAY_USAGE_STATS_ENABLED=0, RAY_AUTH_MODE="disabled", RAY_TRAIN_ENABLE_PRINT_PATCH=0)
    with one_multiprocess_job_at_a_time():
        finished = subprocess.run([sys.executable, str(script_path("check_ray_resume.py")), "ray", str(tmp_path)],
                                  env=env, capture_output=True, text=True, timeout=300)
    log = finished.stdout[-4000:] + finished.stderr[-8000:]
    assert finished.returncode == 0 and "RAY DONE error=None" in finished.stdout, log
    assert os.path.exists(tmp_path / "killed_once"), log
    assert int((tmp_path / "resumed_from.txt").read_text()) >= 1, log  # a checkpoint of every rank's folders
    plain, ray_run = torch.load(tmp_path / "plain.pt"), torch.load(tmp_path / "ray.pt")
    for name, value in plain.items():
        assert torch.equal(value, ray_run[name]), name
    assert "RAY ACCELERATE DONE error=None checkpoint=True" in finished.stdout, log
    # accelerate is hasten's face, 2 processes, 4 of the 8 batches each (the loader sharded), one model
    assert [(tmp_path / f"accelerate_{rank}.txt").read_text() for rank in range(2)] == ["accelerate True 2 4 True"] * 2

    class Automatic:  # report refuses a project that names its own folders
        class project_configuration:
            automatic_checkpoint_naming = True

    with pytest.raises(ValueError, match="automatic checkpoint naming"):
        report(Automatic(), {})
