"""Experiment tracking through the Accelerator: JSONL and TensorBoard written and read back, log_with forms,
which process logs, and every bad input the issue lists (clear error, nothing half-logged)."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from hasten import Accelerator, ProjectConfiguration
from hasten.state import PartialState
from hasten.tracking import GeneralTracker, JSONLTracker, TensorBoardTracker, get_available_trackers
from hasten.tracking import registry

from helpers import ROOT


class MemoryTracker(GeneralTracker):
    """A custom tracker keeping what it is given."""

    name = "memory"
    requires_logging_directory = False

    def __init__(self, main_process_only=True):
        super().__init__()
        self.main_process_only = main_process_only
        self.events = []

    @property
    def tracker(self):
        return self.events

    def start(self):
        self.events.append("start")

    def store_init_configuration(self, values):
        self.events.append(("config", values))

    def log(self, values, step=None, **kwargs):
        self.events.append(("log", step, values, kwargs))

    def finish(self):
        self.events.append("finish")


def read_jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def scalars(folder, tag):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(folder))
    events.Reload()
    return [(event.step, event.value) for event in events.Scalars(tag)], events


# ----------------------------------------------------------------------------- JSONL and TensorBoard, read back
def test_jsonl_writes_one_line_per_log_call_and_the_config(tmp_path):
    accelerator = Accelerator(cpu=True, log_with="jsonl", project_dir=tmp_path)
    accelerator.init_trackers("run", config={"lr": 0.1, "optimizer": "adamw", "layers": torch.tensor(4)})
    accelerator.log({"loss": torch.tensor(2.5), "epoch": 0, "note": "warmup"}, step=1)
    accelerator.log({"loss": np.float32(1.25), "lr": 0.05}, step=2)
    accelerator.log({"eval": {"accuracy": torch.tensor([0.75])}})
    accelerator.end_training()
    lines = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert [line["step"] for line in lines] == [1, 2, None]
    assert lines[0]["values"] == {"loss": 2.5, "epoch": 0, "note": "warmup"}
    assert lines[1]["values"] == {"loss": 1.25, "lr": 0.05}
    assert lines[2]["values"] == {"eval": {"accuracy": 0.75}}
    assert all(isinstance(line["time"], float) for line in lines) and lines[0]["time"] <= lines[2]["time"]
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config == {"lr": 0.1, "optimizer": "adamw", "layers": 4}
    assert accelerator.get_tracker("jsonl").tracker is None  # the file is closed by end_training


def test_jsonl_is_always_available_and_appends_on_resume(tmp_path):
    assert "jsonl" in get_available_trackers()
    for step in (1, 2):
        tracker = JSONLTracker("run", tmp_path)
        tracker.start()
        tracker.log({"loss": float(step)}, step=step)
        tracker.finish()
    assert [line["step"] for line in read_jsonl(tmp_path / "run" / "metrics.jsonl")] == [1, 2]
    with pytest.raises(TypeError, match="no extra arguments"):
        JSONLTracker("run", tmp_path, flush_secs=3)


def test_tensorboard_writes_event_files_read_back_with_the_values_and_steps(tmp_path):
    accelerator = Accelerator(cpu=True, log_with=["tensorboard"], project_dir=tmp_path)
    accelerator.init_trackers("tb", config={"lr": 0.01, "batch_size": 8, "schedule": {"warmup": 10}})
    for step in range(3):
        accelerator.log({"train/loss": torch.tensor(1.0 / (step + 1)), "note": f"step {step}"}, step=step)
    accelerator.log({"grouped": {"a": 1.0, "b": 2.0}}, step=3)
    writer = accelerator.get_tracker("tensorboard", unwrap=True)
    assert writer is accelerator.get_tracker("tensorboard").writer
    accelerator.end_training()
    run = tmp_path / "tb"
    loss, events = scalars(run, "train/loss")
    assert loss == [(0, 1.0), (1, 0.5), (2, pytest.approx(1 / 3))]
    assert "note" in " ".join(events.Tags()["tensors"])  # text is kept as a tensor summary
    [sub_run] = [path for path in run.iterdir() if (path / "hparams.yml").is_file()]  # the reference's layout:
    assert float(sub_run.name) > 0 and list(sub_run.glob("events.out.tfevents.*"))  # a timestamped sub-run
    assert (sub_run / "hparams.yml").read_text().count("lr: 0.01") == 1
    assert list(run.glob("events.out.tfevents.*"))
    assert any(path.name.startswith("grouped") for path in run.iterdir())  # add_scalars: one folder per series


def test_project_configuration_logging_dir_decides_where_files_go(tmp_path):
    config = ProjectConfiguration(project_dir=str(tmp_path / "project"), logging_dir=str(tmp_path / "logs"))
    accelerator = Accelerator(cpu=True, log_with=["jsonl", "tensorboard"], project_config=config)
    accelerator.init_trackers("exp")
    accelerator.log({"loss": 1.0}, step=0)
    accelerator.end_training()
    assert (tmp_path / "logs" / "exp" / "metrics.jsonl").is_file()
    assert list((tmp_path / "logs" / "exp").glob("events.out.tfevents.*"))
    assert not (tmp_path / "project").exists()


# ----------------------------------------------------------------------------- log_with forms and processes
def test_custom_tracker_instances_get_config_values_and_log_kwargs(tmp_path):
    memory = MemoryTracker()
    accelerator = Accelerator(cpu=True, log_with=[memory, "jsonl"], project_dir=tmp_path)
    accelerator.init_trackers("run", config={"lr": 0.5}, init_kwargs={"jsonl": {}})
    accelerator.log({"loss": torch.tensor(3.0)}, step=torch.tensor(7), log_kwargs={"memory": {"commit": True}})
    assert accelerator.get_tracker("memory") is memory and accelerator.get_tracker("memory", unwrap=True) is memory.events
    accelerator.end_training()
    assert memory.events == ["start", ("config", {"lr": 0.5}), ("log", 7, {"loss": 3.0}, {"commit": True}), "finish"]
    assert type(memory.events[2][2]["loss"]) is float  # a tensor of one element arrives as a Python number
    assert [t.name for t in accelerator.trackers] == ["memory", "jsonl"]


def test_all_takes_every_installed_tracker_and_names_without_a_directory_are_left_out(tmp_path):
    memory = MemoryTracker()
    accelerator = Accelerator(cpu=True, log_with=["all", memory], project_dir=tmp_path)
    assert accelerator.log_with[0] is memory
    assert [str(name) for name in accelerator.log_with[1:]] == [str(n) for n in get_available_trackers()]
    with pytest.warns(UserWarning, match="leaves out .*jsonl"):
        without_dir = Accelerator(cpu=True, log_with="all")
    assert "jsonl" not in without_dir.log_with and "tensorboard" not in without_dir.log_with


def test_trackers_run_on_the_main_process_only_unless_they_say_otherwise(tmp_path, monkeypatch):
    everywhere, main_only = MemoryTracker(main_process_only=False), MemoryTracker(main_process_only=True)
    main_only.name = "main_only"
    accelerator = Accelerator(cpu=True, log_with=[everywhere, main_only, "jsonl"], project_dir=tmp_path)
    monkeypatch.setattr(PartialState, "is_main_process", property(lambda self: False))
    accelerator.init_trackers("run", config={"lr": 1})
    accelerator.log({"loss": 1.0}, step=1)
    assert accelerator.trackers == [everywhere]
    assert type(accelerator.get_tracker("jsonl")) is GeneralTracker  # blank here: it runs on the main process
    accelerator.get_tracker("jsonl").log({"loss": 1.0})  # and does nothing
    accelerator.end_training()
    assert everywhere.events[-1] == "finish" and main_only.events == []
    assert not (tmp_path / "run").exists()  # the jsonl tracker never started on this process


def test_on_main_process_trackers_do_nothing_on_other_processes(tmp_path, monkeypatch):
    tracker = TensorBoardTracker("run", tmp_path)
    monkeypatch.setattr(PartialState, "is_main_process", property(lambda self: False))
    tracker.start()
    assert tracker.writer is None and not (tmp_path / "run").exists()


# ----------------------------------------------------------------------------- bad input
def test_an_unknown_name_lists_the_known_and_installed_trackers():
    with pytest.raises(ValueError, match=r"Unknown log_with tracker 'tensorbord'.*known names are .*jsonl.*"
                                         r"installed here: .*tensorboard"):
        Accelerator(cpu=True, log_with="tensorbord")


def test_a_tracker_whose_package_is_missing_names_the_extra(monkeypatch):
    monkeypatch.setattr(registry.LOGGER_TYPE_TO_CLASS["wandb"], "is_installed", staticmethod(lambda: False))
    with pytest.raises(ImportError, match=r"`wandb` package.*pip install 'hasten\[trackers\]'"):
        Accelerator(cpu=True, log_with="wandb")
    assert "wandb" not in get_available_trackers()


def test_each_tracker_declares_its_name_and_package_and_the_trackers_extra_installs_them():
    import tomllib

    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["trackers"]
    listed = {requirement.split("<")[0].split(">")[0].split("=")[0] for requirement in extra}
    for tracker_class in registry.BUILTIN_TRACKERS:
        assert registry.LOGGER_TYPE_TO_CLASS[tracker_class.name] is tracker_class
        if tracker_class.package is not None:  # jsonl needs nothing
            assert (tracker_class.distribution or tracker_class.package) in listed, tracker_class
    # a custom tracker that names its package is as installed as that package
    missing = type("Missing", (GeneralTracker,), {"name": "missing", "package": "not_a_real_package_x",
                                                  "requires_logging_directory": False})
    assert not missing.is_installed() and GeneralTracker.is_installed()


def test_starting_a_tracker_without_its_package_names_the_extra(monkeypatch):
    from hasten.tracking import packages

    monkeypatch.setitem(__import__("sys").modules, "wandb", None)  # import wandb now raises ImportError
    with pytest.raises(ImportError, match=r"'wandb' tracker needs the `wandb` package.*hasten\[trackers\]"):
        packages.import_tracker_package("wandb", "wandb")
    with pytest.raises(ImportError, match=r"pip install not_a_real_package$"):
        packages.import_tracker_package("not_a_real_package", "custom")


def test_a_tracker_that_needs_a_directory_without_one_is_a_clear_error():
    with pytest.raises(ValueError, match="`tensorboard` requires a `logging_dir`.*project_dir"):
        Accelerator(cpu=True, log_with="tensorboard")
    accelerator = Accelerator(cpu=True, log_with="jsonl", project_dir="somewhere")
    accelerator.project_configuration.logging_dir = None
    with pytest.raises(ValueError, match="`jsonl` requires a `logging_dir`"):
        accelerator.init_trackers("run")


def test_log_before_init_trackers_and_after_end_training_is_an_error(tmp_path):
    accelerator = Accelerator(cpu=True, log_with="jsonl", project_dir=tmp_path)
    with pytest.raises(RuntimeError, match=r"before .*init_trackers|init_trackers\(project_name, config\) first"):
        accelerator.log({"loss": 1.0})
    accelerator.init_trackers("run")
    with pytest.raises(RuntimeError, match="already called"):
        accelerator.init_trackers("run")
    accelerator.end_training()
    with pytest.raises(RuntimeError, match="init_trackers"):
        accelerator.log({"loss": 1.0})


@pytest.mark.parametrize("values, error, match", [
    ({"loss": torch.ones(3)}, ValueError, "'loss': it is a tensor of 3 elements"),
    ({"weights": [1.0, 2.0]}, TypeError, "'weights': its value has type list"),
    ({"ok": 1.0, "image": object()}, TypeError, "'image'"),
    ({"eval": {"acc": np.zeros(2)}}, ValueError, "'eval/acc'"),
    ({3: 1.0}, TypeError, "key 3 is a int"),
    ([("loss", 1.0)], TypeError, "takes a dict"),
])
def test_values_that_cannot_be_logged_name_the_key_and_nothing_is_logged(tmp_path, values, error, match):
    accelerator = Accelerator(cpu=True, log_with="jsonl", project_dir=tmp_path)
    accelerator.init_trackers("run")
    with pytest.raises(error, match=match):
        accelerator.log(values, step=1)
    accelerator.end_training()
    assert (tmp_path / "run" / "metrics.jsonl").read_text() == ""


def test_bad_step_project_name_and_init_kwargs(tmp_path):
    accelerator = Accelerator(cpu=True, log_with="jsonl", project_dir=tmp_path)
    with pytest.raises(ValueError, match="project_name"):
        accelerator.init_trackers("")
    with pytest.raises(TypeError, match="init_kwargs"):
        accelerator.init_trackers("run", init_kwargs={"jsonl": 3})
    accelerator.init_trackers("run")
    with pytest.raises(TypeError, match="step"):
        accelerator.log({"loss": 1.0}, step=1.5)
    with pytest.raises(ValueError, match="'nope' is not one of the Accelerator's trackers: they are jsonl"):
        accelerator.get_tracker("nope")
    accelerator.end_training()


def test_tracker_objects_need_no_project_name_trackers_by_name_do(tmp_path):
    """A tracker built by the script already has its run: init_trackers(None, config) starts it (the reference
    takes that); a tracker given by name is built with the project name, so None is refused for it."""
    tracker = MemoryTracker()
    accelerator = Accelerator(cpu=True, log_with=tracker)
    accelerator.init_trackers(None, {"lr": 0.1})
    assert tracker.events[:2] == ["start", ("config", {"lr": 0.1})]
    accelerator.end_training()
    named = Accelerator(cpu=True, log_with="jsonl", project_dir=tmp_path)
    with pytest.raises(ValueError, match=r"project_name.*got None.*\['jsonl'\] are built with it"):
        named.init_trackers(None)


def test_a_tracker_failing_to_start_closes_the_ones_already_started(tmp_path):
    class Broken(MemoryTracker):
        name = "broken"

        def start(self):
            raise OSError("disk full")

    first = MemoryTracker()
    accelerator = Accelerator(cpu=True, log_with=[first, Broken()], project_dir=tmp_path)
    with pytest.raises(OSError, match="disk full"):
        accelerator.init_trackers("run")
    assert first.events == ["start", "finish"]


def test_without_trackers_the_methods_do_nothing_and_still_check_values():
    accelerator = Accelerator(cpu=True)
    accelerator.init_trackers("project", config={"lr": 0.1})
    accelerator.log({"loss": 1.0}, step=1)
    with pytest.raises(TypeError, match="'bad'"):
        accelerator.log({"bad": object()})
    assert type(accelerator.get_tracker("tensorboard")) is GeneralTracker
    accelerator.end_training()
