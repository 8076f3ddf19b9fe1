"""Input edges: booleans written as text, empty config files, unknown tracker names."""
from __future__ import annotations

import warnings

import pytest

from hasten import Accelerator
from hasten.config.accumulation import GradientAccumulationPlugin
from hasten.config.booleans import parse_bool
from hasten.config.config_file import load_config_file
from hasten.config.data import DataLoaderConfiguration
from hasten.config.dynamo import TorchDynamoPlugin
from hasten.config.fp8 import AORecipeKwargs, TERecipeKwargs
from hasten.config.kwargs import AutocastKwargs, DistributedDataParallelKwargs, GradScalerKwargs, ProfileKwargs
from hasten.config.project import ProjectConfiguration

# every boolean option of the configuration objects, read the one way the config file reads them
FLAGS = [
    (DataLoaderConfiguration, name) for name in
    ("split_batches", "dispatch_batches", "even_batches", "use_seedable_sampler", "non_blocking",
     "use_stateful_dataloader")
] + [(ProjectConfiguration, "automatic_checkpoint_naming"), (ProjectConfiguration, "save_on_each_node")] + [
    (GradientAccumulationPlugin, name) for name in ("adjust_scheduler", "sync_with_dataloader", "sync_each_batch")
] + [
    (DistributedDataParallelKwargs, name) for name in
    ("broadcast_buffers", "find_unused_parameters", "check_reduction", "gradient_as_bucket_view", "static_graph")
] + [(GradScalerKwargs, "enabled"), (AutocastKwargs, "enabled"), (AutocastKwargs, "cache_enabled")] + [
    (ProfileKwargs, name) for name in ("record_shapes", "profile_memory", "with_stack", "with_flops", "with_modules")
] + [(TorchDynamoPlugin, name) for name in ("fullgraph", "dynamic", "disable", "use_regional_compilation")] + [
    (TERecipeKwargs, "use_autocast_during_eval"), (TERecipeKwargs, "use_mxfp8_block_scaling"),
    (AORecipeKwargs, "pad_inner_dim"),
]


@pytest.mark.parametrize("cls, name", FLAGS, ids=[f"{c.__name__}.{n}" for c, n in FLAGS])
def test_boolean_options_read_text_like_the_config_file(cls, name):
    for text, expected in (("no", False), ("Yes", True), ("false", False), ("TRUE", True), ("0", False),
                           ("1", True), ("off", False), (" on ", True), (False, False), (True, True)):
        assert getattr(cls(**{name: text}), name) is expected, (name, text)
    with pytest.raises(ValueError, match=f"{name}.*must be True(,| or) False.*got 'maybe'"):
        cls(**{name: "maybe"})
    with pytest.raises((TypeError, ValueError), match=f"{name}.*got \\[1\\]"):  # fp8's are ValueErrors
        cls(**{name: [1]})


def test_parse_bool_keeps_none_only_where_optional():
    assert parse_bool(None, "x", optional=True) is None
    with pytest.raises(TypeError, match="x must be True or False"):
        parse_bool(None, "x")
    with pytest.raises(ValueError, match="got 2"):
        parse_bool(2, "x")


def test_accelerator_booleans_are_parsed_before_anything_starts():
    with pytest.warns(FutureWarning):
        accelerator = Accelerator(split_batches="no", cpu="yes", device_placement="off",
                                  step_scheduler_with_optimizer="false")
    assert accelerator.dataloader_config.split_batches is False  # bool("no") would be True
    assert accelerator.device_placement is False and accelerator.step_scheduler_with_optimizer is False
    assert accelerator.device.type == "cpu"


@pytest.mark.parametrize("argument", ["split_batches", "cpu", "device_placement", "step_scheduler_with_optimizer"])
def test_accelerator_refuses_unreadable_booleans(argument):
    from hasten.state import AcceleratorState

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        with pytest.raises(ValueError, match=rf"Accelerator\({argument}=...\) must be True or False.*'maybe'"):
            Accelerator(**{argument: "maybe"})
    assert not AcceleratorState._shared_state  # refused before any state was set up


@pytest.mark.parametrize("text", ["", "\n\n", "# only a comment\n# and another\n", "---\n"])
def test_an_empty_yaml_config_is_an_error_naming_the_file(tmp_path, text):
    path = tmp_path / "empty_config.yaml"
    path.write_text(text)
    with pytest.raises(ValueError, match=r"empty_config\.yaml is empty"):
        load_config_file(path)


def test_a_json_null_config_is_an_error_naming_the_file(tmp_path):
    path = tmp_path / "null.json"
    path.write_text("null")
    with pytest.raises(ValueError, match=r"null\.json is empty"):
        load_config_file(path)


def test_config_file_booleans_use_the_same_reading(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("use_cpu: 'on'\ndebug: 'no'\ndowncast_bf16: 0\n")
    assert load_config_file(path) == {"use_cpu": True, "debug": False, "downcast_bf16": False}
    path.write_text("use_cpu: maybe\n")
    with pytest.raises(ValueError, match="use_cpu.*expected true or false"):
        load_config_file(path)


@pytest.mark.parametrize("log_with", ["tensorbord", ["wandb", "not_a_tracker"]])
def test_an_unknown_tracker_name_lists_the_known_ones(log_with):
    with pytest.raises(ValueError, match=r"Unknown log_with tracker .*known names are .*tensorboard.*wandb"):
        Accelerator(log_with=log_with)


@pytest.mark.parametrize("log_with", ["tensorboard", "jsonl", ["tensorboard", "jsonl"]])
def test_a_known_tracker_name_without_a_logging_directory_says_what_to_give(log_with):
    with pytest.raises(ValueError, match="requires a `logging_dir`.*project_dir"):
        Accelerator(log_with=log_with)
