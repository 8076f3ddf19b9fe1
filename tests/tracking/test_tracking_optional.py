"""Each optional tracker (wandb, mlflow, trackio, aim, comet_ml, clearml, dvclive, swanlab) through the Accelerator,
in its offline / local mode, with what it wrote read back. The ``trackers`` extra installs all of them (``make
test`` installs it), so these tests run rather than skip."""
from __future__ import annotations

import json
import sqlite3
import zipfile

import pytest
import torch

from hasten import Accelerator

CONFIG = {"lr": 0.25, "optimizer": "adamw"}
LOSSES = [1.0, 0.5, 0.25]


def log_a_run(name, tmp_path, before_end=None, log_kwargs=None, **init_kwargs):
    """Three steps of loss through ``log_with=name`` in ``tmp_path``; ``before_end(accelerator)`` runs before
    end_training (for what is only readable while the run is open)."""
    accelerator = Accelerator(cpu=True, log_with=name, project_dir=tmp_path)
    accelerator.init_trackers("hasten-test", config=CONFIG, init_kwargs={name: init_kwargs})
    for step, loss in enumerate(LOSSES):
        accelerator.log({"loss": torch.tensor(loss), "phase": "train"}, step=step, log_kwargs={name: log_kwargs or {}})
    result = before_end(accelerator) if before_end else None
    accelerator.end_training()
    return accelerator, result


def test_wandb_offline(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_SILENT", "true")
    def read(accelerator):  # wandb keeps no readable copy once finished offline: read the open run
        run = accelerator.get_tracker("wandb", unwrap=True)
        return dict(run.summary), dict(run.config)

    _, (summary, config) = log_a_run("wandb", tmp_path, read, log_kwargs={"commit": True}, mode="offline")
    assert summary["loss"] == pytest.approx(LOSSES[-1]) and summary["_step"] == 2  # log_kwargs reached wandb
    assert config == CONFIG
    runs = list((tmp_path / "wandb").glob("offline-run-*/run-*.wandb"))  # under the logging directory
    assert len(runs) == 1


def test_mlflow_local_database(tmp_path, monkeypatch):
    mlflow = pytest.importorskip("mlflow")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    accelerator, run_id = log_a_run("mlflow", tmp_path, lambda a: a.get_tracker("mlflow", unwrap=True).info.run_id)
    client = mlflow.tracking.MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    history = client.get_metric_history(run_id, "loss")
    assert [(m.step, m.value) for m in history] == list(enumerate(LOSSES))
    run = client.get_run(run_id)
    assert run.data.params == {"lr": "0.25", "optimizer": "adamw"} and run.data.tags["phase"] == "train"
    assert client.get_experiment(run.info.experiment_id).name == "hasten-test"


def test_trackio_local(tmp_path, monkeypatch):
    monkeypatch.setenv("TRACKIO_DIR", str(tmp_path / "trackio"))  # read when trackio is imported
    trackio = pytest.importorskip("trackio")
    import sys

    for module in [m for name, m in sys.modules.items() if name.startswith("trackio") and m is not None]:
        if hasattr(module, "TRACKIO_DIR"):  # already imported by an earlier test: point it here too
            monkeypatch.setattr(module, "TRACKIO_DIR", tmp_path / "trackio")
    assert trackio is not None
    log_a_run("trackio", tmp_path)
    (database,) = list((tmp_path / "trackio").glob("hasten-test*.db"))
    with sqlite3.connect(database) as db:
        rows = db.execute("select step, metrics from metrics order by step").fetchall()
    assert [(step, json.loads(metrics)["loss"]) for step, metrics in rows] == list(enumerate(LOSSES))


def test_aim_repository(tmp_path):
    pytest.importorskip("aim")
    from aim.storage.context import Context

    def read(accelerator):  # aim reads a repository's runs back through its index: read the open run
        run = accelerator.get_tracker("aim", unwrap=True)
        return run.name, run["hparams"], list(run.get_metric("loss", Context({})).values.sparse_numpy()[1])

    _, (name, hparams, values) = log_a_run("aim", tmp_path, read, system_tracking_interval=None)
    assert name == "hasten-test" and hparams == CONFIG and values == LOSSES
    assert (tmp_path / ".aim").is_dir()  # the repository is the logging directory


def test_comet_ml_offline(tmp_path, monkeypatch):
    pytest.importorskip("comet_ml")
    monkeypatch.setenv("COMET_DISABLE_AUTO_LOGGING", "1")
    log_a_run("comet_ml", tmp_path, online=False)
    (archive,) = list(tmp_path.glob("*.zip"))  # the offline archive, in the logging directory
    with zipfile.ZipFile(archive) as zipped:
        messages = [json.loads(line) for line in zipped.read("messages.json").decode().splitlines()]
    metrics = [m["payload"]["metric"] for m in messages if m["type"] == "metric_msg"]
    assert [(m["step"], float(m["metricValue"])) for m in metrics if m["metricName"] == "loss"] == list(
        enumerate(LOSSES))
    params = {m["payload"]["param"]["paramName"]: m["payload"]["param"]["paramValue"] for m in messages
              if m["type"] == "parameter_msg"}
    assert str(params["lr"]) == "0.25" and params["optimizer"] == "adamw"


CLEARML_RUN = """
import sys
import torch
from hasten import Accelerator

accelerator = Accelerator(cpu=True, log_with="clearml", project_dir=sys.argv[1])
accelerator.init_trackers("hasten-test", config={"lr": 0.25}, init_kwargs={"clearml": {
    # no framework hooks and no repository / package scan (minutes on a loaded machine, nothing to find here)
    "auto_connect_frameworks": {"detect_repository": False, "pytorch": False, "tensorboard": False,
                                "matplotlib": False}, "auto_resource_monitoring": False, "auto_connect_arg_parser": False}})
for step, loss in enumerate([1.0, 0.5, 0.25]):
    accelerator.log({"loss": torch.tensor(loss)}, step=step)
print("FOLDER", accelerator.get_tracker("clearml", unwrap=True).get_offline_mode_folder())
accelerator.end_training()
"""


def test_clearml_offline(tmp_path):
    """In a process of its own: ClearML's offline mode is process-wide and it scans the process's packages."""
    pytest.importorskip("clearml")
    import subprocess
    import sys

    from helpers import clean_env

    # ClearML reports from a subprocess by default on Linux, and its close() then waits ~11 s for it; in a thread
    # the same events reach the same offline folder in ~1 s
    (tmp_path / "clearml.conf").write_text("sdk { development { report_use_subprocess: false } }\n")
    env = clean_env(CLEARML_OFFLINE_MODE="1", CLEARML_CACHE_DIR=str(tmp_path / "cache"), HOME=str(tmp_path))
    result = subprocess.run([sys.executable, "-c", CLEARML_RUN, str(tmp_path)], capture_output=True, text=True,
                            env=env, cwd=tmp_path, timeout=180)
    assert result.returncode == 0, result.stdout + result.stderr
    folder = next(line.split(" ", 1)[1] for line in result.stdout.splitlines() if line.startswith("FOLDER "))
    with zipfile.ZipFile(f"{folder}.zip") as zipped:
        events = [json.loads(line) for line in zipped.read("metrics.jsonl").decode().splitlines()]
    scalars = [event for batch in events for event in (batch if isinstance(batch, list) else [batch])
               if event.get("type") == "training_stats_scalar" and event.get("metric") == "loss"]
    assert [(e["iter"], e["value"]) for e in scalars] == list(enumerate(LOSSES))


def test_dvclive_local_files(tmp_path, monkeypatch):
    pytest.importorskip("dvclive")
    monkeypatch.chdir(tmp_path)
    log_a_run("dvclive", tmp_path / "logs")
    folder = tmp_path / "logs" / "dvclive"
    rows = (folder / "plots" / "metrics" / "loss.tsv").read_text().split()
    assert rows[:2] == ["step", "loss"] and [float(v) for v in rows[3::2]] == LOSSES
    text = (folder / "plots" / "metrics" / "phase.tsv").read_text().split()  # strings are metrics, step by step
    assert text == ["step", "phase", "0", "train", "1", "train", "2", "train"]
    assert "lr: 0.25" in (folder / "params.yaml").read_text()
    assert not (tmp_path / "dvc.yaml").exists()  # nothing written to the working directory


def test_swanlab_local(tmp_path):
    pytest.importorskip("swanlab")
    log_a_run("swanlab", tmp_path, mode="local")
    (run,) = list((tmp_path / "swanlog").glob("run-*"))
    assert "lr" in (run / "files" / "config.yaml").read_text()
    (data,) = list(run.glob("*.swanlab"))
    assert b"loss" in data.read_bytes()
