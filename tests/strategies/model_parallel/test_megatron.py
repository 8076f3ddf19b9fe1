"""``MegatronLMPlugin`` on the torch-native engine (strategies/megatron.py, strategies/megatron_mapping.py): the
4-process layouts of tests/strategies/model_parallel/check_megatron.py against one process, their checkpoint loaded on one
process, the plugin on a single process, the launcher's flags and config section, and every refused field."""
import copy
import sys
from pathlib import Path

import pytest
import torch
from helpers import assert_checkpoint_loads_on_one_process, run_launch
from launch_fixtures import no_launch, plan_for, script  # noqa: F401  (fixtures)

from hasten import Accelerator, DistributedType, ParallelismConfig
from hasten.parallel import ParallelDims
from hasten.strategies.model_parallel.megatron_mapping import (
    check_torch_native,
    megatron_layout,
)
from hasten.utils import MegatronLMPlugin

HERE = Path(__file__).resolve().parent  # the scripts these tests launch live beside them
sys.path.insert(0, str(HERE))
from check_model_parallel import TinyGPT, lm_loss  # noqa: E402


@pytest.fixture
def clean_megatron_env(monkeypatch):
    import os

    for name in list(os.environ):
        if "MEGATRON_LM" in name:
            monkeypatch.delenv(name)


def test_tensor_pipeline_and_data_parallel_layouts_match_one_process_and_the_checkpoint_loads_on_one(tmp_path):
    result = run_launch("check_megatron.py", tmp_path, num_processes=4, timeout=400)
    assert "MEGATRON CHECKS PASSED" in result.stdout, result.stdout
    for name in ("tp_degree=2 x distributed optimizer", "tp_degree=2 x dp_replicate=2", "pp_degree=2 x tp_degree=2"):
        assert f"ok: {name}" in result.stdout
    assert_checkpoint_loads_on_one_process(TinyGPT(), tmp_path / "megatron_checkpoint",
                                           tmp_path / "megatron_weights.pt")


def test_on_one_process_the_plugin_recomputes_and_clips_like_pytorch(clean_megatron_env):
    torch.manual_seed(0)
    model = TinyGPT()
    reference = copy.deepcopy(model)
    accelerator = Accelerator(cpu=True, megatron_lm_plugin=MegatronLMPlugin(recompute_activations=True,
                                                                           gradient_clipping=0.5))
    assert accelerator.distributed_type == DistributedType.MEGATRON_LM
    prepared, optimizer = accelerator.prepare(model, torch.optim.AdamW(model.parameters(), lr=1e-2))
    assert all("CheckpointWrapper" in type(layer).__name__ for layer in prepared.layers)
    reference_optimizer = torch.optim.AdamW(reference.parameters(), lr=1e-2)
    generator = torch.Generator().manual_seed(3)
    norms = []
    for _ in range(5):
        tokens = torch.randint(0, 32, (4, 9), generator=generator)
        accelerator.backward(lm_loss(prepared(tokens[:, :-1]), tokens))
        optimizer.step()
        optimizer.zero_grad()
        lm_loss(reference(tokens[:, :-1]), tokens).backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(reference.parameters(), 0.5)))
        reference_optimizer.step()
        reference_optimizer.zero_grad()
    assert max(norms) > 0.5  # the clipping did something
    plugin = accelerator.state.megatron_lm_plugin
    accelerator.prepare(torch.utils.data.DataLoader(list(range(12)), batch_size=3))
    assert (plugin.micro_batch_size, plugin.data_parallel_size, plugin.global_batch_size) == (3, 1, 3)
    ours = accelerator.unwrap_model(prepared).state_dict()
    for key, value in reference.state_dict().items():
        assert torch.allclose(ours[key], value, atol=1e-6), key


def test_fields_only_megatron_lm_honours_are_refused_together_by_name(clean_megatron_env):
    plugin = MegatronLMPlugin(other_megatron_args={"seed": 1}, expert_model_parallel_size=2, context_parallel_size=2,
                              num_micro_batches=4, no_save_optim=True, hidden_dropout=0.1,
                              custom_train_step_class=object)
    with pytest.raises(ValueError) as caught:
        check_torch_native(plugin)
    message = str(caught.value)
    for field in ("other_megatron_args", "expert_model_parallel_size", "context_parallel_size", "num_micro_batches",
                  "no_save_optim", "hidden_dropout", "custom_train_step_class"):
        assert f"{field}=" in message, (field, message)
    check_torch_native(MegatronLMPlugin())  # the defaults (context_parallel_size 2 included) ask for nothing
    with pytest.raises(ValueError, match="recompute_granularity='selective'"):
        check_torch_native(MegatronLMPlugin(recompute_activations=True, recompute_granularity="selective"))
    with pytest.raises(ValueError, match="recompute_num_layers=2"):
        check_torch_native(MegatronLMPlugin(recompute_activations=True, recompute_num_layers=2))
    with pytest.raises(ValueError, match="sequence_parallelism=True.*tp_degree > 1"):
        check_torch_native(MegatronLMPlugin(sequence_parallelism=True))
    with pytest.raises(ValueError, match="other_megatron_args"):  # through the Accelerator, before any work
        Accelerator(cpu=True, megatron_lm_plugin=MegatronLMPlugin(other_megatron_args={"seed": 1}))


def test_layouts_that_do_not_fit_are_refused_with_the_sizes(clean_megatron_env):
    with pytest.raises(ValueError, match="multiple of 2 processes and the job has 1"):
        Accelerator(cpu=True, megatron_lm_plugin=MegatronLMPlugin(tp_degree=2))
    with pytest.raises(ValueError, match="multiple of 4 processes and the job has 6"):
        megatron_layout(MegatronLMPlugin(tp_degree=2, pp_degree=2), 6)
    layout = megatron_layout(MegatronLMPlugin(tp_degree=2, use_distributed_optimizer=True), 8)
    assert (layout.tp, layout.dp_shard, layout.dp_replicate) == (2, 4, 1)
    layout = megatron_layout(MegatronLMPlugin(pp_degree=2), 8)
    assert (layout.pp, layout.dp_shard, layout.dp_replicate) == (2, 1, 4)
    def asked(**sizes):
        return ParallelDims.from_config(ParallelismConfig(**sizes), 4)

    with pytest.raises(ValueError, match="disagree"):
        megatron_layout(MegatronLMPlugin(tp_degree=2), 4, asked(tp_size=4))
    with pytest.raises(ValueError, match=r"dp_shard_size=1.*dp_shard_size=2.*disagree"):  # sharding not asked
        megatron_layout(MegatronLMPlugin(tp_degree=2), 4, asked(tp_size=2, dp_shard_size=2))
    with pytest.raises(ValueError, match=r"cp_size=2.*disagree"):
        megatron_layout(MegatronLMPlugin(tp_degree=2), 4, asked(cp_size=2, dp_shard_size=2))
    agreed = megatron_layout(MegatronLMPlugin(tp_degree=2, use_distributed_optimizer=True), 4,
                             asked(tp_size=2, dp_shard_size=2))
    assert (agreed.tp, agreed.dp_shard) == (2, 2)


def test_launch_flags_and_the_config_section_reach_the_plugin(script, no_launch, tmp_path):  # noqa: F811
    env = plan_for(["--use_megatron_lm", "--megatron_lm_tp_degree", "2", "--megatron_lm_use_distributed_optimizer",
                    "true", "-n", "2", script]).env
    assert env["HASTEN_USE_MEGATRON_LM"] == "true" and env["HASTEN_MEGATRON_LM_TP_DEGREE"] == "2"
    assert env["HASTEN_MEGATRON_LM_USE_DISTRIBUTED_OPTIMIZER"] == "true"
    section = {"megatron_lm_pp_degree": 2, "megatron_lm_num_micro_batches": 4}
    config = {"distributed_type": "MEGATRON_LM", "num_processes": 2, "use_cpu": True, "megatron_lm_config": section}
    env = plan_for([script], config=config, config_path=tmp_path / "megatron.yaml").env
    assert env["HASTEN_USE_MEGATRON_LM"] == "true" and env["HASTEN_MEGATRON_LM_PP_DEGREE"] == "2"
    assert env["HASTEN_MEGATRON_LM_NUM_MICRO_BATCHES"] == "4"
    config["megatron_lm_config"] = {"megatron_lm_tp": 2}
    with pytest.raises(Exception, match="unknown key 'megatron_lm_tp'"):
        plan_for([script], config=config, config_path=tmp_path / "megatron.yaml")
