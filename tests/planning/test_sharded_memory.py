"""FSDP2 per-rank memory at any number of processes, planned on one process with a fake process group."""
import dataclasses
import sys
from pathlib import Path

import pytest
import torch

from hasten.planning import MemoryBreakdown, fsdp2_step_memory
from helpers import run_launch

pytest.importorskip("transformers")
sys.path.insert(0, str(Path(__file__).resolve().parent))
from check_fsdp2_memory import batch, build  # noqa: E402  the launched check's model and batch


def test_shards_shrink_with_the_number_of_processes_and_the_gathered_unit_does_not():
    weights = sum(p.numel() * p.element_size() for p in build().parameters())
    plans = {n: fsdp2_step_memory(build, batch, world_size=n) for n in (2, 8)}
    for n, plan in plans.items():
        assert plan.parameters == pytest.approx(weights / n, rel=0.02)  # this rank's shards (padding aside)
        assert plan.gathered_parameters > 0 and plan.communication > 0
        assert plan.peak == sum(getattr(plan, f.name) for f in dataclasses.fields(MemoryBreakdown))
    assert plans[8].peak < plans[2].peak and plans[8].optimizer_state < plans[2].optimizer_state
    assert plans[8].gathered_parameters == plans[2].gathered_parameters  # one unit gathered whole, at any size
    assert not torch.distributed.is_initialized()  # the fake group is gone again


def test_a_process_with_a_group_is_refused_and_bad_sizes_too(monkeypatch):
    with pytest.raises(ValueError, match="world_size"):
        fsdp2_step_memory(build, batch, world_size=0)
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    with pytest.raises(RuntimeError, match="already has a process group"):
        fsdp2_step_memory(build, batch, world_size=2)


def test_the_plan_is_within_ten_percent_of_each_ranks_measurement_in_a_real_two_process_run():
    result = run_launch("check_fsdp2_memory.py", num_processes=2, timeout=240)
    assert result.stdout.count("predicted within 10%") == 4, result.stdout + result.stderr
