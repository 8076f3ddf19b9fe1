"""Process state, data coverage and training equivalence across real processes: the packaged script
``hasten.test_utils.scripts.test_script`` (what Accelerate's ``test_script`` is) under ``hasten launch``."""
from helpers import run_launch

from hasten.test_utils import path_in_hasten_package

TEST_SCRIPT = path_in_hasten_package("test_utils", "scripts", "test_script.py")


def test_state_two_processes():
    result = run_launch(TEST_SCRIPT, num_processes=2)
    assert "test_script OK on 2 processes" in result.stdout
    lines = [line.split("]:")[-1].strip() for line in result.stdout.splitlines()]
    assert lines.count("logger-main-only") == 1
    assert lines.count("logger-everyone-0") == 1 and lines.count("logger-everyone-1") == 1
    assert [line for line in lines if line.startswith("logger-in-order")] == ["logger-in-order-0", "logger-in-order-1"] * 3


def test_state_three_processes():
    result = run_launch(TEST_SCRIPT, num_processes=3)
    assert "test_script OK on 3 processes" in result.stdout
