"""Every big-model name resolves from the import paths Accelerate users write."""
import importlib

import pytest

import hasten
import hasten.big_modeling as big_modeling
import hasten.utils as utils


@pytest.mark.parametrize("name", sorted(big_modeling._EXPORTS))
def test_big_modeling_names_resolve(name):
    value = getattr(big_modeling, name)
    assert getattr(importlib.import_module(big_modeling._EXPORTS[name]), name) is value


def test_top_level_and_utils_names_are_the_same_objects():
    for package in (hasten, utils):
        for name, module in package._EXPORTS.items():
            if module.startswith("hasten.big_modeling"):
                assert getattr(package, name) is getattr(big_modeling, name), name
