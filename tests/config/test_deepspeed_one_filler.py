"""One filler for DeepSpeed's ``"auto"`` values (``fill_auto`` in ``config/deepspeed.py``), two rules on a conflict.

The public ``DeepSpeedPlugin.fill_match`` / ``deepspeed_config_process`` collect every mismatch and raise one
``ValueError`` (``must_match=False`` keeps the config's value); the engine path
(``strategies/deepspeed/auto_config.py``) keeps the config's value and names the conflict in one warning. Each test
here gives both paths the same key and the same values, so the two cannot drift apart again. Nothing is launched.
"""
import copy
import importlib.util
import logging
import os
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from hasten import DeepSpeedPlugin
from hasten.config.deepspeed import HfDeepSpeedConfig, fill_auto
from hasten.strategies.deepspeed import auto_config
from hasten.strategies.deepspeed.auto_config import _Filler, resolved_config
from hasten.utils import DummyOptim, DummyScheduler

pytestmark = pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None,
                                reason="needs the deepspeed extra (make test installs it)")


def _plugin(**config) -> DeepSpeedPlugin:
    base = {"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
            "zero_optimization": {"stage": 2}}
    base.update(config)
    return DeepSpeedPlugin(hf_ds_config=base)


def _loader(batch_size: int, processes: int = 2):
    return SimpleNamespace(total_batch_size=batch_size * processes)


class WithConfig(nn.Module):
    def __init__(self, hidden_size: int = 4):
        super().__init__()
        self.config = SimpleNamespace(hidden_size=hidden_size)
        self.layer = nn.Linear(2, 2)


def _engine_warnings(caplog) -> list:
    return [record for record in caplog.records
            if record.name == auto_config.logger.name and record.levelno == logging.WARNING]


def test_both_paths_use_the_same_filler():
    assert auto_config.fill_auto is fill_auto


# ---------------------------------------------------------------------------- the same conflict, both paths
def test_a_conflict_raises_on_the_public_path_and_warns_once_on_the_engine_path(caplog):
    """train_micro_batch_size_per_gpu=16 and gradient_accumulation_steps=5 in the config; the run says 4 and 2."""
    config = {"train_micro_batch_size_per_gpu": 16, "gradient_accumulation_steps": 5}

    public = _plugin(**config)
    with pytest.raises(ValueError, match="mismatch kwargs values") as raised:
        public.deepspeed_config_process(train_micro_batch_size_per_gpu=4, gradient_accumulation_steps=2,
                                        train_batch_size=16)
    message = str(raised.value)
    assert "- ds train_micro_batch_size_per_gpu=16 vs arg train_micro_batch_size_per_gpu=4" in message
    assert "- ds gradient_accumulation_steps=5 vs arg gradient_accumulation_steps=2" in message

    kept = _plugin(**config)
    kept.deepspeed_config_process(must_match=False, train_micro_batch_size_per_gpu=4, gradient_accumulation_steps=2,
                                  train_batch_size=16)
    assert (kept.get_value("train_micro_batch_size_per_gpu"), kept.get_value("gradient_accumulation_steps")) == (16, 5)
    assert kept.get_value("train_batch_size") == 16  # the "auto" is filled all the same

    engine = _plugin(**config)
    with caplog.at_level(logging.WARNING):
        resolved = resolved_config(engine, model=WithConfig(), loaders=[_loader(4)], accumulation_steps=2,
                                   data_parallel_size=2)
    assert (resolved["train_micro_batch_size_per_gpu"], resolved["gradient_accumulation_steps"]) == (16, 5)
    assert resolved["train_batch_size"] == 16 * 5 * 2
    warnings = _engine_warnings(caplog)
    assert len(warnings) == 1, [record.getMessage() for record in warnings]
    text = warnings[0].getMessage()
    assert "train_micro_batch_size_per_gpu=16 in the DeepSpeed config (used) vs 4 from the prepared DataLoader" in text
    assert "gradient_accumulation_steps=5 in the DeepSpeed config (used) vs 2 from Accelerator(" in text


def test_no_conflict_no_warning_and_no_error(caplog):
    _plugin(train_micro_batch_size_per_gpu=4).deepspeed_config_process(train_micro_batch_size_per_gpu=4,
                                                                       gradient_accumulation_steps=2,
                                                                       train_batch_size=16)
    with caplog.at_level(logging.WARNING):
        resolved_config(_plugin(train_micro_batch_size_per_gpu=4), model=WithConfig(), loaders=[_loader(4)],
                        accumulation_steps=2, data_parallel_size=2)
    assert _engine_warnings(caplog) == []


# ---------------------------------------------------------------------------- one table, both fillers
# (config, dotted key, value): what the public path's fill_match and the engine's _Filler both get
CASES = [
    pytest.param({"gradient_clipping": "auto"}, "gradient_clipping", 0.5, id="top-level auto"),
    pytest.param({"optimizer": {"params": {"lr": "auto"}}}, "optimizer.params.lr", 3e-4, id="nested auto"),
    pytest.param({"gradient_clipping": 1.0}, "gradient_clipping", 0.5, id="top-level conflict"),
    pytest.param({"optimizer": {"params": {"lr": 0.1}}}, "optimizer.params.lr", 3e-4, id="nested conflict"),
    pytest.param({"optimizer": {"params": {"lr": 0.1}}}, "optimizer.params.lr", 0.1, id="nested equal"),
    pytest.param({}, "optimizer.params.lr", 3e-4, id="missing intermediate key"),
    pytest.param({"optimizer": None}, "optimizer.params.lr", 3e-4, id="intermediate None"),
    pytest.param({"optimizer": {"params": "none"}}, "optimizer.params.lr", 3e-4, id="intermediate not a dict"),
    pytest.param({"optimizer": {"params": {}}}, "optimizer.params.lr", 3e-4, id="missing last key"),
    pytest.param({"optimizer": {"params": {"lr": None}}}, "optimizer.params.lr", 3e-4, id="value None"),
]


@pytest.mark.parametrize("config, key, value", CASES)
@pytest.mark.parametrize("compare", [True, False])
def test_the_public_and_the_engine_filler_agree_on_every_case(config, key, value, compare):
    plugin = _plugin(**copy.deepcopy(config))
    engine_config = copy.deepcopy(plugin.deepspeed_config)

    mismatches: list = []
    plugin.fill_match(key, mismatches, must_match=compare, **{key: value})
    filler = _Filler(engine_config)
    filler.fill(key, value, "the test", must_match=compare)

    assert engine_config == plugin.deepspeed_config  # the same value filled, the config's kept
    assert [c.key for c in filler.conflicts] == [key] * len(mismatches)
    if mismatches:
        conflict = filler.conflicts[0]
        assert mismatches == [f"- ds {key}={conflict.config_value} vs arg {key}={value}"]
        assert (conflict.other_value, conflict.source) == (value, "the test")
        assert HfDeepSpeedConfig(config).get_value(key) == conflict.config_value == plugin.get_value(key)
    assert bool(mismatches) == (compare and HfDeepSpeedConfig(config).get_value(key) not in (None, "auto", value))


def test_an_intermediate_that_is_not_a_dict_is_read_as_absent():
    config = HfDeepSpeedConfig({"zero_optimization": {"stage": 2, "offload_param": "none"}})
    assert config.find_config_node("zero_optimization.offload_param.device") == (None, "device")
    assert config.get_value("zero_optimization.offload_param.device", "cpu") == "cpu"
    plugin = DeepSpeedPlugin(hf_ds_config={"zero_optimization": {"stage": 2, "offload_param": "none"}},
                             offload_param_device="cpu")
    assert plugin.deepspeed_config["zero_optimization"]["offload_param"] == "none"


# ---------------------------------------------------------------------------- "auto" filled, or refused, in both
def test_auto_values_nested_and_top_level_are_filled_the_same_on_both_paths():
    config = {"gradient_clipping": "auto", "optimizer": {"type": "AdamW", "params": {"lr": "auto",
                                                                                      "weight_decay": "auto"}}}
    public = _plugin(**copy.deepcopy(config))
    run = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2, "train_batch_size": 16,
           "gradient_clipping": 1.0, "optimizer.params.lr": 3e-4, "optimizer.params.weight_decay": 0.1}
    public.deepspeed_config_process(**run)
    optimizer = DummyOptim([torch.zeros(1)], lr=3e-4, weight_decay=0.1)
    engine = resolved_config(_plugin(**copy.deepcopy(config)), model=WithConfig(), optimizer=optimizer,
                             loaders=[_loader(4)], accumulation_steps=2, data_parallel_size=2)
    for key in ("train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "train_batch_size",
                "gradient_clipping", "optimizer"):
        assert engine[key] == public.deepspeed_config[key], key
    assert engine["optimizer"]["params"] == {"lr": 3e-4, "weight_decay": 0.1}


def test_an_auto_value_nobody_gives_is_refused_on_both_paths_naming_the_key():
    schedule = {"type": "WarmupDecayLR", "params": {"total_num_steps": "auto", "warmup_num_steps": 10}}
    with pytest.raises(ValueError, match=r"`scheduler.params.total_num_steps` not found in kwargs"):
        _plugin(scheduler=copy.deepcopy(schedule)).fill_match("scheduler.params.total_num_steps", lr=1)
    optimizer = DummyOptim([torch.zeros(1)])
    with pytest.raises(ValueError, match=r"`scheduler.params.total_num_steps` not found in "
                                         r"DummyScheduler\(total_num_steps=...\)"):
        resolved_config(_plugin(scheduler=copy.deepcopy(schedule)), model=WithConfig(), optimizer=optimizer,
                        scheduler=DummyScheduler(optimizer), loaders=[_loader(4)], data_parallel_size=2)


# ---------------------------------------------------------------------------- the reference's public behaviour
@pytest.mark.parametrize("must_match", [True, False])
def test_the_public_path_behaves_as_the_reference(must_match, monkeypatch):
    accelerate = pytest.importorskip("accelerate.utils")
    for name in list(os.environ):
        if name.startswith(("ACCELERATE_", "HASTEN_")):
            monkeypatch.delenv(name)
    config = {"train_micro_batch_size_per_gpu": 16, "gradient_accumulation_steps": "auto",
              "zero_optimization": {"stage": 2, "reduce_bucket_size": 10},
              "optimizer": {"params": {"lr": 0.1, "weight_decay": "auto"}}}
    kwargs = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2,
              "zero_optimization.reduce_bucket_size": 20, "optimizer.params.lr": 0.2,
              "optimizer.params.weight_decay": 0.0}
    outcomes = []
    for cls in (DeepSpeedPlugin, accelerate.DeepSpeedPlugin):
        plugin = cls(hf_ds_config=copy.deepcopy(config))
        try:
            plugin.deepspeed_config_process(must_match=must_match, **kwargs)
            outcomes.append(("filled", {k: v for k, v in plugin.deepspeed_config.items() if k != "steps_per_print"}))
        except ValueError as error:  # the lines naming each mismatch (the reference's sentence has a stray space)
            outcomes.append(("raised", [line for line in str(error).splitlines() if line.startswith("- ds ")]))
    assert outcomes[0] == outcomes[1]
    assert outcomes[0][0] == ("raised" if must_match else "filled")
    if must_match:
        assert len(outcomes[0][1]) == 3  # every mismatch, nested ones included, in one error
