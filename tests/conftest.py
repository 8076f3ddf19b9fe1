import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from suite_markers import mark_items  # noqa: E402
from suite_timing import SuiteTiming  # noqa: E402


def pytest_configure(config):
    config.pluginmanager.register(SuiteTiming(), "hasten-suite-timing")


def pytest_collection_modifyitems(config, items):
    mark_items(items)  # launches / heavy, read from each test's code (suite_markers.py)
from helpers import torch_extensions_dir  # noqa: E402

os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(torch_extensions_dir()))  # DeepSpeed's compiled ops, per checkout

# Tests must never think they were launched: drop launcher variables inherited from a shell (and Accelerate's
# ACCELERATE_* aliases of the HASTEN_* ones).
for _key in list(os.environ):
    if _key.startswith(("HASTEN_", "ACCELERATE_")) or _key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR",
                                                              "MASTER_PORT"):
        os.environ.pop(_key)


# Variables an optional library sets when it is imported (deepspeed: PYTORCH_NVML_BASED_CUDA_CHECK; hasten's
# DeepSpeed strategy: DS_ACCELERATOR): put back after every test, so no test sees another's imports.
_IMPORT_SET_VARIABLES = ("PYTORCH_NVML_BASED_CUDA_CHECK", "DS_ACCELERATOR")
_IMPORT_SET_BEFORE = {name: os.environ.get(name) for name in _IMPORT_SET_VARIABLES}


@pytest.fixture(autouse=True)
def variables_set_by_imports_put_back():
    yield
    for name, value in _IMPORT_SET_BEFORE.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


_LAUNCH_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@pytest.fixture(autouse=True)
def fresh_state():
    """Every test starts and ends with no shared process / accelerator / gradient state, and leaves no process
    group or launch variables behind (a single-process DeepSpeed run makes both), so no test depends on the order."""
    import torch.distributed as dist

    from hasten.state import AcceleratorState, GradientState, PartialState

    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    had_group = dist.is_available() and dist.is_initialized()
    launch_before = {name: os.environ.get(name) for name in _LAUNCH_VARIABLES}
    yield
    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    if not had_group and dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    for name, value in launch_before.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
