"""Checkpoints already on users' disks keep loading: the folders in ``formats_2026_12_05/`` were written by
``save_state`` on 2026-12-05 (tests/checkpointing/make_format_fixtures.py: the full-state files on one process, FSDP2's
sharded DCP folders and DeepSpeed ZeRO-2's engine folders on two), and each must load, on one process without their
backend, into exactly the weights they were saved with, and give the optimizer its state. A change to how a format
is named, written or recognised that stops reading them fails here."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from make_format_fixtures import tiny_model

FIXTURES = Path(__file__).resolve().parent / "formats_2026_12_05"


@pytest.mark.parametrize("kind", ["full", "fsdp", "deepspeed"])
def test_a_checkpoint_of_an_earlier_day_loads_into_the_weights_it_was_saved_with(kind):
    from hasten import Accelerator
    from hasten.state import AcceleratorState

    AcceleratorState._reset_state(True)
    try:
        accelerator = Accelerator(cpu=True)
        model = tiny_model()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        model, optimizer = accelerator.prepare(model, optimizer)
        accelerator.load_state(FIXTURES / kind / "checkpoint")
        expected = torch.load(FIXTURES / kind / "weights.pt", weights_only=True)
        loaded = accelerator.unwrap_model(model).state_dict()
        assert loaded.keys() == expected.keys()
        assert all(torch.equal(loaded[name], expected[name]) for name in expected), kind
        # two SGD steps with momentum were taken: every parameter has its momentum buffer back
        buffers = [optimizer.optimizer.state[p].get("momentum_buffer") for p in model.parameters()]
        assert all(buffer is not None and buffer.abs().sum() > 0 for buffer in buffers), kind
    finally:
        AcceleratorState._reset_state(True)
