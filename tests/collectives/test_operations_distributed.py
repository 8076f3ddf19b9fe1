"""hasten's collectives across real processes: the packaged script ``hasten.test_utils.scripts.test_ops`` (collectives,
padding, mismatch errors) under ``hasten launch`` and, as Accelerate's test suites call it, under ``debug_launcher``."""
from helpers import run_launch

from hasten.test_utils import path_in_hasten_package

TEST_OPS = path_in_hasten_package("test_utils", "scripts", "test_ops.py")


def test_operations_two_processes():
    result = run_launch(TEST_OPS, num_processes=2)
    assert "test_ops OK on 2 processes" in result.stdout
