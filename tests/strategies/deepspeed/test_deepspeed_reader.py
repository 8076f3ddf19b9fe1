"""hasten.checkpointing.deepspeed_reader rebuilds, from a real DeepSpeed checkpoint folder alone, exactly the full
fp32 weights and Adam moments the live engine held, in torch.optim's own state_dict layout.

One launch of tests/strategies/deepspeed/make_deepspeed_checkpoints.py (2 processes, DeepSpeed on CPU) writes every case;
the tests then read the folders in this process, with no process group.
"""
import importlib.util
import shutil
import sys
from pathlib import Path

import pytest

# deepspeed is imported inside the tests only (importing it sets variables: conftest puts them back)
pytestmark = [pytest.mark.deepspeed, pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None,
                                                         reason="needs the deepspeed extra (make test installs it)")]

import torch  # noqa: E402
from helpers import clean_env, run_launch  # noqa: E402

from hasten.checkpointing.errors import (  # noqa: E402
    CorruptCheckpointError,
    IncompleteCheckpointError,
)
from hasten.checkpointing.deepspeed_files import (  # noqa: E402
    deepspeed_parameter_names,
    is_deepspeed_checkpoint,
    read_deepspeed_checkpoint,
    read_deepspeed_layout,
)

HERE = Path(__file__).resolve().parent  # the scripts these tests launch live beside them
sys.path.insert(0, str(HERE))
from make_deepspeed_checkpoints import CASES  # noqa: E402

TAG = "pytorch_model"
# Which DeepSpeed optimizer wrote each case (what read_deepspeed_layout must report).
KINDS = {"stage0_fp32": "torch", "stage0_bf16": "fp16_unfused", "stage1_bf16_optimizer": "bf16_optimizer"}
OPTIMIZER_CLASSES = {"torch": {"AdamW"}, "fp16_unfused": {"FP16_UnfusedOptimizer"},
                     "bf16_optimizer": {"BF16_Optimizer"}, "zero": {"DeepSpeedZeroOptimizer", "DeepSpeedZeroOptimizer_Stage3"}}


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    out = tmp_path_factory.mktemp("deepspeed")
    env = clean_env(DS_ACCELERATOR="cpu")
    result = run_launch("make_deepspeed_checkpoints.py", out, env=env, timeout=600, preload=("deepspeed",))
    assert "DEEPSPEED CHECKPOINTS MADE" in result.stdout, result.stdout
    return out


def expected(made, case):
    return torch.load(made / case / "expected.pt", weights_only=False)


def flat_names(names):
    return [n for group in names for n in group]


@pytest.mark.parametrize("case", list(CASES))
def test_weights_are_the_engines_fp32_master_weights_under_every_name(made, case):
    truth = expected(made, case)
    weights, optimizer = read_deepspeed_checkpoint(made / case / TAG, with_optimizer=False)
    assert optimizer is None
    assert set(weights) == set(truth["state_dict_keys"])  # buffers and the tied alias included
    for name, value in truth["weights"].items():
        assert weights[name].dtype == torch.float32 and weights[name].device.type == "cpu", name
        assert torch.equal(weights[name], value), name
    assert torch.equal(weights["mid_again.weight"], truth["weights"]["mid.weight"])
    for name, value in truth["buffers"].items():
        assert torch.equal(weights[name], value), name


@pytest.mark.parametrize("case", list(CASES))
def test_optimizer_state_is_torchs_layout_with_the_engines_moments(made, case):
    truth = expected(made, case)
    folder = made / case / TAG
    names = deepspeed_parameter_names(folder)
    assert names == truth["names"]
    weights, optimizer = read_deepspeed_checkpoint(folder)
    assert set(weights) == set(truth["state_dict_keys"])
    assert optimizer["param_groups"] == truth["param_groups"]  # hyperparameters and positions, as torch has them
    order = flat_names(names)
    assert sorted(optimizer["state"]) == list(range(len(order)))
    for position, name in enumerate(order):
        entry = optimizer["state"][position]
        assert set(entry) == {"step", "exp_avg", "exp_avg_sq"}, name
        assert torch.equal(entry["step"], torch.tensor(truth["step"])), name
        for key in ("exp_avg", "exp_avg_sq"):
            assert entry[key].dtype == torch.float32, (name, key)
            assert torch.equal(entry[key], truth[key][name]), (name, key)


def test_the_state_loads_into_plain_pytorch(made):
    """What a DDP/FSDP/single-process run does with it: load_state_dict into a fresh model and AdamW."""
    from make_deepspeed_checkpoints import TiedNet, make_optimizer

    model = TiedNet()
    optimizer = make_optimizer(model)
    weights, state = read_deepspeed_checkpoint(made / "stage3_bf16" / TAG)
    model.load_state_dict(weights)
    optimizer.load_state_dict(state)
    truth = expected(made, "stage3_bf16")
    assert torch.equal(model.mid_again.weight, truth["weights"]["mid.weight"])
    assert torch.equal(optimizer.state[model.out.bias]["exp_avg"], truth["exp_avg"]["out.bias"])


@pytest.mark.parametrize("case", list(CASES))
def test_layout_reports_stage_world_size_and_dtype(made, case):
    stage, bf16, _ = CASES[case]
    layout = read_deepspeed_layout(made / case / TAG)
    assert layout["zero_stage"] == stage
    assert layout["world_size"] == 2
    assert layout["dtype"] == ("bfloat16" if bf16 else "float32")
    assert layout["optimizer"] == KINDS.get(case, "zero")
    assert len(layout["optim_files"]) == (0 if stage == 0 else 2)
    # ... and the case really exercised the DeepSpeed optimizer it is named for.
    assert expected(made, case)["optimizer_class"] in OPTIMIZER_CLASSES[layout["optimizer"]]


def test_only_deepspeed_folders_are_recognised(made, tmp_path):
    assert is_deepspeed_checkpoint(made / "stage0_fp32" / TAG)
    assert is_deepspeed_checkpoint(made / "stage3_fp32" / TAG)
    (tmp_path / "model.safetensors").write_bytes(b"")
    assert not is_deepspeed_checkpoint(tmp_path)
    assert not is_deepspeed_checkpoint(tmp_path / "absent")
    with pytest.raises(CorruptCheckpointError, match="not a DeepSpeed checkpoint"):
        read_deepspeed_checkpoint(tmp_path)


@pytest.mark.parametrize("case, lost", [("stage2_fp32", [1]), ("stage3_bf16", [1]), ("stage1_bf16_optimizer", [0, 1])])
def test_a_missing_rank_file_is_named(made, tmp_path, case, lost):
    folder = tmp_path / TAG
    shutil.copytree(made / case / TAG, folder)
    files = read_deepspeed_layout(folder)["optim_files"]
    for rank in lost:
        (folder / files[rank]).unlink()
    with pytest.raises(IncompleteCheckpointError, match=files[lost[0]]):
        read_deepspeed_checkpoint(folder)
    if 0 in lost:  # with every optimizer file gone, not even the layout passes for a stage-0 checkpoint
        with pytest.raises(IncompleteCheckpointError, match=files[0]):
            read_deepspeed_layout(folder)


def _rewrite_stage0(made, tmp_path, change, case="stage0_fp32"):
    folder = tmp_path / TAG
    shutil.copytree(made / case / TAG, folder)
    states = torch.load(folder / "mp_rank_00_model_states.pt", weights_only=False)
    change(states)
    torch.save(states, folder / "mp_rank_00_model_states.pt")
    return folder


def test_stage0_names_that_contradict_the_saved_shapes_are_refused(made, tmp_path):
    def groups_in_another_order(states):
        optimizer = states["optimizer"]
        old = optimizer["state"]
        optimizer["state"] = {0: old[2], 1: old[3], 2: old[4], 3: old[0], 4: old[1]}
        first, second = optimizer["param_groups"]
        optimizer["param_groups"] = [{**second, "params": [0, 1, 2]}, {**first, "params": [3, 4]}]

    folder = _rewrite_stage0(made, tmp_path, groups_in_another_order)
    with pytest.raises(CorruptCheckpointError, match="module order"):
        read_deepspeed_checkpoint(folder)
    with pytest.raises(CorruptCheckpointError, match="module order"):
        deepspeed_parameter_names(folder)


def test_the_fused_fp16_optimizer_layout_is_refused_clearly(made, tmp_path):
    """DeepSpeed's fused FP16_Optimizer (FusedAdam, GPU only) keeps one flat master tensor per group."""
    def as_fused(states):
        states["optimizer"]["fp32_groups_flat"] = [torch.cat([t.flatten() for t in group])
                                                   for group in states["optimizer"].pop("fp32_groups")]

    folder = _rewrite_stage0(made, tmp_path, as_fused, case="stage0_bf16")
    assert read_deepspeed_layout(folder)["optimizer"] == "fp16_fused"
    with pytest.raises(CorruptCheckpointError, match="FusedAdam"):
        read_deepspeed_checkpoint(folder)


def test_a_missing_deepspeed_names_the_extra(made, monkeypatch):
    for module in ("deepspeed", "deepspeed.utils", "deepspeed.utils.zero_to_fp32"):
        monkeypatch.setitem(sys.modules, module, None)
    with pytest.raises(ImportError, match=r"pip install 'hasten\[deepspeed\]'"):
        read_deepspeed_checkpoint(made / "stage2_fp32" / TAG)
