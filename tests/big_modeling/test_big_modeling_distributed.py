"""Checkpoint loading across real processes (hasten launch): DTensor-sharded models, broadcast from rank 0."""
from helpers import run_launch


def test_loading_into_sharded_and_replicated_models_on_two_processes():
    result = run_launch("check_big_modeling.py", num_processes=2)
    assert "check_big_modeling OK on 2 processes" in result.stdout
