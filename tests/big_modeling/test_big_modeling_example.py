"""The big-model example runs: part of the model on disk, output identical to the fully loaded model."""
import runpy
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "big_model_inference.py"


def test_example_offloads_blocks_and_matches(capsys):
    runpy.run_path(str(EXAMPLE), run_name="example")["main"]("60MB")
    out = capsys.readouterr().out
    assert "part(s) on disk: blocks." in out
    assert "identical to the fully loaded model: True" in out
