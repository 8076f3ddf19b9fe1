import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
# DeepSpeed compiles its CPU ops on first use: into the build folder, once, reused by every launched test
os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(Path(__file__).resolve().parents[1] / "build" / "torch_extensions"))

# Tests must never think they were launched: drop launcher variables inherited from a shell (and Accelerate's
# ACCELERATE_* aliases of the HASTEN_* ones).
for _key in list(os.environ):
    if _key.startswith(("HASTEN_", "ACCELERATE_")) or _key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR",
                                                              "MASTER_PORT"):
        os.environ.pop(_key)


@pytest.fixture(autouse=True)
def fresh_state():
    """Every test starts and ends with no shared process / accelerator / gradient state."""
    from hasten.state import AcceleratorState, GradientState, PartialState

    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    yield
    AcceleratorState._reset_state(True)
    GradientState._reset_state()
