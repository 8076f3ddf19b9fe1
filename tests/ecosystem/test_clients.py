"""TRL (SFT, DPO), sentence-transformers and a diffusers training loop reaching hasten through HASTEN_AS_ACCELERATE,
on 2 processes against the reference library and on one process where the real accelerate is not installed."""
from __future__ import annotations

import json
import subprocess

import pytest

from helpers import ROOT, clean_env, python_with_site, run_launch, run_torchrun, script_path, site_packages_without

CLIENTS = "sft,dpo,sentence"


# what each script imports as it starts: the launched workers start with them imported
IMPORTS = {"client_scenarios.py": ("transformers.trainer", "transformers.models.llama.modeling_llama",
                                   "transformers.models.bert.modeling_bert", "datasets", "trl", "sentence_transformers"),
           "diffusers_loop.py": ("diffusers", "diffusers.models.unets.unet_2d", "diffusers.training_utils")}


def torchrun(script: str, *args) -> subprocess.CompletedProcess:
    for attempt in range(2):
        result = run_torchrun(script, *args, preload=IMPORTS[script])
        # the reference's gloo workers sometimes abort while the interpreter exits, after their work is done
        # ("terminate called without an active exception", exit -6): that run of the reference is made again, once
        if result.returncode == 0 or "terminate called without an active exception" not in result.stderr:
            break
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-8000:]
    return result


def launch(script: str, *args, **options) -> subprocess.CompletedProcess:
    """``hasten launch --as_accelerate`` of one of the clients' scripts on 2 processes."""
    return run_launch(script, *args, launch_args=["--as_accelerate"], preload=IMPORTS[script], **options)


def without_accelerate(tmp_path, script: str, *args, **env) -> subprocess.CompletedProcess:
    mirror = site_packages_without(tmp_path / "site", "accelerate")
    result = subprocess.run([*python_with_site(mirror), str(script_path(script)), *map(str, args)],
                            capture_output=True, text=True, env=clean_env(HASTEN_AS_ACCELERATE="1", **env), cwd=ROOT,
                            timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    return result


def by_scenario(path) -> dict:
    return {entry["scenario"]: entry for entry in json.loads(path.read_text())}


# ----------------------------------------------------------------------------------------------- TRL, sentence-transformers
def test_trl_and_sentence_transformers_train_like_the_reference_on_two_processes(tmp_path):
    theirs, mine = tmp_path / "reference", tmp_path / "hasten"
    theirs.mkdir()
    mine.mkdir()
    torchrun("client_scenarios.py", CLIENTS, theirs)
    launch("client_scenarios.py", CLIENTS, mine, timeout=600)
    reference, hasten = by_scenario(theirs / "clients.json"), by_scenario(mine / "clients.json")
    for scenario in CLIENTS.split(","):
        assert hasten[scenario]["library"].startswith(str(ROOT / "src")), hasten[scenario]
        assert "site-packages" in reference[scenario]["library"]
        assert hasten[scenario]["num_processes"] == 2 and len(hasten[scenario]["losses"]) == 4
        assert hasten[scenario]["losses"] == pytest.approx(reference[scenario]["losses"], rel=1e-6), scenario


def test_trl_and_sentence_transformers_on_one_process_without_the_real_accelerate(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    without_accelerate(tmp_path, "client_scenarios.py", CLIENTS, out)
    for scenario, entry in by_scenario(out / "clients.json").items():
        assert entry["library"].startswith(str(ROOT / "src")) and entry["num_processes"] == 1, scenario
        assert len(entry["losses"]) == 4 and all(loss == loss for loss in entry["losses"]), scenario


# ----------------------------------------------------------------------------------------------- a diffusers loop
def test_a_diffusers_loop_saving_on_the_main_process_only_gets_a_complete_checkpoint(tmp_path):
    mine, theirs = tmp_path / "hasten", tmp_path / "reference"
    mine.mkdir()
    theirs.mkdir()
    launch("diffusers_loop.py", mine, timeout=300)
    marker = json.loads((mine / "checkpoint-4" / "hasten_checkpoint.json").read_text())
    assert marker["contributions"] is True and marker["num_processes"] == 2
    saved = {path.name for path in (mine / "checkpoint-4").iterdir()}
    assert {"unet", "unet_ema", "optimizer.bin", "random_states_0.pkl"} <= saved, saved
    assert "random_states_1.pkl" not in saved and "hasten_process_1.json" not in saved, saved  # never called there
    assert (mine / "checkpoint-4" / "unet" / "config.json").is_file()  # the hook's save_pretrained, unwrapped model
    # both libraries resume from it, and hasten resumes from the reference's
    launch("diffusers_loop.py", mine, "--resume", mine, timeout=300)
    torchrun("diffusers_loop.py", theirs)
    torchrun("diffusers_loop.py", theirs, "--resume", mine)
    (tmp_path / "cross").mkdir()
    launch("diffusers_loop.py", tmp_path / "cross", "--resume", theirs, timeout=300)
    for folder in (mine, theirs, tmp_path / "cross"):
        resumed = json.loads((folder / "diffusers-resumed.json").read_text())
        assert sorted(resumed["losses"], key=int) == ["5", "6", "7", "8"], resumed


def test_a_diffusers_loop_on_one_process_resumes_exactly(tmp_path):
    """The EMA's save_pretrained draws random numbers inside the save hook: the states are taken after it, so the
    resumed run draws the uninterrupted run's noise."""
    out = tmp_path / "out"
    out.mkdir()
    without_accelerate(tmp_path, "diffusers_loop.py", out)
    without_accelerate(tmp_path, "diffusers_loop.py", out, "--resume", out)
    whole = json.loads((out / "diffusers.json").read_text())
    resumed = json.loads((out / "diffusers-resumed.json").read_text())
    assert whole["num_processes"] == 1 and whole["library"].startswith(str(ROOT / "src"))
    assert resumed["losses"] == {step: loss for step, loss in whole["losses"].items() if int(step) > 4}
    assert resumed["ema_sum"] == whole["ema_sum"]
