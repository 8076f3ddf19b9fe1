"""Data loading across 2 real processes (one launch runs every check of check_data_loading.py)."""
from helpers import run_launch


def test_data_loading_across_two_processes():
    result = run_launch("check_data_loading.py", num_processes=2)
    for name in ("sharding", "dispatcher", "rng synchronisation", "resume", "remainder", "device mesh"):
        assert f"ok: {name}" in result.stdout
    assert "ALL DATA CHECKS PASSED" in result.stdout
