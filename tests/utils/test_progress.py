"""Progress bars: ``progress_bar`` for library operations shows on the main process only and only when stdout is a
terminal; loading a checkpoint of several shards shows one; ``hasten.utils.tqdm`` stays Accelerate's function."""
from __future__ import annotations

import io
import json
import sys

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from hasten.state import PartialState
from hasten.utils import tqdm
from hasten.progress import progress_bar


class FakeTerminal(io.StringIO):
    def isatty(self):
        return True


def as_terminal(monkeypatch):
    """stdout replaced by a terminal (in the test body: pytest's capture resets stdout after fixtures)."""
    monkeypatch.setattr(sys, "stdout", FakeTerminal())


def test_progress_bar_is_off_when_stdout_is_not_a_terminal(monkeypatch):
    monkeypatch.setattr(sys, "stdout", io.StringIO())
    bar = progress_bar(range(3), desc="work")
    assert bar.disable and list(bar) == [0, 1, 2]


def test_progress_bar_shows_on_a_terminal_on_the_main_process_only(monkeypatch):
    as_terminal(monkeypatch)
    stream = io.StringIO()
    bar = progress_bar(range(4), desc="work", file=stream)
    assert not bar.disable
    assert list(bar) == [0, 1, 2, 3]
    assert "work" in stream.getvalue() and "4/4" in stream.getvalue()
    PartialState()
    monkeypatch.setattr(PartialState, "is_local_main_process", property(lambda self: False))
    assert progress_bar(range(2), desc="work").disable
    assert tqdm(range(2)).disable and not tqdm(range(2), main_process_only=False).disable


def test_loading_a_checkpoint_keeps_hasten_utils_tqdm_the_function(tmp_path):
    import hasten.big_modeling.loading  # noqa: F401 - imports the progress helper
    import hasten.utils

    assert callable(hasten.utils.tqdm) and hasten.utils.tqdm is tqdm


def test_progress_bar_without_tqdm_is_the_iterable(monkeypatch):
    monkeypatch.setitem(sys.modules, "tqdm.auto", None)
    items = [1, 2]
    assert progress_bar(items) is items


def sharded_checkpoint(folder, model):
    state = model.state_dict()
    names = list(state)
    half = len(names) // 2
    weight_map = {}
    for index, part in enumerate((names[:half], names[half:])):
        file = f"model-0000{index + 1}-of-00002.safetensors"
        save_file({name: state[name].clone() for name in part}, str(folder / file))
        weight_map.update({name: file for name in part})
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


@pytest.mark.parametrize("device_map", [None, {"": "cpu"}])
def test_loading_several_checkpoint_shards_shows_a_bar_on_a_terminal(tmp_path, monkeypatch, capsys, device_map):
    from hasten.big_modeling import load_checkpoint_in_model

    torch.manual_seed(0)
    source = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
    sharded_checkpoint(tmp_path, source)
    target = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
    as_terminal(monkeypatch)
    load_checkpoint_in_model(target, str(tmp_path), device_map=device_map)
    assert all(torch.equal(a, b) for a, b in zip(source.state_dict().values(), target.state_dict().values()))
    err = capsys.readouterr().err
    assert "Loading checkpoint shards" in err and "2/2" in err


def test_loading_is_quiet_when_stdout_is_not_a_terminal(tmp_path, capsys):
    from hasten.big_modeling import load_checkpoint_in_model

    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
    sharded_checkpoint(tmp_path, model)
    load_checkpoint_in_model(model, str(tmp_path))
    assert "Loading checkpoint shards" not in capsys.readouterr().err


def test_reading_a_sharded_checkpoint_into_one_process_counts_every_piece(tmp_path, monkeypatch):
    import torch
    import torch.distributed.checkpoint as dcp

    from hasten import progress
    from hasten.checkpointing import safe_dcp

    state = {"a": torch.ones(3), "b": torch.zeros(2, 2), "step": 7}
    dcp.save(state, checkpoint_id=str(tmp_path), no_dist=True)
    bars = []

    class Bar:
        def __init__(self, total):
            self.total, self.n, self.closed = total, 0, False
            bars.append(self)

        def update(self, count):
            self.n += count

        def close(self):
            self.closed = True

    monkeypatch.setattr(progress, "progress_bar", lambda total=None, **kwargs: Bar(total))
    loaded = safe_dcp.read_dcp_checkpoint(tmp_path)
    assert loaded["step"] == 7 and torch.equal(loaded["b"], torch.zeros(2, 2))
    (bar,) = bars
    assert bar.total == 3 and bar.n == 3 and bar.closed  # two tensors and one plain value
