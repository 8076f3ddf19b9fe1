"""``hasten.plan`` and ``hasten plan``: every layout's memory per rank from traces scaled to the model's depth,
invalid layouts with their reason, bad input refused in one line, and the chosen layout as a launch config."""
import json
import subprocess
import sys

import pytest
import torch

from hasten.planning import Plan, PlanInputError, plan
from hasten.planning.model_source import transformers_source
from hasten.planning.step_memory import training_step_memory
from hasten.planning.traces import StepShape, Tracer
from hasten.precision.autocast import MixedPrecision
from helpers import ROOT, clean_env, run_launch

transformers = pytest.importorskip("transformers")

MiB = 2 ** 20


def llama(layers: int = 3) -> "transformers.LlamaConfig":
    """A tiny Llama; at 3 blocks or fewer the plan traces it whole (deeper ones: scaled from 2 and 3 blocks)."""
    return transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_attention_heads=4,
                                    num_key_value_heads=2, num_hidden_layers=layers, vocab_size=256,
                                    max_position_embeddings=128, head_dim=16)


@pytest.fixture(scope="module")
def four_processes() -> Plan:
    return plan(llama(), seq_len=32, micro_batch_size=2, num_processes=4, gpu_memory="4MiB",
                tp_sizes=[2, 3], cp_sizes=[2])


def test_depth_scaled_from_two_and_three_blocks_equals_the_whole_models_trace():
    source = transformers_source(llama(6))
    tracer = Tracer(source, StepShape(2, 32, mixed_precision="bf16"))

    def batch():
        return source.batch(2, 32)

    def whole_model():  # with its forward wrapped as prepare() wraps it under bf16
        return MixedPrecision("bf16", torch.device("cpu")).wrap_forward(source.build(None, 1, torch.float32))

    whole = training_step_memory(whole_model, batch, optimizer=tracer.optimizer, mixed_precision="bf16", steps=2)
    assert tracer.single().as_dict() == pytest.approx(whole.as_dict(), rel=0.01)


def test_every_layout_gets_a_row_with_its_parts_or_the_reason_it_cannot_run(four_processes):
    rows = {row.layout.name: row for row in four_processes.rows}
    assert rows["single"].status == "invalid" and "4 processes" in rows["single"].reason
    assert "num_machines > 1" in rows["hsdp"].reason
    assert rows["tp3"].reason == "tp 3 does not divide the 4 processes"
    assert rows["fsdp2+tp2"].status != "invalid" and rows["fsdp2+cp2"].status != "invalid"
    ddp, fsdp2 = rows["ddp"].memory.device, rows["fsdp2"].memory.device
    assert ddp.communication == ddp.parameters  # DDP's buckets: one more copy of the float32 gradients
    assert fsdp2.parameters == pytest.approx(ddp.parameters / 4, rel=0.05)  # this rank's shards
    assert fsdp2.gathered_parameters > 0 and fsdp2.peak < ddp.peak
    zero = {stage: rows[f"zero{stage}"].memory.device for stage in range(4)}
    assert zero[1].optimizer_state == pytest.approx(zero[0].optimizer_state / 4, abs=4)
    assert zero[2].peak <= zero[1].peak
    # stage 0 has no bucket of its own: it all-reduces the float32 gradients flattened once
    assert zero[0].communication == ddp.parameters < zero[1].communication
    assert zero[3].parameters == zero[2].parameters  # every tensor under DeepSpeed's persistence threshold: whole
    assert zero[1].communication == 500_000_000 * 2  # DeepSpeed's default bucket, in bf16
    offload = rows["zero3+offload_all"]
    assert offload.memory.device.optimizer_state == 0 and offload.memory.device.parameters == 0
    assert offload.memory.host > 0 and offload.host_per_machine_every_rank_loading > rows["zero3"].\
        host_per_machine_every_rank_loading
    assert rows["tp2+ddp2"].memory.device.parameters < ddp.parameters  # the narrowed model's share
    statuses = [row.status for row in four_processes.rows]
    assert statuses == sorted(statuses, key=["fits", "does not fit", "invalid"].index)
    for row in four_processes.rows:
        if row.memory is not None:
            assert row.fits == (row.peak <= four_processes.budget)
    as_json = json.loads(json.dumps(four_processes.as_json()))
    assert {"name", "parts", "peak", "fits"} <= set(as_json[0]) and isinstance(as_json[0]["fits"], bool)
    assert "best:" in four_processes.table() and "tp 3 does not divide" in four_processes.table()


def test_search_finds_the_largest_micro_batch_that_fits_and_auto_checkpointing_turns_on_when_needed():
    tracer = Tracer(transformers_source(llama()), StepShape(1, 16))  # traced at each size: no line through 1 and 2
    budget = tracer.single(micro_batch=6).peak + 1
    found = plan(llama(), seq_len=16, search=True, layouts=["single"], gpu_memory=budget).rows[0]
    assert found.fits and found.micro_batch_size >= 6 and tracer.single(micro_batch=found.micro_batch_size).peak \
        <= budget
    assert tracer.single(micro_batch=found.micro_batch_size + 1).peak > budget
    squeezed = tracer.single(micro_batch=8).peak - 1
    plain = plan(llama(), seq_len=16, micro_batch_size=8, layouts=["single"], gpu_memory=squeezed).rows[0]
    auto = plan(llama(), seq_len=16, micro_batch_size=8, layouts=["single"], gpu_memory=squeezed,
                activation_checkpointing="auto").rows[0]
    assert not plain.fits and auto.fits and auto.activation_checkpointing
    assert auto.memory.device.activations < plain.memory.device.activations


def test_bad_input_is_refused_in_one_line_before_any_tracing():
    for kwargs, message in (({"gpu_memory": "80 gigs"}, "gpu_memory: Cannot read"),
                            ({"gpu_memory": "1GB", "num_processes": 4, "num_machines": 3}, "num_machines=3"),
                            ({"gpu_memory": "1GB", "layouts": ["zero4"]}, "Unknown layout 'zero4'"),
                            ({"gpu_memory": "1GB", "optimizer": "lion"}, "Unknown optimizer 'lion'"),
                            ({"gpu_memory": "1GB", "mixed_precision": "fp8"}, "mixed_precision"),
                            ({"gpu_memory": "1GB", "micro_batch_size": 0}, "micro_batch_size")):
        with pytest.raises(PlanInputError, match=message) as caught:
            plan(llama(), seq_len=32, **kwargs)
        assert "\n" not in str(caught.value)
    if not torch.cuda.is_available():
        with pytest.raises(PlanInputError, match="--gpu_memory 80GB"):
            plan(llama(), seq_len=32)
    with pytest.raises(PlanInputError, match="not a model already built"):
        plan(torch.nn.Linear(2, 2), seq_len=4, gpu_memory="1GB")
    with pytest.warns(UserWarning, match="past the model's maximum of 128"):
        plan(llama(), seq_len=256, layouts=["single"], gpu_memory="1GB")


def test_a_folder_naming_its_own_code_is_refused_without_trust_remote_code(tmp_path):
    marker = tmp_path / "imported"
    (tmp_path / "modeling_evil.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    config = llama().to_dict()
    config.update(auto_map={"AutoConfig": "modeling_evil.Config", "AutoModelForCausalLM": "modeling_evil.Model"},
                  architectures=["EvilForCausalLM"])
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(PlanInputError, match="--trust_remote_code"):
        plan(str(tmp_path), seq_len=32, gpu_memory="1GB")
    assert not marker.exists()


def _hasten(*args, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", "hasten", *map(str, args)], capture_output=True, text=True,
                          env=clean_env(), cwd=cwd, timeout=300)


def _in_process(capfd, *args) -> tuple:
    from hasten.commands.cli import main

    capfd.readouterr()
    code = main([str(arg) for arg in args])
    out, err = capfd.readouterr()
    return code, out, err


def test_the_command_prints_json_writes_a_config_hasten_launch_runs_and_exits_2_on_usage_errors(tmp_path, capfd):
    folder = tmp_path / "model"
    folder.mkdir()
    llama().save_pretrained(folder)
    config_file = tmp_path / "plan.yaml"
    result = _hasten("plan", folder, "--seq_len", 32, "--num_processes", 2, "--gpu_memory", "3MiB", "--layouts",
                     "ddp,fsdp2", "--json", "--write_config", config_file, "--layout", "fsdp2")
    assert result.returncode == 0, result.stderr
    rows = json.loads(result.stdout)
    assert [row["name"] for row in rows] == ["fsdp2", "ddp"] or {row["name"] for row in rows} == {"fsdp2", "ddp"}
    assert all(isinstance(row["peak"], int) and set(row["parts"]) >= {"parameters", "activations"} for row in rows)
    launched = run_launch("check_plan_config.py", folder, num_processes=None,
                          launch_args=("--config_file", str(config_file)), preload=("transformers",))
    assert "check_plan_config OK FSDP 2 processes fsdp_version 2 units 3" in launched.stdout, launched.stdout
    for args, message in ((("--gpu_memory", "lots"), "gpu_memory: Cannot read"),
                          (("--gpu_memory", "1GB", "--write_config", config_file), "exists"),
                          (("--gpu_memory", "1GB", "--layouts", "ddp", "--write_config", tmp_path / "x.yaml",
                            "--layout", "zero9"), "No layout 'zero9'")):
        code, _, err = _in_process(capfd, "plan", folder, "--seq_len", 32, *args)  # the command's own main
        assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err
    assert "hasten plan" in _in_process(capfd, "estimate-memory", "--help")[1]
    from hasten.planning.layouts import FAMILIES
    from hasten.planning.names import OPTIMIZER_NAMES
    from hasten.planning.traces import OPTIMIZERS

    assert tuple(OPTIMIZERS) == OPTIMIZER_NAMES and "cp" in FAMILIES  # what --help offers is what the plan knows
