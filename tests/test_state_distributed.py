"""Process state across real processes (hasten launch)."""
from helpers import run_launch


def test_state_two_processes():
    result = run_launch("check_state.py", num_processes=2)
    assert "check_state OK on 2 processes" in result.stdout


def test_state_three_processes():
    result = run_launch("check_state.py", num_processes=3)
    assert "check_state OK on 3 processes" in result.stdout
