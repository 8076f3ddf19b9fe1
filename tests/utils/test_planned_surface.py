"""The planned backends' public names: real configuration objects now, ``NotYetSupportedError`` when used.

Covers ``hasten.utils.dataclasses`` and the plugin dataclasses in ``hasten.config``, ``hasten.utils.{fsdp_utils,
deepspeed, megatron_lm, bnb, transformer_engine, ao}``, ``hasten.parallelism_config``, ``hasten.inference`` and
``hasten.tracking``. Where the reference library is installed, field names, order, defaults and resolved values are
compared with it.
"""
from __future__ import annotations

import base64
import dataclasses
import json
import os
import subprocess
import sys
import types
import warnings

import pytest
import torch
from torch import nn

import hasten
import hasten.tracking
import hasten.utils
from hasten import inference
from hasten.config.resolution import ConfigConflictError
from hasten.utils import ao, bnb, deepspeed, fsdp_utils, megatron_lm, transformer_engine
from hasten.utils import dataclasses as hdc
from hasten.core.planned import NotYetSupportedError

PLANNED_DATACLASSES = [
    "DeepSpeedPlugin", "FullyShardedDataParallelPlugin", "MegatronLMPlugin", "TorchTensorParallelPlugin",
    "TorchTensorParallelConfig", "TorchContextParallelConfig", "DeepSpeedSequenceParallelConfig",
    "BnbQuantizationConfig", "AORecipeKwargs", "TERecipeKwargs", "MSAMPRecipeKwargs", "FP8RecipeKwargs",
]
_REFERENCE_ENV_PREFIXES = ("FSDP_", "MEGATRON_LM_", "PARALLELISM_CONFIG_", "ACCELERATE_", "HASTEN_")


@pytest.fixture
def clean_env(monkeypatch):
    """No launcher variable of either library: both read their defaults."""
    for key in list(os.environ):
        if key.startswith(_REFERENCE_ENV_PREFIXES):
            monkeypatch.delenv(key)
    return monkeypatch


@pytest.fixture
def reference():
    return pytest.importorskip("accelerate")


def _fields(cls):
    return [(f.name, f.default) for f in dataclasses.fields(cls)]


# ----------------------------------------------------------------------------- the names and the reference
# hasten's additions, after the reference's fields and with defaults, so every call written for Accelerate is the same
EXTENSIONS = {"TorchTensorParallelConfig": [("tp_plan", None)],
              "ParallelismConfig": [("pp_size", None), ("pp_handler", None)]}


@pytest.mark.parametrize("name", PLANNED_DATACLASSES + ["ParallelismConfig"])
def test_fields_have_the_reference_names_order_and_defaults(reference, name):
    import accelerate.parallelism_config
    import accelerate.utils.dataclasses as rdc

    ours = hasten.utils.ParallelismConfig if name == "ParallelismConfig" else getattr(hdc, name)
    theirs = accelerate.parallelism_config.ParallelismConfig if name == "ParallelismConfig" else getattr(rdc, name)
    assert _fields(ours) == _fields(theirs) + EXTENSIONS.get(name, [])


def test_package_level_re_exports_are_the_home_objects():
    from hasten import DeepSpeedPlugin, FullyShardedDataParallelPlugin, ParallelismConfig, prepare_pippy
    from hasten.config.deepspeed import DeepSpeedPlugin as home_deepspeed
    from hasten.config.fsdp import FullyShardedDataParallelPlugin as home_fsdp
    from hasten.inference import prepare_pippy as home_pippy
    from hasten.parallelism_config import ParallelismConfig as home_parallelism
    from hasten.utils import FP8RecipeKwargs, load_and_quantize_model, merge_fsdp_weights

    assert (DeepSpeedPlugin, FullyShardedDataParallelPlugin, ParallelismConfig, prepare_pippy) == (
        home_deepspeed, home_fsdp, home_parallelism, home_pippy)
    assert FP8RecipeKwargs is hdc.FP8RecipeKwargs
    assert load_and_quantize_model is bnb.load_and_quantize_model
    assert merge_fsdp_weights is fsdp_utils.merge_fsdp_weights
    for name in PLANNED_DATACLASSES:
        assert getattr(hasten.utils, name) is getattr(hdc, name)


def test_no_optional_backend_is_imported_by_the_modules():
    blocked = ("deepspeed", "bitsandbytes", "transformer_engine", "torchao", "megatron", "msamp", "wandb",
               "tensorboard", "mlflow")
    code = f"""
import sys
class Blocker:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {blocked!r}:
            raise AssertionError("imported " + name)
sys.meta_path.insert(0, Blocker())
import hasten.utils.dataclasses, hasten.utils.fsdp_utils, hasten.utils.deepspeed, hasten.utils.megatron_lm
import hasten.utils.bnb, hasten.utils.transformer_engine, hasten.utils.ao, hasten.parallelism_config
import hasten.inference, hasten.tracking
from hasten.utils import DeepSpeedPlugin, FullyShardedDataParallelPlugin, TERecipeKwargs, AORecipeKwargs
DeepSpeedPlugin(); FullyShardedDataParallelPlugin(); TERecipeKwargs(); AORecipeKwargs()
assert "torch.distributed.fsdp" in sys.modules  # imported when the FSDP plugin is built, not before
print("clean")
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and "clean" in result.stdout, result.stderr[-3000:]


# ----------------------------------------------------------------------------- DeepSpeedPlugin / HfDeepSpeedConfig
@pytest.mark.parametrize("kwargs", [
    {},
    {"zero_stage": 3, "offload_param_device": "cpu", "offload_optimizer_device": "nvme", "gradient_clipping": 1.0,
     "offload_optimizer_nvme_path": "/nvme"},
    {"hf_ds_config": {"zero_optimization": {"stage": 3, "offload_param": {"device": "auto"}},
                      "gradient_clipping": "auto"}, "offload_param_device": "nvme", "gradient_clipping": 0.5},
])
def test_deepspeed_plugin_builds_the_same_config_as_the_reference(reference, clean_env, kwargs):
    from accelerate.utils import DeepSpeedPlugin as Reference

    ours, theirs = hdc.DeepSpeedPlugin(**kwargs), Reference(**kwargs)
    assert ours.deepspeed_config == theirs.deepspeed_config
    for field in dataclasses.fields(ours):
        if field.name != "hf_ds_config":
            assert getattr(ours, field.name) == getattr(theirs, field.name), field.name


def test_deepspeed_plugin_reads_a_config_file_and_fills_auto_values(tmp_path, clean_env):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"train_micro_batch_size_per_gpu": "auto", "gradient_clipping": "auto",
                                "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}}}))
    plugin = hdc.DeepSpeedPlugin(hf_ds_config=str(path), gradient_clipping=2.0)
    assert plugin.zero_stage == 3 and plugin.offload_optimizer_device == "cpu"
    assert plugin.deepspeed_config["gradient_clipping"] == 2.0
    assert plugin.hf_ds_config.is_zero3() and plugin.hf_ds_config.is_offload()
    assert plugin.zero3_init_flag is True and plugin.is_auto("train_micro_batch_size_per_gpu")
    plugin.deepspeed_config_process(must_match=False, train_micro_batch_size_per_gpu=4)
    assert plugin.get_value("train_micro_batch_size_per_gpu") == 4
    plugin.set_mixed_precision("bf16")
    assert plugin.deepspeed_config["bf16"] == {"enabled": True} and plugin.deepspeed_config["fp16"]["enabled"] is False


def test_hf_deepspeed_config_accepts_json_and_base64_text():
    config = {"zero_optimization": {"stage": 2}}
    text = json.dumps(config)
    for given in (text, base64.urlsafe_b64encode(text.encode()).decode()):
        parsed = deepspeed.HfDeepSpeedConfig(given)
        assert parsed.config == config and parsed.is_zero2() and not parsed.is_offload()
    parsed.del_config_sub_tree("zero_optimization.stage")
    assert parsed.get_value("zero_optimization.stage") is None
    with pytest.raises(ValueError, match="DeepSpeed config"):
        deepspeed.HfDeepSpeedConfig("neither a file nor json")


@pytest.mark.parametrize("kwargs, message", [
    ({"zero_stage": 5}, "zero_stage must be one of 0, 1, 2, 3"),
    ({"offload_param_device": "gpu"}, "offload_param_device must be one of 'none', 'cpu', 'nvme'"),
    ({"gradient_accumulation_steps": 0}, "gradient_accumulation_steps must be an integer >= 1"),
    ({"msamp_opt_level": "O3"}, "msamp_opt_level must be one of 'O1', 'O2'"),
    ({"hf_ds_config": {"train_batch_size": 8}}, "no 'zero_optimization' section"),
])
def test_deepspeed_plugin_rejects_bad_values(clean_env, kwargs, message):
    with pytest.raises(ValueError, match=message):
        hdc.DeepSpeedPlugin(**kwargs)


def test_plugin_fields_fall_back_to_the_launcher_environment(clean_env):
    clean_env.setenv("HASTEN_DEEPSPEED_ZERO_STAGE", "3")
    clean_env.setenv("ACCELERATE_FSDP_VERSION", "2")
    clean_env.setenv("HASTEN_MEGATRON_LM_TP_DEGREE", "4")
    clean_env.setenv("HASTEN_PARALLELISM_CONFIG_DP_SHARD_SIZE", "2")
    clean_env.setenv("HASTEN_FP8_FORMAT", "e4m3")
    assert hdc.DeepSpeedPlugin().zero_stage == 3
    assert hdc.FullyShardedDataParallelPlugin().fsdp_version == 2
    assert hdc.MegatronLMPlugin().tp_degree == 4
    assert hasten.utils.ParallelismConfig().dp_shard_size == 2
    assert hdc.TERecipeKwargs().fp8_format == "E4M3"
    assert hdc.DeepSpeedPlugin(zero_stage=3).zero_stage == 3  # agreeing sources are fine
    with pytest.raises(ConfigConflictError, match="HASTEN_DEEPSPEED_ZERO_STAGE"):
        hdc.DeepSpeedPlugin(zero_stage=1)
    clean_env.setenv("HASTEN_DEEPSPEED_ZERO_STAGE", "seven")
    with pytest.raises(ValueError, match="HASTEN_DEEPSPEED_ZERO_STAGE"):
        hdc.DeepSpeedPlugin()


def test_deepspeed_plugin_selection_goes_through_the_state(clean_env):
    plugin = hdc.DeepSpeedPlugin()
    assert plugin.selected is False
    with pytest.raises(ValueError, match="select_deepspeed_plugin"):
        plugin.select()
    with pytest.raises(NotImplementedError):
        plugin.selected = True
    plugin.select(_from_accelerator_state=True)  # what AcceleratorState().select_deepspeed_plugin does
    assert plugin.selected is True


# ----------------------------------------------------------------------------- FullyShardedDataParallelPlugin
@pytest.mark.parametrize("kwargs", [
    {},
    {"fsdp_version": 2, "mixed_precision_policy": "bf16", "auto_wrap_policy": "transformer_based_wrap",
     "cpu_offload": True},
    {"sharding_strategy": "SHARD_GRAD_OP", "backward_prefetch": "BACKWARD_POST",
     "state_dict_type": "sharded_state_dict",
     "mixed_precision_policy": {"param_dtype": torch.float16, "reduce_dtype": torch.float16,
                                "buffer_dtype": torch.float32}, "auto_wrap_policy": "size_based_wrap"},
    {"fsdp_version": 2, "reshard_after_forward": "false", "activation_checkpointing": True,
     "activation_checkpointing_offload": True, "state_dict_type": "FULL_STATE_DICT"},
])
def test_fsdp_plugin_resolves_like_the_reference(reference, clean_env, kwargs):
    from accelerate.utils import FullyShardedDataParallelPlugin as Reference

    assert repr(hdc.FullyShardedDataParallelPlugin(**kwargs)) == repr(Reference(**kwargs))


@pytest.mark.parametrize("kwargs, message", [
    ({"fsdp_version": 3}, "fsdp_version must be one of 1, 2"),
    ({"sharding_strategy": "SHARD_EVERYTHING"}, "sharding_strategy must be one of"),
    ({"auto_wrap_policy": "by_magic"}, "auto_wrap_policy must be a callable or one of"),
    ({"mixed_precision_policy": "fp64"}, "Invalid mixed precision 'fp64'"),
    ({"fsdp_version": 2, "state_dict_type": "LOCAL_STATE_DICT"}, "FSDP2 has no LOCAL_STATE_DICT"),
    ({"fsdp_version": 2, "reshard_after_forward": "FULL_SHARD"}, "must be True or False"),
    ({"fsdp_version": 2, "forward_prefetch": True}, "forward_prefetch is not yet implemented in FSDP2"),
    ({"activation_checkpointing_offload": True}, "requires activation_checkpointing=True"),
    ({"cpu_offload": "sometimes"}, "cpu_offload must be True or False"),
])
def test_fsdp_plugin_rejects_bad_values(clean_env, kwargs, message):
    with pytest.raises(ValueError, match=message):
        hdc.FullyShardedDataParallelPlugin(**kwargs)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 4)


class Stack(nn.Module):
    _no_split_modules = ["Block"]

    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([Block(), Block()])
        self.head = nn.Linear(4, 2)


def test_fsdp2_wrap_policy_and_the_plugins_own_binding(clean_env):
    model = Stack()
    plugin = hdc.FullyShardedDataParallelPlugin(fsdp_version=2, auto_wrap_policy="transformer_based_wrap")
    policy = fsdp_utils.fsdp2_prepare_auto_wrap_policy(plugin, model)
    assert [policy(m) for m in (model.blocks[0], model.head, model)] == [True, False, False]
    sized = hdc.FullyShardedDataParallelPlugin(fsdp_version=2, auto_wrap_policy="size_based_wrap", min_num_params=10)
    policy = fsdp_utils.fsdp2_prepare_auto_wrap_policy(sized, model)
    assert policy(model.blocks[0]) and not policy(model.head)  # 20 and 10 parameters
    assert fsdp_utils.fsdp2_prepare_auto_wrap_policy(hdc.FullyShardedDataParallelPlugin(fsdp_version=2), model) is None
    plugin.set_auto_wrap_policy(model)
    assert plugin.auto_wrap_policy.keywords["transformer_layer_cls"] == {Block}
    assert hdc.get_module_class_from_name(model, "Block") is Block
    assert hdc.get_module_class_from_name(model, "Missing") is None


# ----------------------------------------------------------------------------- Megatron, parallelism, bnb, fp8
@pytest.mark.parametrize("kwargs", [{}, {"tp_degree": 2, "pp_degree": 2, "consumed_samples": [5],
                                         "other_megatron_args": {"seed": 1}, "tensorboard_dir": "tb"}])
def test_megatron_plugin_builds_the_reference_arguments(reference, clean_env, kwargs):
    from accelerate.utils import MegatronLMPlugin as Reference

    ours, theirs = hdc.MegatronLMPlugin(**kwargs), Reference(**kwargs)
    assert list(ours.megatron_lm_default_args.items()) == list(theirs.megatron_lm_default_args.items())
    # hasten's plugin remembers which fields were given (the torch-native engine refuses those it cannot honour)
    assert {k: v for k, v in ours.__dict__.items() if k != "_chosen_fields"} == theirs.__dict__


def test_megatron_plugin_validates_and_parses_model_configs(clean_env):
    with pytest.raises(ValueError, match="lr_decay_style must be one of"):
        hdc.MegatronLMPlugin(lr_decay_style="sawtooth")
    with pytest.raises(ValueError, match="tp_degree must be an integer >= 1"):
        hdc.MegatronLMPlugin(tp_degree=0)
    plugin = hdc.MegatronLMPlugin(seq_length=64)
    model = types.SimpleNamespace(config=types.SimpleNamespace(
        model_type="gpt2", n_layer=2, n_embd=8, n_head=2, n_positions=128, vocab_size=100, return_dict=True))
    plugin.set_network_size_args(model)
    args = plugin.megatron_lm_default_args
    assert (args["num_layers"], args["hidden_size"], args["seq_length"], args["model_type_name"]) == (2, 8, 64, "gpt")
    plugin.set_training_args(micro_batch_size=4, dp_degree=2)
    assert args["global_batch_size"] == 8
    plugin.set_optimizer_type(torch.optim.AdamW(nn.Linear(2, 2).parameters(), lr=0.1))
    assert (args["optimizer"], args["lr"]) == ("adam", 0.1)
    with pytest.raises(ValueError, match="No Megatron-LM config parser"):
        plugin.set_network_size_args(types.SimpleNamespace(config=types.SimpleNamespace(model_type="mamba")))


def test_parallelism_config_validates_and_names_its_dimensions(clean_env):
    config = hasten.ParallelismConfig(dp_replicate_size=2, dp_shard_size=2, tp_size=2)
    assert config.total_size == 8 and config.data_parallel_size == 4 and config.non_data_parallel_size == 2
    assert config._get_mesh() == (("dp_replicate", "dp_shard", "tp"), (2, 2, 2))
    assert config.fsdp_dim_names == ["dp_replicate", "dp_shard_cp"]
    assert isinstance(config.tp_handler, hdc.TorchTensorParallelConfig)
    assert config.to_json()["tp_handler"] == {"enable_async_tp": False, "tp_plan": None}
    assert hasten.ParallelismConfig().build_device_mesh("cpu") is None  # nothing to split
    assert hasten.ParallelismConfig(sp_size=2).build_device_mesh("cpu") is None  # DeepSpeed builds its own groups
    for kwargs, message in [({"tp_size": 0}, "tp_size must be an integer >= 1"),
                            ({"cp_size": 2, "sp_size": 2}, "exclude each other"),
                            ({"dp_replicate_size": 2, "cp_size": 2}, "pure data-parallel replication"),
                            ({"cp_backend": "ring"}, "cp_backend must be one of 'torch'"),
                            ({"cp_size": 2, "cp_handler": hdc.TorchTensorParallelConfig()}, "TorchContextParallel")]:
        with pytest.raises(ValueError, match=message):
            hasten.ParallelismConfig(**kwargs)
    with pytest.raises(ValueError, match="cp_comm_strategy must be one of"):
        hdc.TorchContextParallelConfig(cp_comm_strategy="ring")
    with pytest.raises(ValueError, match="sp_attn_implementation must be one of"):
        hdc.DeepSpeedSequenceParallelConfig(sp_attn_implementation="eager")
    with pytest.raises(ValueError, match="sp_seq_length"):
        hdc.DeepSpeedSequenceParallelConfig(sp_seq_length_is_variable=False)
    assert hdc.DeepSpeedSequenceParallelConfig(sp_attn_implementation="kernels-community/flash-attn2")


def test_bnb_quantization_config_validates_its_choices():
    config = hdc.BnbQuantizationConfig(load_in_4bit=True, bnb_4bit_compute_dtype="bf16", bnb_4bit_quant_type="nf4")
    assert config.target_dtype == hdc.CustomDtype.INT4 and config.torch_dtype == torch.bfloat16
    eight = hdc.BnbQuantizationConfig(load_in_8bit=True)
    assert eight.target_dtype == torch.int8 and eight.torch_dtype == torch.float16
    for kwargs, message in [({}, "exactly one of"), ({"load_in_8bit": True, "load_in_4bit": True}, "exactly one of"),
                            ({"load_in_4bit": True, "bnb_4bit_quant_type": "int3"}, "'fp4' or 'nf4'"),
                            ({"load_in_4bit": True, "bnb_4bit_compute_dtype": "fp64"}, "bnb_4bit_compute_dtype"),
                            ({"load_in_8bit": "yes"}, "load_in_8bit must be True or False"),
                            ({"load_in_8bit": True, "skip_modules": "lm_head"}, "skip_modules must be a list")]:
        with pytest.raises(ValueError, match=message):
            hdc.BnbQuantizationConfig(**kwargs)


def test_fp8_recipes_validate_without_their_backends(clean_env):
    te = hdc.TERecipeKwargs(fp8_format="hybrid", amax_compute_algo="MAX")
    assert (te.fp8_format, te.amax_compute_algo, te.amax_history_len, te.margin) == ("HYBRID", "max", 1024, 0)
    assert te.override_linear_precision == (False, False, False) and te.to_kwargs() == {"amax_compute_algo": "max"}
    assert hdc.MSAMPRecipeKwargs().opt_level == "O2"
    ao_recipe = hdc.AORecipeKwargs()
    assert ao_recipe.config is None and ao_recipe.pad_inner_dim and ao_recipe.enable_fsdp_float8_all_gather
    with pytest.warns(FutureWarning):
        legacy = hdc.FP8RecipeKwargs(backend="te", opt_level="O1")
    assert (legacy.backend, legacy.opt_level, legacy.fp8_format) == ("TE", "O1", "HYBRID")
    for cls, kwargs, message in [(hdc.TERecipeKwargs, {"fp8_format": "E3M4"}, "fp8_format must be one of"),
                                 (hdc.TERecipeKwargs, {"amax_compute_algo": "mean"}, "amax_compute_algo must be one"),
                                 (hdc.TERecipeKwargs, {"override_linear_precision": (True,)}, "three booleans"),
                                 (hdc.MSAMPRecipeKwargs, {"opt_level": "O3"}, "opt_level must be one of"),
                                 (hdc.FP8RecipeKwargs, {"backend": "AO"}, "backend must be one of")]:
        with pytest.raises(ValueError, match=message), warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            cls(**kwargs)


def test_kwargs_handlers_to_dict():
    assert hdc.AutocastKwargs(cache_enabled=True).to_dict() == {"enabled": True, "cache_enabled": True}
    ddp = hdc.DistributedDataParallelKwargs(find_unused_parameters=True, comm_hook="fp16")
    assert "comm_hook" not in ddp.to_dict() and ddp.to_dict()["find_unused_parameters"] is True
    assert hdc.TorchDynamoPlugin(backend="inductor").to_dict()["backend"] == "inductor"


# ----------------------------------------------------------------------------- what works without the backend
def _fake_module(monkeypatch, name: str, **attributes):
    module = types.ModuleType(name)
    for key, value in attributes.items():
        setattr(module, key, value)
    monkeypatch.setitem(sys.modules, name, module)
    return module


def test_layer_detectors_need_no_backend(monkeypatch):
    model = Stack()
    assert not bnb.has_4bit_bnb_layers(model)
    assert not transformer_engine.has_transformer_engine_layers(model)
    assert not ao.has_ao_layers(model)

    class Linear4bit(nn.Linear):
        pass

    class TELinear(nn.Linear):
        pass

    class Float8Linear(nn.Linear):
        pass

    _fake_module(monkeypatch, "bitsandbytes", nn=types.SimpleNamespace(Linear4bit=Linear4bit))
    _fake_module(monkeypatch, "transformer_engine.pytorch", Linear=TELinear, LayerNorm=nn.LayerNorm)
    _fake_module(monkeypatch, "torchao.float8.float8_linear", Float8Linear=Float8Linear)
    assert not bnb.has_4bit_bnb_layers(model)
    assert not transformer_engine.has_transformer_engine_layers(model)
    assert not ao.has_ao_layers(model)
    model.head, model.blocks[0].linear, model.blocks[1].linear = Linear4bit(4, 2), TELinear(4, 4), Float8Linear(4, 4)
    assert bnb.has_4bit_bnb_layers(model)
    assert transformer_engine.has_transformer_engine_layers(model)
    assert ao.has_ao_layers(model)


def test_fp8_layer_filters():
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.Linear(32, 3), nn.Linear(32, 16))
    assert ao.find_first_last_linear_layers(model) == ("0", "4")
    assert ao.find_first_last_linear_layers(nn.ReLU()) == (None, None)
    assert ao.filter_linear_layers(model[2], "2", layers_to_filter=["0", "4"])
    assert not ao.filter_linear_layers(model[3], "3", layers_to_filter=[])  # 3 outputs: not divisible by 16
    assert not ao.filter_linear_layers(model[0], "0", layers_to_filter=["0"])
    assert not ao.filter_first_and_last_linear_layers(model[0], "")  # a lone layer is its own first and last


def test_convert_model_to_fp8_ao_keeps_the_first_and_last_layers():
    pytest.importorskip("torchao.float8")
    model = nn.Sequential(nn.Linear(16, 32), nn.Linear(32, 32), nn.Linear(32, 48), nn.Linear(48, 16))
    ao.convert_model_to_fp8_ao(model)
    assert [type(layer).__name__ for layer in model] == ["Linear", "Float8Linear", "Float8Linear", "Linear"]
    assert ao.has_ao_layers(model)


def test_convert_model_to_fp8_ao_without_torchao_names_the_package(monkeypatch):
    from hasten.core import imports

    for name in [name for name in sys.modules if name == "torchao" or name.startswith("torchao.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "torchao", None)  # as if it were not installed
    imports._found.cache_clear()
    try:
        with pytest.raises(ImportError, match="torchao"):
            ao.convert_model_to_fp8_ao(nn.Linear(16, 16))
    finally:
        imports._found.cache_clear()


def test_fsdp_helpers_that_work_without_fsdp(monkeypatch):
    for name in ("ACCELERATE_USE_FSDP", "FSDP_CPU_RAM_EFFICIENT_LOADING"):
        monkeypatch.setenv(name, "")  # recorded, so the variables the helper sets are removed after the test
        monkeypatch.delenv(name)
    fsdp_utils.enable_fsdp_ram_efficient_loading()
    assert os.environ["ACCELERATE_USE_FSDP"] == "True" and os.environ["FSDP_CPU_RAM_EFFICIENT_LOADING"] == "True"
    fsdp_utils.disable_fsdp_ram_efficient_loading()
    assert os.environ["FSDP_CPU_RAM_EFFICIENT_LOADING"] == "False"
    names = {"_orig_mod.blocks.0._checkpoint_wrapped_module.linear.weight": 1, "head._orig_mod.bias": 2}
    assert fsdp_utils.fsdp2_canonicalize_names(names) == {"blocks.0.linear.weight": 1, "head.bias": 2}
    scaler = fsdp_utils.get_fsdp2_grad_scaler(device="cpu", init_scale=8.0)
    assert isinstance(scaler, torch.amp.GradScaler) and scaler.get_scale() == 8.0
    model = Stack()
    params = fsdp_utils.get_parameters_from_modules(r"blocks\.\d+", model, "cpu")
    assert params == set(model.blocks.parameters())
    assert fsdp_utils.get_parameters_from_modules(None, model, "cpu") == set()


def test_ensure_weights_retied_keeps_tied_weights_tied():
    init = lambda module: module.to_empty(device="cpu", recurse=False)  # noqa: E731
    untied = Stack()
    assert fsdp_utils.ensure_weights_retied(init, untied, torch.device("cpu")) is init

    class Tied(nn.Module):
        _tied_weights_keys = ["head.weight"]

        def __init__(self):
            super().__init__()
            self.embed, self.head = nn.Embedding(5, 4), nn.Linear(4, 5, bias=False)
            self.head.weight = self.embed.weight

    model = Tied()
    retie = fsdp_utils.ensure_weights_retied(init, model, torch.device("cpu"))
    retie(model.embed)
    retie(model.head)
    assert model.head.weight is model.embed.weight


def test_merge_fsdp_weights_writes_one_file_from_a_sharded_checkpoint(tmp_path):
    import torch.distributed.checkpoint as dcp
    from safetensors.torch import load_file

    state = {"model": {"a.weight": torch.randn(3, 2), "b.bias": torch.arange(4.0)}}
    shards = tmp_path / "pytorch_model_fsdp_0"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "torch.distributed is disabled": one process writes every shard
        dcp.save(state, checkpoint_id=str(shards))
    fsdp_utils.merge_fsdp_weights(str(shards), str(tmp_path / "merged"), remove_checkpoint_dir=True)
    merged = load_file(tmp_path / "merged" / "model.safetensors")
    assert merged.keys() == state["model"].keys()
    assert all(torch.equal(merged[k], v) for k, v in state["model"].items())
    assert not shards.exists()
    with pytest.raises(ValueError, match="no .metadata file"):
        fsdp_utils.merge_fsdp_weights(str(tmp_path), str(tmp_path / "out"))


def test_bnb_keys_to_not_convert_and_parameter_device():
    class CausalLM(nn.Module):
        base_model_prefix = "model"

        def __init__(self):
            super().__init__()
            self.model = nn.Sequential(nn.Embedding(10, 4), nn.Linear(4, 4))
            self.lm_head = nn.Linear(4, 10)

    assert bnb.get_keys_to_not_convert(CausalLM()) == ["lm_head"]
    base = CausalLM().model
    base.base_model_prefix = "model"
    assert bnb.get_keys_to_not_convert(base) == []
    assert bnb.get_parameter_device(Stack()) == torch.device("cpu")


def test_placeholders_and_mask_helpers_work():
    optimizer = deepspeed.DummyOptim([torch.zeros(1)], lr=0.1, betas=(0.9, 0.99))
    assert (optimizer.lr, optimizer.weight_decay, optimizer.kwargs) == (0.1, 0, {"betas": (0.9, 0.99)})
    scheduler = deepspeed.DummyScheduler(optimizer, total_num_steps=10, warmup_num_steps=2)
    assert (scheduler.total_num_steps, scheduler.warmup_num_steps, scheduler.lr_scheduler_callable) == (10, 2, None)
    sgd = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=0.1)  # a real schedule: it needs a torch optimizer
    assert megatron_lm.MegatronLMDummyScheduler(sgd, 5).total_num_steps == 5
    assert megatron_lm.MegatronLMDummyDataLoader(data_path=["x"]).dataset_args == {
        "data_path": ["x"], "megatron_dataset_flag": True}
    assert megatron_lm.AbstractTrainStep("mine").name == "mine"
    padding = torch.tensor([[1, 1, 0]])
    assert megatron_lm.T5TrainStep.attn_mask_postprocess(padding)[0].tolist() == [
        [False, False, True], [False, False, True], [True, True, True]]
    assert megatron_lm.T5TrainStep.get_decoder_mask(2, "cpu").tolist() == [[[False, True], [False, False]]]
    assert megatron_lm.T5TrainStep.get_enc_dec_mask(padding, 2, "cpu").shape == (1, 2, 3)
    state = types.SimpleNamespace(distributed_type=hdc.DistributedType.NO)
    with pytest.raises(ValueError, match="does not use DeepSpeed"):
        deepspeed.get_active_deepspeed_plugin(state)


def test_inference_planning_helpers():
    find_pippy_batch_size, generate_device_map = inference.find_pippy_batch_size, inference.generate_device_map
    assert find_pippy_batch_size((torch.zeros(3, 2),), None) == 3
    assert find_pippy_batch_size((), {"x": {"ids": torch.zeros(5, 1)}}) == 5
    assert find_pippy_batch_size(None, None) is None
    model = nn.Sequential(*[nn.Linear(64, 64) for _ in range(4)])
    assert {0, 1} <= set(generate_device_map(model, num_processes=2).values())
    assert set(generate_device_map(model, num_processes=2, max_memory={0: 10**6, 1: 10**6}).values()) == {0}


def test_generate_device_map_splits_like_the_reference(reference):
    from accelerate.inference import generate_device_map

    model = nn.Sequential(*[nn.Linear(64, 64) for _ in range(8)])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = dict(generate_device_map(model, num_processes=2))
    assert dict(inference.generate_device_map(model, num_processes=2)) == expected


# ----------------------------------------------------------------------------- what raises NotYetSupportedError
def _planned_calls():
    model = Stack()
    return {
        "megatron initialize": lambda: megatron_lm.initialize(None),
        "MegatronEngine": lambda: megatron_lm.MegatronEngine(None, model, None, None),
        "GPTTrainStep": lambda: megatron_lm.GPTTrainStep(None, None),
        "avg_losses_across_data_parallel_group": lambda: megatron_lm.avg_losses_across_data_parallel_group([]),
        "te convert_model": lambda: transformer_engine.convert_model(model),
        "apply_fp8_autowrap": lambda: transformer_engine.apply_fp8_autowrap(model, None),
        "contextual_fp8_autocast": lambda: transformer_engine.contextual_fp8_autocast(model.forward, None),
    }


@pytest.mark.parametrize("name", list(_planned_calls()))
def test_using_a_planned_backend_raises_not_yet_supported(name):
    with pytest.raises(NotYetSupportedError, match="not yet supported by hasten; it is planned") as error:
        _planned_calls()[name]()
    assert isinstance(error.value, NotImplementedError)
    assert "Meanwhile" in str(error.value)


# ----------------------------------------------------------------------------- tracking
def test_a_general_tracker_subclass_works_and_registers():
    from hasten.tracking import LOGGER_TYPE_TO_CLASS, GeneralTracker, filter_trackers, register_tracker_class

    class MemoryTracker(GeneralTracker):
        name = "memory"
        requires_logging_directory = False
        main_process_only = False

        def __init__(self, run_name="run"):
            super().__init__()
            self.logged = []

        @property
        def tracker(self):
            return self.logged

        @hasten.tracking.on_main_process
        def log(self, values, step=None, **kwargs):
            self.logged.append((step, values))

    tracker = MemoryTracker()
    tracker.log({"loss": 1.0}, step=3)
    assert tracker.tracker == [(3, {"loss": 1.0})]
    with pytest.warns(UserWarning, match="leaves out"):  # without a logging directory
        chosen = filter_trackers([tracker, "all"])
    assert chosen[0] is tracker and "jsonl" not in chosen and "wandb" in chosen
    try:
        register_tracker_class(MemoryTracker)
        assert filter_trackers(["memory", "memory"]) == ["memory"]
    finally:
        LOGGER_TYPE_TO_CLASS.pop("memory", None)

    class Incomplete(GeneralTracker):
        name = "incomplete"

    with pytest.raises(NotImplementedError, match="requires_logging_directory"):
        Incomplete()
    with pytest.raises(ValueError, match="subclass of GeneralTracker"):
        register_tracker_class(dict)
    with pytest.raises(ValueError, match="Unsupported logging capability"):
        filter_trackers("no_such_tracker")
    assert filter_trackers(None) == [] and "jsonl" in hasten.tracking.get_available_trackers()


def test_on_main_process_skips_other_processes_only_when_asked(monkeypatch):
    from hasten.state import PartialState
    from hasten.tracking import on_main_process

    class Probe:
        main_process_only = True

        @on_main_process
        def run(self):
            return "ran"

    assert Probe().run() == "ran"  # a single process is the main process
    monkeypatch.setattr(PartialState, "is_main_process", property(lambda self: False))
    assert Probe().run() is None
    Probe.main_process_only = False
    assert Probe().run() == "ran"


def test_parallelism_config_builds_a_real_device_mesh_across_two_processes():
    from helpers import run_launch

    result = run_launch("check_parallelism_mesh.py", num_processes=2)
    assert "ok: dp_shard mesh" in result.stdout and "ok: tp mesh" in result.stdout
    assert "MESH CHECKS PASSED" in result.stdout
