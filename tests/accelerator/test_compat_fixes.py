"""Behaviours found by running the reference library's own test scripts migrated to hasten."""
from __future__ import annotations

import pickle
import warnings

import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

from hasten import Accelerator
from hasten.state import AcceleratorState


class _Numbers(IterableDataset):
    def __iter__(self):
        yield from range(6)


def test_a_second_accelerator_without_a_precision_keeps_the_runs_precision():
    Accelerator(mixed_precision="bf16")
    assert Accelerator().mixed_precision == "bf16"
    with pytest.raises(ValueError, match="cannot be changed"):
        Accelerator(mixed_precision="no")  # asking for another one explicitly is still an error


def test_an_accelerator_pickles_and_the_copy_shares_the_live_state():
    accelerator = Accelerator()
    loader = accelerator.prepare(DataLoader(TensorDataset(torch.arange(8.0)), batch_size=2))
    copy = pickle.loads(pickle.dumps(accelerator))
    assert copy.state.__dict__ == accelerator.state.__dict__
    assert copy.state.__dict__ is accelerator.state.__dict__  # joined this process's shared state
    prepared_copy = copy._dataloaders[0]
    assert copy.prepare(prepared_copy) is prepared_copy  # still known as prepared: not wrapped twice
    assert [batch[0].tolist() for batch in prepared_copy] == [batch[0].tolist() for batch in loader]


def test_the_reset_error_uses_the_wording_scripts_match_on():
    accelerator = Accelerator()
    AcceleratorState._reset_state()
    with pytest.raises(AttributeError) as caught:
        accelerator.prepare(torch.nn.Linear(1, 1))
    assert "`AcceleratorState` object has no attribute" in str(caught.value)
    assert "This happens if `AcceleratorState._reset_state()`" in str(caught.value)
    accelerator.state.destroy_process_group()  # a kept state object can still end the run


def test_overriding_even_batches_with_an_iterable_loader_warns():
    accelerator = Accelerator()
    accelerator.prepare(DataLoader(_Numbers(), batch_size=1))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with accelerator.join_uneven_inputs([torch.nn.Linear(1, 1)], even_batches=False):
            pass
    assert any("only supported for map-style datasets" in str(w.message) for w in caught)


def test_main_names_import_from_the_accelerator_and_state_modules():
    from hasten.accelerator import DataLoaderConfiguration, GradientAccumulationPlugin, ProjectConfiguration
    from hasten.state import DynamoBackend
    from hasten.utils import DataLoaderConfiguration as from_utils

    assert DataLoaderConfiguration is from_utils
    assert GradientAccumulationPlugin(num_steps=2).num_steps == 2
    assert ProjectConfiguration(project_dir="x").project_dir == "x"
    assert DynamoBackend("INDUCTOR").value == "INDUCTOR"
    with pytest.raises(ImportError):
        from hasten.accelerator import NoSuchName  # noqa: F401


def test_named_parameters_of_prepared_models_by_name_or_by_storage_address():
    """Scripts (the reference's FSDP2 benchmarks, TRL's vLLM loops) remap optimizer parameters with the private
    ``_get_named_parameters``: the unwrapped names, the parameters or (``drop_refs``) their storage addresses."""
    accelerator = Accelerator()
    model = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.Linear(3, 1))
    before = accelerator._get_named_parameters(model, drop_refs=True)
    prepared, optimizer = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    named = accelerator._get_named_parameters(prepared, optimizer, "not a module")
    assert list(named) == ["0.weight", "0.bias", "1.weight", "1.bias"]
    assert all(named[name] is parameter for name, parameter in model.named_parameters())
    assert before == {name: parameter.data_ptr() for name, parameter in model.named_parameters()}
    remapped = {address: named[name] for name, address in before.items()}
    assert [remapped[p.data_ptr()] for p in optimizer.param_groups[0]["params"]] == list(model.parameters())

    class Wrapped(torch.Tensor):  # a subclass that keeps its values in an inner tensor, as torchao's float8 weights
        pass

    inner = torch.ones(4)
    outer = torch.zeros(4).as_subclass(Wrapped)
    outer._tensor = inner
    holder = torch.nn.Module()
    holder.weight = torch.nn.Parameter(outer)
    holder.weight._tensor = inner
    assert accelerator._get_named_parameters(holder, drop_refs=True) == {"weight": inner.data_ptr()}
