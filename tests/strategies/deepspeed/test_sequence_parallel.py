"""DeepSpeed sequence parallelism (ALST / Ulysses; strategies/deepspeed/sequence_parallel.py): training on 2 processes
against one process (check_sequence_parallel.py, launched from a config file), and what is refused before
DeepSpeed makes any group.

The conformance suite (tests/strategies/check_strategy_conformance.py) trains its language-model workload under
ZeRO-3 and ZeRO-2 with sp_size=2 (lines ds_sp2, ds_sp2_zero2) with AdamW and crosses checkpoints with one process;
the launched check here compares with one process's SGD training, within the suite's TOLERANCE, at ZeRO stages 1, 2
and 3, with gradient accumulation, from a config file, and resumes exactly.
"""
import importlib.util

import pytest
import torch
from torch import nn

from hasten import Accelerator, ParallelismConfig
from hasten.parallel import ParallelDims
from hasten.strategies.deepspeed.sequence_parallel import SequenceParallel
from hasten.strategies.select import select_strategy
from hasten.utils import DeepSpeedSequenceParallelConfig, FullyShardedDataParallelPlugin

from helpers import run_launch

pytestmark = [pytest.mark.deepspeed, pytest.mark.skipif(
    importlib.util.find_spec("deepspeed") is None or importlib.util.find_spec("transformers") is None,
    reason="needs the deepspeed extra and transformers (make test installs them)")]

CONFIG_FILE = """compute_environment: LOCAL_MACHINE
distributed_type: DEEPSPEED
num_processes: 2
use_cpu: true
deepspeed_config:
  zero_stage: 2
parallelism_config:
  parallelism_config_dp_replicate_size: 1
  parallelism_config_dp_shard_size: 1
  parallelism_config_sp_size: 2
  parallelism_config_sp_backend: deepspeed
  parallelism_config_sp_seq_length_is_variable: true
  parallelism_config_sp_attn_implementation: sdpa
"""


# what the script imports as it starts: the launched workers start with them imported
IMPORTS = ("deepspeed", "transformers.modeling_utils", "transformers.models.llama.modeling_llama")


def test_two_processes_train_like_one_at_zero_1_2_3_and_with_accumulation_from_a_config_file(tmp_path):
    config = tmp_path / "sp2.yaml"
    config.write_text(CONFIG_FILE)
    result = run_launch("check_sequence_parallel.py", tmp_path, num_processes=None,
                        launch_args=["--config_file", str(config)], timeout=400, preload=IMPORTS)
    assert "SEQUENCE PARALLEL CHECKS PASSED" in result.stdout, result.stdout + result.stderr
    assert result.stdout.count("MAX DIFF") == 4, result.stdout


def llama(heads=4, kv_heads=2, hidden=32, attention="sdpa"):
    from transformers import LlamaConfig, LlamaForCausalLM

    return LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=hidden, intermediate_size=32, num_hidden_layers=1,
                                        num_attention_heads=heads, num_key_value_heads=kv_heads,
                                        attn_implementation=attention))


def ulysses(size=2, attention=None) -> SequenceParallel:
    return SequenceParallel(size=size, seq_length=None, seq_length_is_variable=True, attn_implementation=attention)


def test_a_model_without_a_transformers_config_is_refused_with_the_references_phrase():
    with pytest.raises(ValueError, match="expects the model object to have a config attribute") as error:
        ulysses().check_model(nn.Linear(4, 4))
    assert "Linear" in str(error.value)


@pytest.mark.parametrize("heads, kv_heads, hidden, size, says", [
    (3, 3, 48, 2, "sp_size=2 does not divide the model's 3 attention heads"),
    (6, 3, 48, 2, "sp_size=2 and the model's 3 key/value heads"),
    (4, 4, 32, 8, "sp_size=8 does not divide the model's 4 attention heads"),
])
def test_an_sp_size_that_does_not_divide_the_heads_says_which_heads(heads, kv_heads, hidden, size, says):
    with pytest.raises(ValueError, match=says):
        ulysses(size).check_model(llama(heads, kv_heads, hidden))


def test_heads_that_split_pass_and_key_value_heads_may_be_fewer_than_the_group():
    assert ulysses(2).check_model(llama(4, 2)) == "sdpa"
    assert ulysses(4).check_model(llama(4, 2)) == "sdpa"  # 2 kv heads replicated over 4 ranks, as DeepSpeed does


def test_attention_that_ulysses_cannot_split_or_that_differs_from_the_models_is_refused():
    with pytest.raises(ValueError, match="'eager' attention, which Ulysses cannot split"):
        ulysses().check_model(llama(attention="eager"))
    with pytest.raises(ValueError, match="does not match model config attn_implementation='sdpa'"):
        ulysses(attention="flash_attention_2").check_model(llama())


def test_layers_with_a_recurrent_state_are_refused():
    model = llama()
    model.config.layer_types = ["linear_attention"]
    with pytest.raises(ValueError, match="Sequence parallelism does not support attention layers of type"):
        ulysses().check_model(model)


def test_the_loss_is_divided_where_the_engine_sums_gradients_over_the_group():
    sp = ulysses(2)
    assert [sp.loss_scale({"zero_optimization": {"stage": s}}) for s in (0, 1, 2, 3)] == [0.5, 0.5, 0.5, 1.0]
    with pytest.raises(ValueError, match="keep reduce_scatter true"):
        sp.check_engine_config({"zero_optimization": {"stage": 3, "reduce_scatter": False}})
    sp.check_engine_config({"zero_optimization": {"stage": 2, "reduce_scatter": False}})


def sp_layout(world=2, **sizes) -> ParallelDims:
    return ParallelDims.from_config(ParallelismConfig(sp_backend="deepspeed", sp_size=2, **sizes), world)


def test_sequence_parallelism_without_deepspeed_is_refused_naming_how_to_select_it(monkeypatch):
    for name in ("HASTEN_USE_DEEPSPEED", "HASTEN_USE_FSDP", "ACCELERATE_USE_DEEPSPEED"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ValueError, match=r"sp_size=2\) is DeepSpeed sequence parallelism .* needs DeepSpeed: pass "
                                         r"deepspeed_plugin"):
        select_strategy(None, None, sp_layout())
    with pytest.raises(ValueError, match="fsdp_plugin=... selects FSDP instead"):
        select_strategy(None, None, sp_layout(), fsdp_plugin=FullyShardedDataParallelPlugin())


def test_sequence_parallelism_with_tensor_parallelism_is_refused():
    with pytest.raises(ValueError, match="cannot be combined with tp_size=2"):
        SequenceParallel.from_layout(sp_layout(world=4, tp_size=2))


def test_sizes_and_sequence_lengths_that_do_not_split_are_refused_before_any_process_group():
    with pytest.raises(ValueError, match="sp_size=2 = 2 processes does not divide the number of processes"):
        sp_layout(world=3)
    with pytest.raises(ValueError, match="sp_seq_length=15 is not divisible by sp_size=2"):
        ParallelismConfig(sp_size=2, sp_handler=DeepSpeedSequenceParallelConfig(sp_seq_length=15,
                                                                                 sp_seq_length_is_variable=False))
    ParallelismConfig(sp_size=2, sp_handler=DeepSpeedSequenceParallelConfig(sp_seq_length=15))  # variable: any


def test_the_handlers_settings_reach_the_strategy_and_the_layout_is_deepspeeds_data_parallelism():
    dims = ParallelDims.from_config(ParallelismConfig(sp_size=2, sp_handler=DeepSpeedSequenceParallelConfig(
        sp_seq_length=64, sp_seq_length_is_variable=False, sp_attn_implementation="sdpa")), 4)
    sp = SequenceParallel.from_layout(dims)
    assert (sp.size, sp.seq_length, sp.seq_length_is_variable, sp.attn_implementation) == (2, 64, False, "sdpa")
    assert dims.dp_size == 2 and dims.build_mesh("cpu") is None  # DeepSpeed makes its own groups


def test_without_sequence_parallelism_the_adapter_returns_the_loader_itself():
    accelerator = Accelerator(cpu=True)
    loader = torch.utils.data.DataLoader(list(range(4)))
    assert accelerator.deepspeed_ulysses_dl_adapter(loader, nn.Linear(2, 2)) is loader
