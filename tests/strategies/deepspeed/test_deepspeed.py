"""DeepSpeed (strategies/deepspeed.py): the multi-process checks of tests/strategies/deepspeed/check_deepspeed.py, the
"auto" filling table, and the choices refused before any engine or process group exists. Training numbers for
every ZeRO stage, and checkpoints across strategies, are the conformance suite's (test_strategy_conformance.py)."""
import importlib.util
import re
import subprocess
import sys
from types import SimpleNamespace

import logging

import pytest
import torch
from torch import nn

from hasten import Accelerator, DeepSpeedPlugin
from hasten.strategies.deepspeed.auto_config import check_plugin_config, hidden_size_of, micro_batch_size, resolved_config
from hasten.utils import DummyOptim, DummyScheduler

from helpers import clean_env, run_launch

# deepspeed is imported inside the tests only (importing it sets variables: conftest puts them back)
pytestmark = [pytest.mark.deepspeed, pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None,
                                                         reason="needs the deepspeed extra (make test installs it)")]


def test_deepspeed_on_two_processes_auto_values_boundary_resume_two_plugins_and_zero3_save_model(tmp_path):
    result = run_launch("check_deepspeed.py", tmp_path, num_processes=2, timeout=600, preload=("deepspeed",))
    assert "DEEPSPEED CHECKS PASSED" in result.stdout, result.stdout


def test_a_config_file_selecting_deepspeed_trains_one_process_with_it(tmp_path):
    config = tmp_path / "ds.yaml"
    config.write_text("compute_environment: LOCAL_MACHINE\ndistributed_type: DEEPSPEED\nnum_processes: 1\n"
                      "use_cpu: true\ndeepspeed_config:\n  zero_stage: 1\n")
    script = tmp_path / "train.py"
    script.write_text(
        "import torch\nfrom torch.utils.data import DataLoader, TensorDataset\nfrom hasten import Accelerator\n"
        "accelerator = Accelerator()\nmodel = torch.nn.Linear(4, 1)\n"
        "model, optimizer, loader = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1), "
        "DataLoader(TensorDataset(torch.randn(8, 4), torch.randn(8, 1)), batch_size=2))\n"
        "for x, y in loader:\n    accelerator.backward(((model(x) - y) ** 2).mean())\n    optimizer.step()\n"
        "print('TRAINED WITH', type(accelerator.strategy).__name__, model.zero_optimization_stage())\n")
    result = run_launch(script, num_processes=None, launch_args=["--config_file", str(config)],
                        preload=("deepspeed",))
    assert "TRAINED WITH DeepSpeedStrategy 1" in result.stdout, result.stdout + result.stderr


def run_alone(script) -> subprocess.CompletedProcess:
    """``python script`` in its folder, without a launcher (one process, DeepSpeed's own single-process set-up)."""
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=clean_env(),
                          cwd=script.parent, timeout=240)


def test_one_process_without_a_launcher_trains_with_deepspeed(tmp_path):
    script = tmp_path / "alone.py"
    script.write_text(
        "import torch\nfrom torch.utils.data import DataLoader, TensorDataset\n"
        "from hasten import Accelerator, DeepSpeedPlugin\n"
        "accelerator = Accelerator(cpu=True, deepspeed_plugin=DeepSpeedPlugin(zero_stage=3))\n"
        "model = torch.nn.Linear(4, 1)\n"
        "model, optimizer, loader = accelerator.prepare(model, torch.optim.AdamW(model.parameters()), "
        "DataLoader(TensorDataset(torch.randn(8, 4), torch.randn(8, 1)), batch_size=2))\n"
        "for x, y in loader:\n    accelerator.backward(((model(x) - y) ** 2).mean())\n    optimizer.step()\n"
        "accelerator.save_state('ckpt')\nprint('ALONE', model.zero_optimization_stage(), accelerator.num_processes)\n")
    result = run_alone(script)
    assert "ALONE 3 1" in result.stdout, result.stdout + result.stderr
    assert (tmp_path / "ckpt" / "pytorch_model").is_dir()


# ------------------------------------------------------------------------------------------ the "auto" table
class WithConfig(nn.Module):
    def __init__(self, **config):
        super().__init__()
        self.config = SimpleNamespace(**config)
        self.layer = nn.Linear(2, 2)


def _loader(batch_size: int, processes: int = 2):
    return SimpleNamespace(total_batch_size=batch_size * processes)


def _auto_plugin(**extra) -> DeepSpeedPlugin:
    config = {"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto",
              "gradient_accumulation_steps": "auto", "gradient_clipping": "auto",
              "fp16": {"enabled": "auto"}, "bf16": {"enabled": "auto"},
              "zero_optimization": {"stage": 3, "reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": "auto",
                                    "stage3_param_persistence_threshold": "auto"}}
    config.update(extra)
    return DeepSpeedPlugin(hf_ds_config=config)


def test_every_auto_value_is_filled_from_the_run_as_the_documented_table_says():
    model = WithConfig(hidden_size=64)
    params = list(model.parameters())
    optimizer, scheduler = DummyOptim(params, lr=3e-4, weight_decay=0.1), None
    plugin = _auto_plugin(optimizer={"type": "AdamW", "params": {"lr": "auto", "weight_decay": "auto"}})
    config = resolved_config(plugin, model=model, optimizer=optimizer, scheduler=scheduler,
                             loaders=[_loader(8), _loader(4)], accumulation_steps=3, data_parallel_size=2,
                             mixed_precision="bf16")
    assert config["train_micro_batch_size_per_gpu"] == 4  # the smallest loader: is_train_batch_min
    assert config["gradient_accumulation_steps"] == 3 and config["train_batch_size"] == 4 * 3 * 2
    assert config["gradient_clipping"] == 1.0
    assert config["bf16"]["enabled"] is True and config["fp16"]["enabled"] is False
    zero = config["zero_optimization"]
    assert zero["reduce_bucket_size"] == 64 * 64 and zero["stage3_prefetch_bucket_size"] == int(0.9 * 64 * 64)
    assert zero["stage3_param_persistence_threshold"] == 640
    assert config["optimizer"]["params"] == {"lr": 3e-4, "weight_decay": 0.1}
    assert plugin.deepspeed_config["train_batch_size"] == "auto"  # the plugin's own config is left as given


def test_the_largest_loader_decides_with_is_train_batch_min_false_and_hidden_sizes_lists_count():
    plugin = _auto_plugin()
    plugin.is_train_batch_min = False
    model = WithConfig(hidden_sizes=[8, 32, 16])
    assert hidden_size_of(model) == 32 and hidden_size_of(nn.Linear(1, 1)) is None
    config = resolved_config(plugin, model=model, loaders=[_loader(8), _loader(4)], data_parallel_size=2)
    assert config["train_micro_batch_size_per_gpu"] == 8
    assert config["zero_optimization"]["reduce_bucket_size"] == 32 * 32
    assert micro_batch_size([], 2, True) is None


@pytest.mark.parametrize("model, message", [
    (nn.Linear(2, 2), "Can't find `model.config` entry"),
    (WithConfig(vocab_size=8), "Can find neither `model.config.hidden_size` nor `model.config.hidden_sizes`"),
])
def test_auto_bucket_sizes_need_the_models_hidden_size_as_in_the_reference(model, message):
    """Accelerate refuses these too: the three 'auto' sizes come from model.config.hidden_size."""
    with pytest.raises(ValueError, match=re.escape(message) + ".*zero_optimization.reduce_bucket_size"):
        resolved_config(_auto_plugin(), model=model, loaders=[_loader(2)], data_parallel_size=2)


def test_bucket_sizes_the_config_sets_need_no_hidden_size_and_without_a_model_deepspeed_decides():
    plugin = _auto_plugin(zero_optimization={"stage": 3, "reduce_bucket_size": 1000})
    config = resolved_config(plugin, model=nn.Linear(2, 2), loaders=[_loader(2)], data_parallel_size=2)
    assert config["zero_optimization"]["reduce_bucket_size"] == 1000
    config = resolved_config(_auto_plugin(), model=None, optimizer=object(), loaders=[_loader(2)],
                             data_parallel_size=2)
    assert not set(config["zero_optimization"]) & {"reduce_bucket_size", "stage3_prefetch_bucket_size",
                                                   "stage3_param_persistence_threshold"}


def test_the_plugins_gradient_clipping_and_dummy_scheduler_fill_their_auto_values():
    plugin = _auto_plugin(scheduler={"type": "WarmupDecayLR", "params": {
        "warmup_min_lr": "auto", "warmup_max_lr": "auto", "warmup_num_steps": "auto", "total_num_steps": "auto"}})
    plugin.gradient_clipping = 0.3
    optimizer = DummyOptim([torch.zeros(1)], lr=0.05)
    config = resolved_config(plugin, model=WithConfig(hidden_size=4), optimizer=optimizer,
                             scheduler=DummyScheduler(optimizer, total_num_steps=100, warmup_num_steps=10),
                             loaders=[_loader(2)], data_parallel_size=2)
    assert config["gradient_clipping"] == 0.3
    assert config["scheduler"]["params"] == {"warmup_min_lr": 0, "warmup_max_lr": 0.05, "warmup_num_steps": 10,
                                             "total_num_steps": 100}


def test_config_values_that_differ_from_the_run_are_used_and_all_named_with_both_sides(caplog):
    """As in the reference: a number the config sets is the engine's; the warning names every difference."""
    plugin = _auto_plugin(train_micro_batch_size_per_gpu=16, gradient_accumulation_steps=5)
    with caplog.at_level(logging.WARNING):
        config = resolved_config(plugin, model=WithConfig(hidden_size=4), loaders=[_loader(4)], accumulation_steps=2,
                                 data_parallel_size=2)
    assert (config["train_micro_batch_size_per_gpu"], config["gradient_accumulation_steps"]) == (16, 5)
    assert config["train_batch_size"] == 16 * 5 * 2  # the "auto" filled from the values the engine uses
    message = caplog.text
    assert "train_micro_batch_size_per_gpu=16" in message and "4 from" in message
    assert "gradient_accumulation_steps=5" in message and "Accelerator(gradient_accumulation_steps=...)" in message


def test_batch_sizes_that_do_not_multiply_out_are_refused():
    plugin = _auto_plugin(train_batch_size=30, train_micro_batch_size_per_gpu=4, gradient_accumulation_steps=2)
    with pytest.raises(ValueError, match=r"train_batch_size=30, but train_micro_batch_size_per_gpu=4 x "
                                         r"gradient_accumulation_steps=2 x 2 data-parallel processes = 16"):
        resolved_config(plugin, model=WithConfig(hidden_size=4), loaders=[], accumulation_steps=2,
                        data_parallel_size=2)


def test_an_auto_micro_batch_without_any_prepared_loader_says_how_to_fix_it():
    with pytest.raises(ValueError, match="same prepare\\(\\) call"):
        resolved_config(_auto_plugin(), model=nn.Linear(1, 1), optimizer=object(), loaders=[], data_parallel_size=2)


# ------------------------------------------------------------------------------------------ refused up front
@pytest.mark.parametrize("config, message", [
    ({"zero_optimization": {"stage": 4}}, "not a ZeRO stage"),
    ({"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme"}}}, "nvme_path"),
    ({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "disk"}}}, "none, cpu or nvme"),
    ({"zero_optimization": {"stage": 2}, "fp16": {"enabled": True}}, "fp16 on the CPU"),
])
def test_configs_no_engine_can_run_are_refused_with_the_reason(config, message):
    with pytest.raises(ValueError, match=message):
        check_plugin_config(config, "cpu", "no")


@pytest.mark.parametrize("config, message", [
    ({"zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}}}, "offload_param only takes effect"),
    ({"zero_optimization": {"stage": 0, "offload_optimizer": {"device": "cpu"}}}, "stage 1-3 feature"),
])
def test_offload_settings_the_stage_ignores_are_warned_about_not_refused(config, message, caplog):
    """DeepSpeed trains without them (as the reference lets it): a warning says they have no effect."""
    with caplog.at_level("WARNING"):
        check_plugin_config(config, "cpu", "no")
    assert message in caplog.text


@pytest.mark.parametrize("given, stage", [("zero2", 2), ("ZeRO-3", 3), ("stage_1", 1), ("0", 0), (3, 3)])
def test_zero_stage_takes_the_stage_names(clean_env_vars, given, stage):
    plugin = DeepSpeedPlugin(zero_stage=given)
    assert plugin.zero_stage == stage and plugin.deepspeed_config["zero_optimization"]["stage"] == stage


def test_a_zero2_plugin_with_parameter_offload_is_accepted_with_a_warning(clean_env_vars, caplog):
    plugin = DeepSpeedPlugin(zero_stage="zero2", offload_optimizer_device="cpu", offload_param_device="cpu")
    with caplog.at_level("WARNING"):
        check_plugin_config(plugin.deepspeed_config, "cpu", "no")
    assert plugin.zero_stage == 2 and "offload_param only takes effect" in caplog.text


def test_the_plugin_refuses_an_unknown_stage_and_nvme_without_a_path(clean_env_vars):
    with pytest.raises(ValueError, match="zero_stage"):
        DeepSpeedPlugin(zero_stage=5)
    with pytest.raises(ValueError, match="zero_stage must be a ZeRO stage.*'zero5'"):
        DeepSpeedPlugin(zero_stage="zero5")
    with pytest.raises(ValueError, match="nvme_path"):
        Accelerator(cpu=True, deepspeed_plugin=DeepSpeedPlugin(zero_stage=3, offload_param_device="nvme"))


def test_zero3_init_is_for_stage_3_only(clean_env_vars):
    with pytest.raises(ValueError, match="zero_stage=3"):
        DeepSpeedPlugin(zero_stage=2).zero3_init()


def test_moe_leaf_module_names_the_model_does_not_have_are_listed(clean_env_vars):
    plugin = DeepSpeedPlugin(zero_stage=3, transformer_moe_cls_names="MixtralSparseMoeBlock")
    with pytest.raises(ValueError, match=r"MixtralSparseMoeBlock.*Linear"):
        plugin.set_moe_leaf_modules(nn.Sequential(nn.Linear(1, 1)))


def test_moe_leaf_modules_are_marked_for_zero3(clean_env_vars):
    from deepspeed.utils import z3_leaf_module

    class Experts(nn.Module):
        def __init__(self):
            super().__init__()
            self.experts = nn.ModuleList([nn.Linear(2, 2) for _ in range(2)])

    model = nn.Sequential(nn.Linear(2, 2), Experts())
    DeepSpeedPlugin(zero_stage=3, transformer_moe_cls_names="Experts").set_moe_leaf_modules(model)
    assert z3_leaf_module(model[1]) and not z3_leaf_module(model[0])


def test_zero3_init_flag_tells_transformers_and_the_context_manager_switches_it(clean_env_vars):
    from transformers.integrations import is_deepspeed_zero3_enabled

    plugin = DeepSpeedPlugin(zero_stage=3, zero3_init_flag=True)
    assert not is_deepspeed_zero3_enabled()
    plugin.select(_from_accelerator_state=True)  # as AcceleratorState selects it
    try:
        assert is_deepspeed_zero3_enabled() and plugin.dschf.is_zero3()
        with plugin.zero3_init_context_manager(enable=False):
            assert not is_deepspeed_zero3_enabled() and not plugin.is_zero3_init_enabled()
        assert is_deepspeed_zero3_enabled() and plugin.is_zero3_init_enabled()
    finally:
        plugin._unset_deepspeed_weakref()
    assert not is_deepspeed_zero3_enabled()


def test_without_deepspeed_installed_the_error_names_the_extra(tmp_path):
    code = ("import importlib.util, sys\nreal = importlib.util.find_spec\n"
            "importlib.util.find_spec = lambda name, *a: None if name == 'deepspeed' else real(name, *a)\n"
            "from hasten import Accelerator, DeepSpeedPlugin\n"
            "try:\n    Accelerator(cpu=True, deepspeed_plugin=DeepSpeedPlugin())\n"
            "except ImportError as error:\n    print('ERROR', error)\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=clean_env(),
                            timeout=120)
    assert "pip install 'hasten[deepspeed]'" in result.stdout, result.stdout + result.stderr


@pytest.fixture
def clean_env_vars(monkeypatch):
    for key in ("HASTEN_USE_DEEPSPEED", "HASTEN_DEEPSPEED_ZERO_STAGE"):
        monkeypatch.delenv(key, raising=False)


def test_fp16_on_the_cpu_is_refused_at_prepare_not_when_the_accelerator_is_made(clean_env_vars):
    """The config can be read (and the state built) as in the reference; DeepSpeed itself fails to build an fp16
    engine on a CPU, so prepare refuses before touching the model."""
    from hasten import Accelerator

    accelerator = Accelerator(mixed_precision="fp16", deepspeed_plugin=DeepSpeedPlugin(zero_stage=2))
    assert accelerator.state.deepspeed_plugin.deepspeed_config["fp16"]["enabled"] is True
    model = nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = torch.utils.data.DataLoader(torch.randn(8, 2), batch_size=2)
    with pytest.raises(ValueError, match="fp16 on the CPU.*mixed_precision='bf16'"):
        accelerator.prepare(model, optimizer, loader)
    assert not accelerator._models and not getattr(model, "_is_accelerate_prepared", False)


def test_the_selected_plugin_is_transformers_deepspeed_config_and_follows_select(clean_env_vars):
    """transformers' deepspeed_config() answers the selected plugin's config (any stage), as with the reference."""
    from transformers.integrations.deepspeed import deepspeed_config, is_deepspeed_zero3_enabled

    from hasten.state import AcceleratorState

    zero2 = DeepSpeedPlugin(hf_ds_config={"zero_optimization": {"stage": 2}, "train_micro_batch_size_per_gpu": 1})
    zero3 = DeepSpeedPlugin(hf_ds_config={"zero_optimization": {"stage": 3}, "train_micro_batch_size_per_gpu": 1},
                            zero3_init_flag=True)
    try:
        accelerator = Accelerator(deepspeed_plugin={"zero2": zero2, "zero3": zero3})
        assert accelerator.deepspeed_plugin is zero2
        assert deepspeed_config()["zero_optimization"]["stage"] == 2 and not is_deepspeed_zero3_enabled()
        accelerator.state.select_deepspeed_plugin("zero3")
        assert deepspeed_config() == zero3.hf_ds_config.config and is_deepspeed_zero3_enabled()
        lazy = DeepSpeedPlugin(zero_stage=3, zero3_init_flag=False)
        lazy.select(_from_accelerator_state=True)  # ZeRO-3 without the flag: transformers must not partition
        assert deepspeed_config() is None and not is_deepspeed_zero3_enabled()
    finally:
        zero3._unset_deepspeed_weakref()
        AcceleratorState._reset_state(True)


def test_a_second_accelerator_without_plugins_joins_the_runs_deepspeed_and_keeps_its_selection(clean_env_vars):
    """As in the reference, whose second Accelerator reads the state's plugins (a script's helper, a callback)."""
    from hasten.state import AcceleratorState

    zero2 = DeepSpeedPlugin(hf_ds_config={"zero_optimization": {"stage": 2}, "train_micro_batch_size_per_gpu": 1})
    zero3 = DeepSpeedPlugin(hf_ds_config={"zero_optimization": {"stage": 3}, "train_micro_batch_size_per_gpu": 1})
    try:
        first = Accelerator(deepspeed_plugins={"zero2": zero2, "zero3": zero3})
        first.state.select_deepspeed_plugin("zero3")
        second = Accelerator()
        assert type(second.strategy).__name__ == "DeepSpeedStrategy"
        assert second.deepspeed_plugin is zero3 and first.deepspeed_plugin is zero3
        with pytest.raises(NotImplementedError, match="second `Accelerator`"):
            Accelerator(deepspeed_plugin=DeepSpeedPlugin(zero_stage=1))
    finally:
        zero3._unset_deepspeed_weakref()
        AcceleratorState._reset_state(True)


def test_a_dummy_scheduler_without_warm_up_fills_the_smallest_warm_up_deepspeed_takes():
    """DummyScheduler's default warm-up is 0, which recent DeepSpeed versions refuse ("must be a positive
    integer"); older ones ran it as a 2-step warm-up, which 1 gives. A number the user sets is kept."""
    model = WithConfig(hidden_size=8)
    optimizer = DummyOptim(list(model.parameters()), lr=0.1)
    schedule = {"type": "WarmupLR", "params": {"warmup_num_steps": "auto", "warmup_max_lr": "auto",
                                               "warmup_min_lr": "auto"}}
    plugin = _auto_plugin(optimizer={"type": "AdamW", "params": {"lr": "auto"}}, scheduler=schedule)
    config = resolved_config(plugin, model=model, optimizer=optimizer, scheduler=DummyScheduler(optimizer),
                             loaders=[_loader(2)], data_parallel_size=1)
    assert config["scheduler"]["params"] == {"warmup_num_steps": 1, "warmup_max_lr": 0.1, "warmup_min_lr": 0}
    from deepspeed.runtime.lr_schedules import WarmupLR

    WarmupLR(torch.optim.SGD(model.parameters(), lr=0.1), **config["scheduler"]["params"])  # DeepSpeed takes it
    config = resolved_config(plugin, model=model, optimizer=optimizer,
                             scheduler=DummyScheduler(optimizer, warmup_num_steps=5), loaders=[_loader(2)])
    assert config["scheduler"]["params"]["warmup_num_steps"] == 5


def test_full_files_load_into_an_engine_whose_model_has_non_persistent_buffers(tmp_path):
    """A rotary embedding's ``inv_freq`` (transformers' Llama, Qwen ...) is a non-persistent buffer: state dicts never
    hold it, and loading a one-process checkpoint into a DeepSpeed engine asked for it ("The state to load has no
    'rotary.inv_freq'"). Saved by a plain Accelerator, loaded under ZeRO-2 and ZeRO-3 in one process."""
    script = tmp_path / "buffers.py"
    script.write_text(
        "import torch\nfrom torch.utils.data import DataLoader, TensorDataset\n"
        "from hasten import Accelerator, DeepSpeedPlugin\nfrom hasten.state import AcceleratorState\n"
        "class Rotary(torch.nn.Module):\n"
        "    def __init__(self):\n        super().__init__()\n        self.layer = torch.nn.Linear(4, 4)\n"
        "        self.register_buffer('inv_freq', torch.arange(4.0), persistent=False)\n"
        "        self.register_buffer('kept', torch.ones(4))\n"
        "    def forward(self, x):\n        return self.layer(x * self.inv_freq * self.kept)\n"
        "def objects():\n    torch.manual_seed(0)\n    model = Rotary()\n"
        "    return model, torch.optim.SGD(model.parameters(), lr=0.1), "
        "DataLoader(TensorDataset(torch.randn(8, 4)), batch_size=2)\n"
        "accelerator = Accelerator(cpu=True)\nmodel, optimizer, _ = accelerator.prepare(*objects())\n"
        "with torch.no_grad():\n    model.layer.weight.mul_(3)\n    model.kept.fill_(2)\n"
        "accelerator.save_state('plain')\nsaved = {k: v.clone() for k, v in model.state_dict().items()}\n"
        "for stage in (2, 3):\n    AcceleratorState._reset_state(True)\n"
        "    accelerator = Accelerator(cpu=True, deepspeed_plugin=DeepSpeedPlugin(zero_stage=stage))\n"
        "    model, optimizer, _ = accelerator.prepare(*objects())\n    accelerator.load_state('plain')\n"
        "    loaded = accelerator.get_state_dict(model)\n"
        "    assert loaded.keys() == saved.keys() and all(torch.equal(loaded[k], saved[k]) for k in saved), stage\n"
        "    print('LOADED UNDER ZERO', stage, flush=True)\n")
    result = run_alone(script)
    assert "LOADED UNDER ZERO 2" in result.stdout and "LOADED UNDER ZERO 3" in result.stdout, \
        result.stdout + result.stderr[-4000:]
