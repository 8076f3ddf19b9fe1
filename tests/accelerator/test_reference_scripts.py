"""The reference library's own multi-process test scripts, migrated the way a user migrates (``accelerate`` ->
``hasten`` in the code), pass under ``hasten launch -n 2``.

These scripts exercise what real training scripts rely on: collectives, data-loader sharding and joining,
gradient accumulation and synchronisation, mixed precision, checkpoint round trips, state resets and
pickling. They are read from the installed reference package (the ``reference`` extra) and run unchanged
apart from the import rename.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from helpers import run_launch

accelerate = pytest.importorskip("accelerate")

SCRIPTS = Path(accelerate.__file__).resolve().parent / "test_utils" / "scripts"


def migrated(name: str, folder: Path) -> Path:
    """The reference script ``name`` with every ``accelerate`` / ``Accelerate`` replaced by ``hasten`` / ``Hasten``
    (environment variables named ``ACCELERATE_*`` stay: hasten reads them as aliases)."""
    text = (SCRIPTS / name).read_text()
    text = re.sub(r"accelerate", "hasten", text)
    text = re.sub(r"Accelerate", "Hasten", text)
    target = folder / name
    target.write_text(text)
    return target


@pytest.mark.parametrize("name", ["test_ops.py", "test_script.py", "test_distributed_data_loop.py", "test_sync.py",
                                  "test_cli.py"])
def test_reference_script_passes_under_hasten_launch(tmp_path, name):
    result = run_launch(migrated(name, tmp_path), timeout=300)
    assert "Traceback" not in result.stderr
