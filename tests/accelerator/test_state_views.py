"""The state users and libraries read says what is running, as the reference's does: every attribute that
tests/accelerator/state_views.py records, for every way a backend is chosen (argument, launcher environment,
config file), equal between the reference and hasten behind HASTEN_AS_ACCELERATE (the same script, two runs)."""
import json
import subprocess
import sys

import pytest

from helpers import ROOT, clean_env, script_path

pytest.importorskip("deepspeed")
pytest.importorskip("accelerate")

FSDP = "DistributedType.FSDP"


def on_purpose(scenario: str, attribute: str, theirs):
    """What hasten answers instead of the reference, on purpose (docs/migration.md), else the reference's value."""
    if scenario.startswith("fsdp"):  # hasten runs FSDP on one process too; the reference falls back to NO
        version_2 = scenario.startswith("fsdp2")
        if attribute in ("state.distributed_type", "accelerator.distributed_type"):
            return FSDP
        if attribute in ("state.is_fsdp2", "accelerator.is_fsdp2"):
            return version_2
        if attribute == "state.repr.first_line":
            return theirs.replace("DistributedType.NO", FSDP) + ("  Backend: gloo" if scenario == "fsdp2 argument"
                                                                 else "")
    if scenario == "deepspeed argument" and attribute == "partial.distributed_type":
        return "DistributedType.NO"  # PartialState describes the processes; the backend is AcceleratorState's
    return theirs


def record(tmp_path, name: str, **env) -> dict:
    config = tmp_path / "ds_config.json"
    config.write_text(json.dumps({"zero_optimization": {"stage": 1}, "train_micro_batch_size_per_gpu": "auto",
                                  "gradient_accumulation_steps": 1}))
    from hasten.core.network import find_free_port

    out = tmp_path / f"{name}.json"
    result = subprocess.run([sys.executable, str(script_path("state_views.py")), str(out), str(config)],
                            capture_output=True, text=True, cwd=ROOT, timeout=300,
                            env=clean_env(STATE_VIEWS_PORT=find_free_port(), **env))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    return json.loads(out.read_text())


def test_every_attribute_matches_the_reference_for_every_way_a_backend_is_chosen(tmp_path):
    theirs = record(tmp_path, "reference")
    mine = record(tmp_path, "hasten", HASTEN_AS_ACCELERATE="1")
    assert sorted(mine) == sorted(theirs)
    differences = []
    for scenario, views in theirs.items():
        assert "error" not in views, (scenario, views)  # every scenario runs on the reference
        assert "error" not in mine[scenario], (scenario, mine[scenario])
        for attribute, value in views.items():
            if value == "<absent>":  # the reference raises AttributeError there: any answer is at least as good
                continue
            expected = on_purpose(scenario, attribute, value)
            if mine[scenario].get(attribute, "<missing>") != expected:
                differences.append(f"{scenario}: {attribute} is {mine[scenario].get(attribute, '<missing>')!r} on "
                                   f"hasten, {value!r} on the reference")
    assert not differences, "\n".join(differences)
