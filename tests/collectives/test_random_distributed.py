"""RNG synchronisation and set_seed across 2 real processes (one launch runs every check)."""
from helpers import run_launch


def test_random_utilities_across_two_processes():
    result = run_launch("check_random.py", num_processes=2)
    assert "ALL RANDOM CHECKS PASSED" in result.stdout
