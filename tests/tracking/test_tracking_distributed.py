"""TensorBoard and JSONL from a 2-process run: written once (by rank 0), read back with the logged values and
steps (the checks run inside tests/tracking/check_tracking.py)."""
from helpers import run_launch


def test_two_processes_log_through_one_writer(tmp_path):
    result = run_launch("check_tracking.py", tmp_path, timeout=180)
    assert result.stdout.count("TRACKING OK") == 1  # printed by rank 0 only, after its checks
    assert sorted(path.name for path in (tmp_path / "dist").iterdir() if path.is_file()
                  and not path.name.startswith("events")) == ["config.json", "metrics.jsonl"]
    [sub_run] = [path for path in (tmp_path / "dist").iterdir() if path.is_dir()]  # hyperparameters: one sub-run
    assert sorted(path.name.split(".")[0] for path in sub_run.iterdir()) == ["events", "hparams"]
