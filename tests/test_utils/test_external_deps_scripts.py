"""hasten's ``test_utils/scripts/external_deps`` scripts, which Accelerate's backend suites launch by path, run
here offline on the stand-ins of offline_hub.py (a tiny BERT and an MRPC-shaped data set, a tiny Llama, a tiny
GPT-2) with the launch flags those suites use, and fail loudly when their check fails.

Each launch is a ``hasten launch -n 2`` job (gloo), its workers started warm (helpers.run_launch); the failure cases
run on one process.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import ROOT, clean_env, run_launch
from offline_hub import mrpc_like, tiny_bert, tiny_gpt2, tiny_llama, tiny_llama_classifier

pytest.importorskip("transformers")
pytest.importorskip("datasets")

SCRIPTS = ROOT / "src" / "hasten" / "test_utils" / "scripts" / "external_deps"
# the tiny BERT learns the stand-in data in 2-3 epochs at this rate and batch size (Accelerate's 2e-5 and 16 are for
# BERT-base on MRPC)
LEARNS = ["--lr", "3e-3", "--batch_size", "8"]


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    root = tmp_path_factory.mktemp("offline_hub")
    return {"bert": tiny_bert(root / "bert"), "mrpc": mrpc_like(root / "mrpc"), "llama": tiny_llama(root / "llama"),
            "gpt2": tiny_gpt2(root / "gpt2"), "llama_classifier": tiny_llama_classifier(root / "llama_classifier")}


# what the scripts import as they start (a transformers model and data set; DeepSpeed under --use_deepspeed): the
# launched workers start with them imported
IMPORTS = ("transformers", "transformers.modeling_utils", "transformers.models.auto.modeling_auto",
           "transformers.models.auto.tokenization_auto", "datasets")


def launch(script: Path, *args, launch_args=(), **options) -> subprocess.CompletedProcess:
    """``hasten launch -n 2 [launch_args] script args`` (see helpers.run_launch)."""
    deepspeed = "--use_deepspeed" in launch_args or script.name.startswith(("test_ds_", "test_zero3"))
    preload = IMPORTS + (("deepspeed",) if deepspeed else ())
    return run_launch(script, *args, launch_args=launch_args, preload=preload, **options)


def mrpc_args(hub, output: Path) -> list:
    return ["--model_name_or_path", hub["bert"], "--dataset_dir", hub["mrpc"], "--output_dir", output, *LEARNS]


def deepspeed_flags(stage: int, precision: str = "no") -> list:
    """The flags Accelerate's DeepSpeed suite launches these scripts with."""
    return [f"--mixed_precision={precision}", "--use_deepspeed", "--gradient_accumulation_steps=1",
            "--gradient_clipping=1", "--zero3_init_flag=True", "--zero3_save_16bit_model=True",
            f"--zero_stage={stage}", "--offload_optimizer_device=none", "--offload_param_device=none"]


def one_process(script: str, *args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPTS / script), *map(str, args)], capture_output=True, text=True,
                          timeout=240, env=clean_env(), cwd=ROOT)


def test_performance_under_fsdp2_learns_checks_the_schedule_and_saves_the_model(hub, tmp_path):
    launch(SCRIPTS / "test_performance.py", *mrpc_args(hub, tmp_path), "--num_epochs=3",
               "--performance_lower_bound=0.9",
               launch_args=["--use_fsdp", "--fsdp_version=2", "--fsdp_reshard_after_forward=true",
                            "--fsdp_auto_wrap_policy=TRANSFORMER_BASED_WRAP",
                            "--fsdp_transformer_layer_cls_to_wrap=BertLayer", "--mixed_precision=no"])
    results = json.loads((tmp_path / "all_results.json").read_text())
    assert sorted(results) == ["epoch-0", "epoch-1", "epoch-2"] and max(results.values()) >= 0.9
    assert (tmp_path / "model.safetensors").is_file()


def test_performance_under_tensor_parallelism_checks_a_schedule_that_steps_once_per_data_parallel_rank(hub, tmp_path):
    """Accelerate's TP suite's flags (transformers' plan, 2 processes, one tensor-parallel group): both ranks train on
    the same batches, so the scheduler advances once per step (the script checks the learning rate after the first
    step and at the end) and the run ends where the schedule does."""
    launch(SCRIPTS / "test_performance.py", "--model_name_or_path", hub["llama_classifier"], "--dataset_dir",
               hub["mrpc"], "--output_dir", tmp_path, "--add_pad_token=true", "--tp_plan=auto", "--tp_size=2",
               "--num_epochs=1", *LEARNS)
    assert list(json.loads((tmp_path / "all_results.json").read_text())) == ["epoch-0"]


def test_performance_below_its_lower_bound_fails(hub, tmp_path):
    failed = one_process("test_performance.py", *mrpc_args(hub, tmp_path), "--num_epochs=1",
                         "--performance_lower_bound=1.01")
    assert failed.returncode != 0
    assert "is lower than the lower bound 1.01" in failed.stderr


def test_checkpointing_under_zero2_resumes_where_the_first_run_was(hub, tmp_path):
    # a parent folder named like a checkpoint part, as the reference's FSDP suite uses
    output = tmp_path / "optimizer_pytorch_model_fsdp_path"
    output.mkdir()
    flags = deepspeed_flags(2)
    launch(SCRIPTS / "test_checkpointing.py", *mrpc_args(hub, output), "--partial_train_epoch=1",
               launch_args=flags)
    saved = json.loads((output / "state_0.json").read_text())
    assert saved["epoch"] == 0 and saved["step"] > 0 and 0 < saved["lr"] < 3e-3
    resumed = launch(SCRIPTS / "test_checkpointing.py", *mrpc_args(hub, output),
                         f"--resume_from_checkpoint={output / 'epoch_0'}", launch_args=flags)
    assert f"resumed checkpoint performance: {saved['accuracy']}" in resumed.stdout


def test_a_resume_that_does_not_match_the_saved_state_fails(hub, tmp_path):
    first = one_process("test_checkpointing.py", *mrpc_args(hub, tmp_path), "--partial_train_epoch=1")
    assert first.returncode == 0, first.stderr[-3000:]
    state = tmp_path / "state_0.json"
    changed = json.loads(state.read_text())
    changed["optimizer_lr"] += 1.0
    state.write_text(json.dumps(changed))
    failed = one_process("test_checkpointing.py", *mrpc_args(hub, tmp_path),
                         f"--resume_from_checkpoint={tmp_path / 'epoch_0'}")
    assert failed.returncode != 0
    assert "Optimizer learning rate mismatch, loading from checkpoint failed" in failed.stderr


def test_peak_memory_is_written_per_epoch_and_a_bound_below_it_fails(hub, tmp_path):
    launch(SCRIPTS / "test_peak_memory_usage.py", *mrpc_args(hub, tmp_path), "--n_train=64", "--n_val=16",
               "--peak_memory_upper_bound=20000", launch_args=deepspeed_flags(3))
    peaks = json.loads((tmp_path / "peak_memory_utilization.json").read_text())
    assert list(peaks) == ["epoch-0"] and 0 < peaks["epoch-0"] < 20000
    failed = one_process("test_peak_memory_usage.py", *mrpc_args(hub, tmp_path), "--n_train=32",
                         "--peak_memory_upper_bound=1")
    assert failed.returncode != 0 and "Peak memory usage exceeded the upper bound" in failed.stderr


def test_two_deepspeed_plugins_and_two_accelerators_train_their_models(hub):
    result = launch(SCRIPTS / "test_ds_multiple_model.py", "--model_name_or_path", hub["bert"],
                        "--dataset_dir", hub["mrpc"], *LEARNS, timeout=400)
    assert "MULTIPLE MODELS PASSED" in result.stdout


def test_ulysses_sequence_parallelism_under_zero3_in_bf16(hub, tmp_path):
    result = launch(SCRIPTS / "test_ds_alst_ulysses_sp.py", "--model_name_or_path", hub["llama"],
                        f"--output_dir={tmp_path}",
                        launch_args=["--num_machines=1", "--machine_rank=0", "--mixed_precision=bf16",
                                     "--use_deepspeed", "--zero_stage=3"], timeout=300)
    assert "ALST ULYSSES SP PASSED" in result.stdout and "3: loss=" in result.stdout


def test_transformers_zero3_after_the_script_made_its_process_group(hub):
    """transformers reaches hasten through the switch; its TrainingArguments select ZeRO-3 and the model is
    partitioned as it loads (the batch sizes only multiply out when DeepSpeed counts both processes)."""
    result = launch(SCRIPTS / "test_zero3_integration.py", "--model_name_or_path", hub["gpt2"],
                        env=clean_env(HASTEN_AS_ACCELERATE="1"))
    assert "ZERO3 INTEGRATION PASSED" in result.stdout


def test_metrics_counts_every_sample_once_for_every_loader_setting(hub):
    """The MRPC comparison runs on CPU with --mrpc (on an accelerator it always runs), on the tiny BERT."""
    result = launch(SCRIPTS / "test_metrics.py", "--mrpc", "--model_name_or_path", hub["bert"],
                        "--dataset_dir", hub["mrpc"], timeout=300)
    assert "METRICS PASSED" in result.stdout
    for setting in ("split_batches=True, dispatch_batches=True", "split_batches=False, dispatch_batches=False"):
        assert f"MRPC, {setting}" in result.stdout and f"99 samples, {setting}" in result.stdout, setting


def test_pippy_outputs_bert_and_gpt2_on_the_last_process_as_the_whole_model():
    result = launch(SCRIPTS / "test_pippy.py", "--tiny", timeout=300)
    assert "Testing gpt2" in result.stdout and "Testing bert" in result.stdout and "PIPPY PASSED" in result.stdout
    failed = one_process("test_pippy.py", "--tiny")
    assert failed.returncode != 0 and "needs two or more processes" in failed.stderr
