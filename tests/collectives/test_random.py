import importlib.util
import os
import random

import numpy as np
import pytest
import torch

from hasten.config.enums import RNGType
from hasten.state import PartialState
from hasten.utils import set_seed, synchronize_rng_state, synchronize_rng_states
import hasten.collectives.random as hasten_random


def draws():
    return random.random(), float(np.random.rand()), torch.rand(3).tolist()


def draws_after_manual_seed(seed):
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    return draws()


@pytest.fixture
def restore_determinism():
    before = (torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.deterministic,
              torch.backends.cudnn.benchmark)
    yield
    torch.use_deterministic_algorithms(before[0])
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = before[1], before[2]


def test_set_seed_seeds_python_numpy_and_torch():
    expected = draws_after_manual_seed(1234)
    draws()  # move every generator on
    set_seed(1234)
    assert draws() == expected


def test_device_specific_adds_the_process_index():
    PartialState()
    expected_alone = draws_after_manual_seed(7)
    set_seed(7, device_specific=True)  # a single process has index 0
    assert draws() == expected_alone
    PartialState._shared_state["process_index"] = 3  # as if this were the fourth process
    expected = draws_after_manual_seed(10)
    set_seed(7, device_specific=True)
    assert draws() == expected


def test_deterministic_turns_on_deterministic_algorithms(monkeypatch, restore_determinism):
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    torch.use_deterministic_algorithms(False)
    set_seed(0, deterministic=True)
    assert torch.are_deterministic_algorithms_enabled()
    assert torch.backends.cudnn.deterministic and not torch.backends.cudnn.benchmark
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"


def test_deterministic_keeps_a_user_cublas_setting(monkeypatch, restore_determinism):
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")
    set_seed(0, deterministic=True)
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":16:8"


def test_not_deterministic_by_default(restore_determinism):
    torch.use_deterministic_algorithms(False)
    set_seed(0)
    assert not torch.are_deterministic_algorithms_enabled()


@pytest.mark.parametrize("seed, error", [("42", TypeError), (1.5, TypeError), (True, TypeError),
                                         (-1, ValueError), (2**32, ValueError)])
def test_bad_seed_is_rejected_before_seeding(seed, error):
    torch.manual_seed(99)
    state = torch.get_rng_state()
    with pytest.raises(error):
        set_seed(seed)
    assert torch.equal(torch.get_rng_state(), state)


def test_numpy_integer_seed_is_accepted():
    expected = draws_after_manual_seed(5)
    set_seed(np.int64(5))
    assert draws() == expected


def test_single_process_synchronisation_changes_nothing():
    torch.manual_seed(3)
    expected = torch.rand(4)
    torch.manual_seed(3)
    synchronize_rng_state("torch")
    assert torch.equal(torch.rand(4), expected)

    generator = torch.Generator().manual_seed(11)
    expected = torch.randperm(10, generator=torch.Generator().manual_seed(11))
    synchronize_rng_state(RNGType.GENERATOR, generator=generator)
    assert torch.equal(torch.randperm(10, generator=generator), expected)


@pytest.mark.parametrize("bad", ["bogus", "TORCHX", 3])
def test_unknown_rng_type_names_the_valid_ones(bad):
    with pytest.raises(ValueError) as info:
        synchronize_rng_state(bad)
    for valid in ("'torch'", "'cuda'", "'xla'", "'generator'"):
        assert valid in str(info.value)


def test_rng_type_is_required():
    with pytest.raises(ValueError, match="needs an rng_type"):
        synchronize_rng_state()


def test_rng_type_names_are_case_insensitive():
    torch.manual_seed(1)
    expected = torch.rand(2)
    torch.manual_seed(1)
    synchronize_rng_state("TORCH")
    assert torch.equal(torch.rand(2), expected)


def test_generator_type_needs_a_generator():
    with pytest.raises(ValueError, match="generator="):
        synchronize_rng_state("generator")
    with pytest.raises(TypeError, match="torch.Generator"):
        synchronize_rng_state("generator", generator=np.random.default_rng())


def test_cuda_rng_needs_a_gpu():
    if torch.cuda.is_available():
        torch.cuda.manual_seed(5)
        expected = torch.rand(3, device="cuda")
        torch.cuda.manual_seed(5)
        synchronize_rng_state("cuda")
        assert torch.equal(torch.rand(3, device="cuda"), expected)
    else:
        with pytest.raises(RuntimeError, match="no CUDA device is available"):
            synchronize_rng_state("cuda")


def test_xla_rng_needs_torch_xla():
    if importlib.util.find_spec("torch_xla") is None:
        with pytest.raises(RuntimeError, match="torch_xla is not installed"):
            synchronize_rng_state("xla")
    else:
        synchronize_rng_state("xla")


def test_states_are_written_from_the_broadcast(monkeypatch):
    """Wiring: each generator gets what the broadcast returned (process 0's state in a real run)."""
    torch.manual_seed(100)
    main_torch_state = torch.get_rng_state()
    main_generator_state = torch.Generator().manual_seed(200).get_state()
    replies = iter([main_torch_state, main_generator_state])  # in the order of rng_types
    monkeypatch.setattr(hasten_random, "_broadcast_from_main", lambda state: next(replies).clone())
    torch.manual_seed(1)
    generator = torch.Generator().manual_seed(1)
    synchronize_rng_states(["torch", RNGType.GENERATOR], generator=generator)
    assert torch.equal(torch.rand(3), torch.rand(3, generator=torch.Generator().manual_seed(100)))
    assert torch.equal(torch.randperm(8, generator=generator),
                       torch.randperm(8, generator=torch.Generator().manual_seed(200)))


@pytest.mark.parametrize("rng_types", [["torch", "bogus"], ["torch", "generator"]])
def test_every_entry_is_checked_before_any_state_changes(monkeypatch, rng_types):
    torch.manual_seed(100)
    other = torch.get_rng_state()
    monkeypatch.setattr(hasten_random, "_broadcast_from_main", lambda state: other.clone())
    torch.manual_seed(5)
    before = torch.get_rng_state()
    with pytest.raises(ValueError):
        synchronize_rng_states(rng_types)  # the second entry is bad (unknown, or no generator given)
    assert torch.equal(torch.get_rng_state(), before)


def test_a_single_string_is_one_rng_type():
    torch.manual_seed(8)
    expected = torch.rand(2)
    torch.manual_seed(8)
    synchronize_rng_states("torch")
    assert torch.equal(torch.rand(2), expected)
