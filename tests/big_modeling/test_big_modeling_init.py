"""Empty-weight construction: parameters on meta (or another device), buffers optionally, ties preserved."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import hasten
from hasten.big_modeling import find_tied_parameters, init_empty_weights, init_on_device


class TiedDuringInit(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 4)
        self.b.weight = self.a.weight  # tie through an already-registered parameter
        shared = nn.Parameter(torch.ones(3))
        self.c = nn.Module()
        self.d = nn.Module()
        self.c.p = shared  # tie through one parameter registered twice
        self.d.p = shared
        self.register_buffer("steps", torch.arange(5))


def test_parameters_on_meta_buffers_stay_real():
    with init_empty_weights():
        model = TiedDuringInit()
    assert all(p.device.type == "meta" for p in model.parameters())
    assert model.steps.device.type == "cpu" and model.steps.tolist() == [0, 1, 2, 3, 4]


def test_include_buffers_puts_everything_on_meta():
    with init_empty_weights(include_buffers=True):
        model = TiedDuringInit()
    assert {t.device.type for t in model.state_dict().values()} == {"meta"}


def test_ties_made_during_construction_survive():
    plain = TiedDuringInit()
    expected = find_tied_parameters(plain)
    assert expected == [["a.weight", "b.weight"], ["c.p", "d.p"]]
    for include_buffers in (False, True):
        with init_empty_weights(include_buffers=include_buffers):
            model = TiedDuringInit()
        assert find_tied_parameters(model) == expected
        assert model.a.weight is model.b.weight


def test_parameter_attributes_and_flags_are_kept():
    with init_empty_weights():
        frozen = nn.Linear(2, 2)
        frozen.weight.requires_grad_(False)
        layer = nn.Linear(2, 2)
    assert layer.weight.requires_grad and isinstance(layer.weight, nn.Parameter)

    class Tagged(nn.Module):
        def __init__(self):
            super().__init__()
            p = nn.Parameter(torch.zeros(2), requires_grad=False)
            p.tag = "keep"
            self.p = p

    with init_empty_weights():
        tagged = Tagged()
    assert tagged.p.tag == "keep" and not tagged.p.requires_grad and tagged.p.device.type == "meta"


def test_the_patch_is_removed_even_on_error():
    original = nn.Module.register_parameter
    with pytest.raises(RuntimeError):
        with init_empty_weights():
            raise RuntimeError("boom")
    assert nn.Module.register_parameter is original
    assert nn.Linear(2, 2).weight.device.type == "cpu"


def test_init_on_device_cpu_and_environment_default(monkeypatch):
    with init_on_device("cpu"):
        model = nn.Linear(2, 2)
    assert model.weight.device.type == "cpu"
    monkeypatch.setenv("HASTEN_INIT_INCLUDE_BUFFERS", "1")
    with init_empty_weights():
        model = TiedDuringInit()
    assert model.steps.device.type == "meta"


def test_a_huge_model_costs_no_memory():
    with init_empty_weights():
        model = nn.Sequential(*[nn.Linear(20_000, 20_000) for _ in range(25)])  # 40 GB in float32
    assert sum(p.numel() for p in model.parameters()) > 10**10
    assert hasten.init_empty_weights is init_empty_weights
