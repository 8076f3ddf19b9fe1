"""FSDP2 (strategies/fsdp.py): the multi-process checks run by tests/strategies/fsdp/check_fsdp.py, and the choices
that fail before any process group work. Training numbers and cross-strategy checkpoints are checked by the
conformance suite (tests/strategies/test_strategy_conformance.py: fsdp2, fsdp2_config, hsdp)."""
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import clean_env, run_launch
from safetensors.torch import load_file

from hasten import Accelerator, FullyShardedDataParallelPlugin

HERE = Path(__file__).resolve().parent  # the scripts these tests launch live beside them


def test_fsdp2_wrapping_checkpointing_fp16_state_dicts_and_sharded_checkpoints_on_two_processes(tmp_path):
    result = run_launch("check_fsdp.py", tmp_path, num_processes=2)
    assert "FSDP CHECKS PASSED" in result.stdout, result.stdout
    # merge-weights: one process, no process group, the sharded checkpoint's model as one safetensors file
    merged = subprocess.run([sys.executable, "-m", "hasten", "merge-weights", str(tmp_path / "sharded"),
                             str(tmp_path / "merged")], capture_output=True, text=True, env=clean_env(), timeout=120)
    assert merged.returncode == 0, merged.stderr
    expected = load_file(str(tmp_path / "full_weights" / "model.safetensors"))
    written = load_file(str(tmp_path / "merged" / "model.safetensors"))
    assert written.keys() == expected.keys() and all(torch.equal(written[k], expected[k]) for k in expected)


def test_fsdp_version_must_be_1_or_2():
    with pytest.raises(ValueError, match="fsdp_version"):
        FullyShardedDataParallelPlugin(fsdp_version=3)


def test_fsdp1_cpu_offload_on_the_cpu_is_refused_with_the_reason():
    with pytest.raises(ValueError, match=r"cpu_offload.*pins the shards for a GPU"):
        Accelerator(cpu=True, fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=1, cpu_offload=True))


@pytest.mark.parametrize("how, env", [("plugin1", {}), ("env2", {"HASTEN_USE_FSDP": "true", "FSDP_VERSION": "2"})])
def test_fsdp_trains_saves_and_loads_on_one_process_like_plain_pytorch(tmp_path, how, env):
    """People debug FSDP on one device: torch shards over a world of one (a process group of this process alone)."""
    result = subprocess.run([sys.executable, str(HERE / "check_fsdp_one_process.py"), how, str(tmp_path)],
                            capture_output=True, text=True, env=clean_env(**env), timeout=300)
    assert f"FSDP ONE PROCESS PASSED {how}" in result.stdout, result.stdout[-2000:] + result.stderr[-4000:]


def _config(tmp_path, fsdp_config: str):
    config = tmp_path / "fsdp.yaml"
    config.write_text("compute_environment: LOCAL_MACHINE\ndistributed_type: FSDP\nnum_processes: 2\nuse_cpu: true\n"
                      "fsdp_config:\n" + fsdp_config)
    script = tmp_path / "train.py"
    script.write_text("import os\nfrom hasten import Accelerator\naccelerator = Accelerator()\n"
                      "plugin = accelerator.strategy.plugin\n"
                      "line = ' '.join(map(str, ['CHOSEN', type(accelerator.strategy).__name__, "
                      "accelerator.distributed_type, plugin.fsdp_version, plugin.min_num_params, "
                      "plugin.activation_checkpointing])) + '\\n'\n"
                      "os.write(1, line.encode())  # one write: the two processes' lines never interleave\n")
    return config, script


def test_a_config_files_fsdp_config_reaches_the_plugin_and_flags_win(tmp_path):
    config, script = _config(tmp_path, "  fsdp_version: 2\n  fsdp_auto_wrap_policy: SIZE_BASED_WRAP\n"
                                       "  fsdp_min_num_params: 10\n")
    result = run_launch(script, num_processes=None, launch_args=["--config_file", str(config),
                                                                 "--fsdp_activation_checkpointing", "true"])
    assert result.stdout.count("CHOSEN FSDP2Strategy DistributedType.FSDP 2 10 True") == 2, result.stdout


def test_an_unknown_fsdp_config_key_stops_the_launch(tmp_path):
    config, script = _config(tmp_path, "  fsdp_version: 2\n  fsdp_wrap_everything: true\n")
    result = run_launch(script, num_processes=None, launch_args=["--config_file", str(config)], check=False)
    assert result.returncode != 0 and "fsdp_wrap_everything" in result.stderr and "CHOSEN" not in result.stdout


def test_fsdp1_options_with_fsdp2_are_refused_naming_both():
    with pytest.raises(ValueError, match=r"sharding_strategy.*fsdp_version=2.*reshard_after_forward"):
        FullyShardedDataParallelPlugin(fsdp_version=2, sharding_strategy="FULL_SHARD")
    with pytest.raises(ValueError, match="forward_prefetch"):
        FullyShardedDataParallelPlugin(fsdp_version=2, forward_prefetch=True)
    with pytest.raises(ValueError, match="LOCAL_STATE_DICT"):
        FullyShardedDataParallelPlugin(fsdp_version=2, state_dict_type="LOCAL_STATE_DICT")


def test_a_transformers_model_wraps_by_its_no_split_modules_and_resumes_bitwise(tmp_path):
    pytest.importorskip("transformers", reason="transformers is in the test extra: pip install 'hasten[test]'")
    result = run_launch("check_fsdp_resume.py", tmp_path, num_processes=2)
    assert "FSDP RESUME CHECKS PASSED" in result.stdout, result.stdout


def test_a_job_killed_during_an_async_sharded_save_keeps_the_previous_checkpoint(tmp_path):
    import os
    import signal
    import time

    from helpers import ROOT, one_multiprocess_job_at_a_time

    command = [sys.executable, "-m", "hasten", "launch", "-n", "2", str(HERE / "fsdp_async_kill.py"), "save",
               str(tmp_path)]
    with one_multiprocess_job_at_a_time():
        job = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=clean_env(),
                               cwd=ROOT, start_new_session=True)
        deadline = time.monotonic() + 120
        while not (tmp_path / "writing").exists() and time.monotonic() < deadline and job.poll() is None:
            time.sleep(0.1)
        assert (tmp_path / "writing").exists(), job.communicate(timeout=30)
        os.killpg(job.pid, signal.SIGKILL)  # the whole job, in the middle of the background write
        job.communicate(timeout=30)
    assert (tmp_path / "checkpoints" / "checkpoint_0").is_dir()
    result = run_launch("fsdp_async_kill.py", "load", tmp_path, num_processes=2)
    assert "KILL CHECK PASSED" in result.stdout, result.stdout


def test_fsdp2_switch_optimizer_parameters_maps_by_data_pointer():
    from hasten.utils.fsdp_utils import fsdp2_switch_optimizer_parameters

    old, new = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    optimizer = torch.optim.SGD(old.parameters(), lr=0.1)
    mapping = {o.data_ptr(): n for o, n in zip(old.parameters(), new.parameters())}
    fsdp2_switch_optimizer_parameters(optimizer, mapping)
    assert optimizer.param_groups[0]["params"] == list(new.parameters())
    with pytest.raises(KeyError, match="data_ptr"):
        fsdp2_switch_optimizer_parameters(optimizer, {})


def test_the_file_functions_need_an_fsdp_run():
    from hasten.utils.fsdp_utils import save_fsdp_model

    accelerator = Accelerator(cpu=True)
    with pytest.raises(ValueError, match="prepared with FSDP"):
        save_fsdp_model(FullyShardedDataParallelPlugin(fsdp_version=2), accelerator, torch.nn.Linear(1, 1), "x")


def test_a_reference_fsdp_full_checkpoint_loads_on_one_process(tmp_path):
    """Accelerate's FSDP FULL_STATE_DICT files: pytorch_model_fsdp.bin and an optimizer.bin keyed by name."""
    from hasten.checkpointing.optimizer_names import by_name, parameter_names

    torch.manual_seed(0)
    source = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    source_optimizer = torch.optim.AdamW(source.parameters(), lr=0.1)
    source(torch.ones(2, 3)).sum().backward()
    source_optimizer.step()
    torch.save(source.state_dict(), tmp_path / "pytorch_model_fsdp.bin")
    torch.save(by_name(source_optimizer.state_dict(), parameter_names(source, source_optimizer)),
               tmp_path / "optimizer.bin")
    accelerator = Accelerator(cpu=True)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    model, optimizer = accelerator.prepare(model, torch.optim.AdamW(model.parameters(), lr=0.1))
    accelerator.load_state(tmp_path)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), source.state_dict().values()))
    loaded, expected = optimizer.state_dict()["state"], source_optimizer.state_dict()["state"]
    assert all(torch.equal(loaded[i]["exp_avg"], expected[i]["exp_avg"]) for i in expected)


def test_parameters_lost_in_sharding_are_named_with_the_references_phrases_and_nothing_is_re_pointed():
    from hasten.strategies.fsdp.fsdp2 import _repoint

    embed, head, other = (torch.nn.Parameter(torch.ones(2)) for _ in range(3))
    optimizer = torch.optim.SGD([{"params": [embed, other]}, {"params": [head]}], lr=0.1)
    originals = {id(embed): "model.embed_tokens.weight", id(head): "lm_head.weight", id(other): "other.weight"}
    sharded = {"model.embed_tokens.weight": torch.nn.Parameter(torch.ones(1)),
               "other.weight": torch.nn.Parameter(torch.ones(1))}
    with pytest.raises(KeyError, match="Parameters missing after FSDP2 wrapping: lm_head.weight") as plain:
        _repoint(optimizer, originals, sharded)
    assert "tie_word_embeddings" not in str(plain.value)
    with pytest.raises(ValueError) as tied:
        _repoint(optimizer, originals, sharded, tied_embeddings=True)
    assert "FSDP2 mapping failed" in str(tied.value) and "tie_word_embeddings = False" in str(tied.value)
    assert optimizer.param_groups[0]["params"] == [embed, other]  # no group changed
    sharded["lm_head.weight"] = torch.nn.Parameter(torch.ones(1))
    _repoint(optimizer, originals, sharded)
    assert optimizer.param_groups[1]["params"][0] is sharded["lm_head.weight"]


@pytest.mark.parametrize("version", [1, 2])
def test_a_layer_class_the_model_lacks_is_refused_in_the_references_words_listing_the_models_classes(version):
    plugin = FullyShardedDataParallelPlugin(fsdp_version=version, auto_wrap_policy="transformer_based_wrap",
                                            transformer_cls_names_to_wrap=["T5Layer"])
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU())
    with pytest.raises(ValueError) as refused:
        plugin.set_auto_wrap_policy(model)
    assert "Could not find the transformer layer class T5Layer in the model." in str(refused.value)
    assert "Linear, ReLU, Sequential" in str(refused.value)
