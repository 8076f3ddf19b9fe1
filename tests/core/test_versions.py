import importlib.metadata

import pytest
import torch
from packaging.version import Version

from hasten.utils import compare_versions, is_torch_version

ALL_OPERATIONS = ["<", "<=", "==", "!=", ">=", ">"]


@pytest.mark.parametrize("left, operation, right, expected", [
    ("1.2.0", "<", "1.10.0", True),  # numeric, not string, comparison
    ("1.10.0", ">", "1.9.9", True),
    ("2.0", "==", "2.0.0", True),
    ("2.0", "!=", "2.0.0", False),
    ("2.1.0rc1", "<", "2.1.0", True),  # pre-releases come before the release
    ("2.1.0", "<=", "2.1.0", True),
    ("2.1.0", ">=", "2.1.1", False),
    ("2.1.0.post1", ">", "2.1.0", True),
])
def test_version_strings_compare_as_versions(left, operation, right, expected):
    assert compare_versions(left, operation, right) is expected
    assert compare_versions(Version(left), operation, right) is expected


def test_library_name_is_looked_up_in_installed_metadata():
    installed = Version(importlib.metadata.version("numpy"))
    assert compare_versions("numpy", "==", str(installed))
    assert compare_versions("numpy", "<", f"{installed.major + 1}.0")
    assert not compare_versions("numpy", ">", f"{installed.major + 1}.0")


def test_bad_operation_lists_the_valid_ones_before_any_lookup():
    with pytest.raises(ValueError) as info:
        compare_versions("no-such-library-anywhere", "=>", "1.0")
    for operation in ALL_OPERATIONS:
        assert repr(operation) in str(info.value)


def test_unknown_library_that_is_not_a_version_is_a_clear_error():
    with pytest.raises(importlib.metadata.PackageNotFoundError, match="neither an installed library nor a version"):
        compare_versions("no-such-library-anywhere", ">=", "1.0")


def test_bad_requirement_version_is_a_clear_error():
    with pytest.raises(ValueError, match="not a valid version"):
        compare_versions("1.0", ">=", "one point two")


def test_wrong_type_is_a_clear_error():
    with pytest.raises(TypeError, match="library name"):
        compare_versions(1.5, ">=", "1.0")


def test_is_torch_version_uses_the_installed_torch():
    current = Version(torch.__version__)
    assert is_torch_version("==", torch.__version__)
    assert is_torch_version(">=", f"{current.major}.{current.minor}")
    assert is_torch_version("<", f"{current.major + 1}.0")
    assert not is_torch_version(">", f"{current.major + 1}.0")


@pytest.mark.parametrize("operation", ALL_OPERATIONS)
def test_same_answers_as_accelerate(operation):
    accelerate_utils = pytest.importorskip("accelerate.utils")
    for library in ("torch", "numpy", "packaging"):
        for requirement in ("0.1", "1.0", "2.0.0", "2.13.0", "99.0"):
            assert compare_versions(library, operation, requirement) == accelerate_utils.compare_versions(
                library, operation, requirement), (library, operation, requirement)
    for requirement in ("2.0", "2.13", "2.13.0", "3.0"):
        assert is_torch_version(operation, requirement) == accelerate_utils.is_torch_version(operation, requirement)
