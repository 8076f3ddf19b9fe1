"""hasten.utils.operations across real processes (hasten launch): collectives, padding and mismatch errors."""
from helpers import run_launch


def test_operations_two_processes():
    result = run_launch("check_operations.py", num_processes=2)
    assert "check_operations OK on 2 processes" in result.stdout
