"""Loading never runs code from a checkpoint unless asked: weights_only everywhere, an allow-list of plain value
types, and an error naming the opt-in for anything else."""
import datetime
import decimal
import fractions
import os
import pathlib

import numpy as np
import pytest
import torch
from torch import nn

from hasten import Accelerator
from hasten.checkpointing import SAFE_TYPES, UnsafeCheckpointError
from hasten.checkpointing.safe_load import load_pickle_file
from hasten.state import AcceleratorState, GradientState


class Holder:
    """A registered object whose state is whatever the test puts in it."""

    def __init__(self, state=None):
        self.state = state

    def state_dict(self):
        return self.state

    def load_state_dict(self, state):
        self.state = state


class Custom:
    """A user class: unpickling it runs its module's code, so it is not allowed by default."""

    def __init__(self, value):
        self.value = value

    def __eq__(self, other):
        return isinstance(other, Custom) and other.value == self.value


def round_trip(tmp_path, state, load_kwargs=None):
    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    accelerator = Accelerator(cpu=True)
    accelerator.prepare(nn.Linear(1, 1))
    accelerator.register_for_checkpointing(Holder(state))
    accelerator.save_state(tmp_path / "ckpt")
    AcceleratorState._reset_state(True)
    accelerator = Accelerator(cpu=True)
    accelerator.prepare(nn.Linear(1, 1))
    holder = Holder()
    accelerator.register_for_checkpointing(holder)
    accelerator.load_state(tmp_path / "ckpt", load_kwargs=load_kwargs)
    return holder.state


def test_plain_values_numpy_and_the_allow_listed_types_load_safely(tmp_path):
    state = {
        "when": datetime.datetime(2024, 5, 1, 12, tzinfo=datetime.timezone.utc), "day": datetime.date(2024, 5, 2),
        "time": datetime.time(3, 4), "elapsed": datetime.timedelta(hours=2), "price": decimal.Decimal("1.25"),
        "ratio": fractions.Fraction(2, 3), "path": pathlib.PurePosixPath("/data/x"), "tags": frozenset({"a"}),
        "range": range(2, 9, 3), "window": slice(1, 5), "set": {1, 2}, "complex": 1 + 2j,
        "array": np.arange(4, dtype=np.int16), "scalar": np.float64(0.5), "tensor": torch.ones(2),
        "nested": [(1, "two", None, 3.5, b"bytes")],
    }
    loaded = round_trip(tmp_path, state)
    assert loaded.keys() == state.keys()
    for key, value in state.items():
        if isinstance(value, (np.ndarray, torch.Tensor)):
            assert (loaded[key] == value).all() and loaded[key].dtype == value.dtype
        else:
            assert loaded[key] == value and type(loaded[key]) is type(value), key
    assert {datetime.datetime, decimal.Decimal, fractions.Fraction, frozenset} <= set(SAFE_TYPES)


def test_a_user_class_is_refused_with_an_error_naming_it_and_the_opt_ins(tmp_path):
    with pytest.raises(UnsafeCheckpointError) as caught:
        round_trip(tmp_path, {"custom": Custom(3)})
    message = str(caught.value)
    assert "custom_checkpoint_0.pkl" in message and "test_checkpointing_safety.Custom" in message
    assert 'load_kwargs={"weights_only": False}' in message and "add_safe_globals" in message


def test_the_opt_ins_accept_it(tmp_path):
    assert round_trip(tmp_path, {"custom": Custom(3)}, load_kwargs={"weights_only": False}) == {"custom": Custom(3)}
    with torch.serialization.safe_globals([Custom]):
        assert round_trip(tmp_path, {"custom": Custom(4)}) == {"custom": Custom(4)}


class Exploit:
    """A pickle that would run a command when loaded without weights_only."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_malicious_pickle_is_refused_and_runs_nothing(tmp_path):
    marker = tmp_path / "pwned"
    path = tmp_path / "optimizer.bin"
    torch.save({"state": Exploit(marker)}, path)
    with pytest.raises(UnsafeCheckpointError, match=r"optimizer\.bin .*system"):
        load_pickle_file(path, "optimizer 0")
    assert not marker.exists()


def test_random_states_load_with_weights_only(tmp_path):
    """The RNG file holds only plain types, tensors and NumPy arrays: weights_only=True reads it as is."""
    AcceleratorState._reset_state(True)
    accelerator = Accelerator(cpu=True)
    accelerator.save_state(tmp_path / "ckpt")
    states = load_pickle_file(tmp_path / "ckpt" / "random_states_0.pkl", "random states")
    assert {"step", "random_state", "numpy_random_seed", "torch_manual_seed"} <= set(states)
