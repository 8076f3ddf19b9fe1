"""Process state across real processes (hasten launch)."""
from helpers import run_launch


def test_state_two_processes():
    result = run_launch("check_state.py", num_processes=2)
    assert "check_state OK on 2 processes" in result.stdout
    lines = [line.split("]:")[-1].strip() for line in result.stdout.splitlines()]
    assert lines.count("logger-main-only") == 1
    assert lines.count("logger-everyone-0") == 1 and lines.count("logger-everyone-1") == 1
    assert [line for line in lines if line.startswith("logger-in-order")] == ["logger-in-order-0", "logger-in-order-1"] * 3


def test_state_three_processes():
    result = run_launch("check_state.py", num_processes=3)
    assert "check_state OK on 3 processes" in result.stdout
