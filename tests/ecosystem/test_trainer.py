"""transformers' Trainer (with PEFT, FSDP 1 and 2, DeepSpeed ZeRO-2 and 3) reaching hasten through
HASTEN_AS_ACCELERATE, on 2 processes, against the reference library running the same script.

Four launches in all (trainer_scenarios.py runs its scenarios one after the other in one process): the reference,
hasten, then each resuming from the other's checkpoints. Plus one process, in a Python where the real accelerate
is not installed at all.
"""
from __future__ import annotations

import json
import subprocess

import pytest

from helpers import ROOT, clean_env, python_with_site, run_launch, run_torchrun, script_path, site_packages_without
from helpers import torch_extensions_dir

HASTEN_SCENARIOS = "ddp,fsdp2,fsdp1,lora,lora_fsdp2,zero2,zero3"
BOTH = "ddp,lora,zero2,zero3"  # the reference trains FSDP on CPU as plain DDP: those are compared with DDP's
BACKEND = {"ddp": "MULTI_CPU", "lora": "MULTI_CPU", "fsdp2": "FSDP", "fsdp1": "FSDP", "lora_fsdp2": "FSDP",
           "zero2": "DEEPSPEED", "zero3": "DEEPSPEED"}


# what trainer_scenarios.py imports as it starts training: the launched workers start with them imported
IMPORTS = ("deepspeed", "transformers.trainer", "transformers.models.llama.modeling_llama", "datasets", "peft")


def reference(scenarios: str, out, *extra) -> None:
    result = run_torchrun("trainer_scenarios.py", scenarios, out, *extra, preload=IMPORTS)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-8000:]


def results(folder, name="results.json") -> dict:
    return {(entry["scenario"], entry["resumed_from"] is not None): entry
            for entry in json.loads((folder / name).read_text())}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("trainer")
    folders = {name: base / name for name in ("reference", "hasten", "hasten_from_reference", "reference_from_hasten")}
    for folder in folders.values():
        folder.mkdir()
    reference(BOTH, folders["reference"])
    run_launch("trainer_scenarios.py", HASTEN_SCENARIOS, folders["hasten"], launch_args=["--as_accelerate"],
               timeout=600, preload=IMPORTS)
    run_launch("trainer_scenarios.py", BOTH, folders["hasten_from_reference"], "--resume-from",
               folders["reference"], launch_args=["--as_accelerate"], timeout=600, preload=IMPORTS)
    reference(BOTH, folders["reference_from_hasten"], "--resume-from", folders["hasten"])
    return {"reference": results(folders["reference"]), "hasten": results(folders["hasten"]),
            "hasten_from_reference": results(folders["hasten_from_reference"], "results-resumed.json"),
            "reference_from_hasten": results(folders["reference_from_hasten"], "results-resumed.json")}


def test_every_scenario_trains_on_hasten_with_the_backend_it_asked_for(runs):
    for scenario, backend in BACKEND.items():
        entry = runs["hasten"][(scenario, False)]
        assert entry["library"].startswith(str(ROOT / "src")), entry["library"]  # accelerate was hasten
        assert entry["distributed_type"] == f"DistributedType.{backend}" and entry["num_processes"] == 2, entry
        assert len(entry["losses"]) == 8


def test_losses_and_grad_norms_are_the_references(runs):
    for scenario in BOTH.split(","):
        mine, theirs = runs["hasten"][(scenario, False)], runs["reference"][(scenario, False)]
        assert "site-packages" in theirs["library"]
        assert mine["losses"] == pytest.approx(theirs["losses"], rel=1e-6, abs=1e-7), scenario
        assert mine["grad_norms"] == pytest.approx(theirs["grad_norms"], rel=1e-6, abs=1e-7), scenario


def test_sharded_runs_train_like_their_unsharded_twins(runs):
    """FSDP shards here (the reference runs FSDP on CPU as plain DDP): the same losses as DDP's."""
    for sharded, plain in (("fsdp2", "ddp"), ("fsdp1", "ddp"), ("lora_fsdp2", "lora")):
        assert runs["hasten"][(sharded, False)]["losses"] == pytest.approx(runs["hasten"][(plain, False)]["losses"],
                                                                          rel=1e-6), sharded


def test_resume_from_checkpoint_is_exact(runs):
    for scenario in BACKEND:
        whole = runs["hasten"][(scenario, False)]
        resumed = runs["hasten"][(scenario, True)]
        assert resumed["steps"] == whole["steps"][4:], scenario
        assert resumed["losses"] == whole["losses"][4:], scenario  # bitwise: the same steps, the same numbers


def test_checkpoints_cross_between_the_libraries_both_ways(runs):
    for scenario in BOTH.split(","):
        expected = runs["hasten"][(scenario, False)]["losses"][4:]
        assert runs["hasten_from_reference"][(scenario, True)]["losses"] == pytest.approx(expected, rel=1e-6)
        assert runs["reference_from_hasten"][(scenario, True)]["losses"] == pytest.approx(expected, rel=1e-6)
        assert "site-packages" in runs["reference_from_hasten"][(scenario, True)]["library"]


def test_one_process_where_the_real_accelerate_is_not_installed(tmp_path):
    # DeepSpeed compiles its CPU Adam for the mirror's paths: a mirror kept in the build folder, with its own
    # extension folder, compiles it once, and never turns the main installation's build stale
    mirror = site_packages_without(ROOT / "build" / "without-accelerate", "accelerate")
    out = tmp_path / "out"
    out.mkdir()
    env = clean_env(HASTEN_AS_ACCELERATE="1", TORCH_EXTENSIONS_DIR=torch_extensions_dir("without-accelerate"))
    result = subprocess.run([*python_with_site(mirror), str(script_path("trainer_scenarios.py")), "lora,zero2",
                             str(out)], capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    entries = results(out)
    for scenario in ("lora", "zero2"):  # lora trains the plain path with an adapter; zero2 the DeepSpeed one
        entry = entries[(scenario, False)]
        assert entry["library"].startswith(str(ROOT / "src")) and entry["num_processes"] == 1
        assert entries[(scenario, True)]["losses"] == entry["losses"][4:], scenario
    assert entries[("zero2", False)]["distributed_type"] == "DistributedType.DEEPSPEED"
