"""DataLoaderConfiguration: the SPEC's fields and defaults, validation, and use with prepare_data_loader."""
import dataclasses
import inspect

import pytest
from torch.utils.data import DataLoader

from hasten import DataLoaderConfiguration
from hasten.data import prepare_data_loader

SPEC_DEFAULTS = [("split_batches", False), ("dispatch_batches", None), ("even_batches", True),
                 ("use_seedable_sampler", False), ("data_seed", None), ("non_blocking", False),
                 ("use_stateful_dataloader", False)]


def test_fields_and_defaults_follow_the_spec():
    assert [(f.name, f.default) for f in dataclasses.fields(DataLoaderConfiguration)] == SPEC_DEFAULTS


def test_every_field_is_a_prepare_data_loader_argument():
    parameters = inspect.signature(prepare_data_loader).parameters
    config = DataLoaderConfiguration(split_batches=True, data_seed=4, use_seedable_sampler=True)
    assert set(config.to_kwargs()) <= set(parameters)
    prepared = prepare_data_loader(DataLoader(range(8), batch_size=4, shuffle=True), num_processes=2,
                                   process_index=0, **config.to_kwargs())
    assert [len(batch) for batch in prepared] == [2, 2]


@pytest.mark.parametrize("field, value, message", [
    ("split_batches", "maybe", "must be True or False"),
    ("dispatch_batches", 2, "True, False or None"),
    ("data_seed", -1, "int >= 0"),
    ("data_seed", 1.5, "int >= 0"),
])
def test_bad_values_are_rejected(field, value, message):
    with pytest.raises((TypeError, ValueError), match=message):
        DataLoaderConfiguration(**{field: value})


def test_reexported_where_accelerate_users_import_it():
    from hasten.data_loader import DataLoaderConfiguration as from_data_loader
    from hasten.utils import DataLoaderConfiguration as from_utils

    assert from_data_loader is from_utils is DataLoaderConfiguration
