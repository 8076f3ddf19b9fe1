"""Training through the Accelerator with a bitsandbytes 8-bit optimizer: its state stays 8-bit (uint8) across
``prepare``, ``save_state`` and ``load_state``, and a resumed run is bitwise the uninterrupted one."""
from __future__ import annotations

import pytest
import torch

from hasten import Accelerator
from hasten.state import AcceleratorState
from hasten.utils import set_seed

bnb = pytest.importorskip("bitsandbytes")

from quantization_models import make_model  # noqa: E402

BATCHES = [torch.randint(0, 64, (4, 8), generator=torch.Generator().manual_seed(i)) for i in range(6)]


def _setup(optimizer_class):
    AcceleratorState._reset_state(True)
    set_seed(0)
    model = make_model().train()
    optimizer = optimizer_class(model.parameters(), lr=1e-3)
    accelerator = Accelerator(cpu=True)
    model, optimizer = accelerator.prepare(model, optimizer)
    return accelerator, model, optimizer


def _train(accelerator, model, optimizer, batches):
    for ids in batches:
        loss = model(ids).float().pow(2).mean()
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()


def _state_of(optimizer, param) -> dict:
    return {k: v.clone() for k, v in optimizer.state[param].items() if torch.is_tensor(v)}


@pytest.mark.parametrize("optimizer_class", [bnb.optim.Adam8bit, bnb.optim.AdamW8bit])
def test_8bit_optimizer_state_survives_save_and_load_bitwise(optimizer_class, tmp_path):
    accelerator, model, optimizer = _setup(optimizer_class)
    assert isinstance(optimizer.optimizer, optimizer_class)  # prepare kept the 8-bit optimizer
    _train(accelerator, model, optimizer, BATCHES[:3])
    weight = model.blocks[0].up.weight  # 16,384 elements: above bitsandbytes' 4,096 minimum for 8-bit state
    saved = _state_of(optimizer, weight)
    assert saved["state1"].dtype == torch.uint8 and saved["state2"].dtype == torch.uint8
    accelerator.save_state(str(tmp_path / "ckpt"))
    _train(accelerator, model, optimizer, BATCHES[3:])
    uninterrupted = {k: v.clone() for k, v in model.state_dict().items()}
    final_state = _state_of(optimizer, weight)

    accelerator, model, optimizer = _setup(optimizer_class)
    accelerator.load_state(str(tmp_path / "ckpt"))
    loaded = _state_of(optimizer, model.blocks[0].up.weight)
    assert loaded.keys() == saved.keys()
    for key, value in saved.items():
        assert loaded[key].dtype == value.dtype and torch.equal(loaded[key], value), key
    _train(accelerator, model, optimizer, BATCHES[3:])
    for key, value in model.state_dict().items():
        assert torch.equal(value, uninterrupted[key]), key
    resumed_state = _state_of(optimizer, model.blocks[0].up.weight)
    assert all(torch.equal(resumed_state[k], final_state[k]) for k in final_state)
    assert resumed_state["state1"].dtype == torch.uint8
    AcceleratorState._reset_state(True)
