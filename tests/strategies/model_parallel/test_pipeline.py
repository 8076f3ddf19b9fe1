"""Pipeline parallelism (hasten.parallel.pipeline).

Single-process: how ``split_model`` cuts a model (names, balance, the errors that list the model's children) and
the size checks of ``build_pipeline``. On 2 processes (one launch, tests/strategies/model_parallel/check_pipeline.py): GPipe,
1F1B and interleaved 1F1B train a tiny GPT to one process's losses and weights, ``eval_step`` gives its outputs,
and every bad input raises before any communication.
"""
from __future__ import annotations

import itertools
import sys
from pathlib import Path

import pytest
import torch
from helpers import run_launch
from torch import nn

from hasten.strategies.model_parallel.pipeline import (
    SCHEDULES,
    _balanced_starts,
    _plan,
    build_pipeline,
    pipeline_units,
    split_model,
)

HERE = Path(__file__).resolve().parent  # the scripts these tests launch live beside them
sys.path.insert(0, str(HERE))
from check_pipeline import RUNS, TinyGPT, make_model  # noqa: E402


def tokens(batch: int = 3):
    return torch.randint(0, 32, (batch, 8), generator=torch.Generator().manual_seed(0))


def run_stages(stages, inputs):
    for stage in stages:
        inputs = stage(inputs)
    return inputs


# ============================================================================================ split_model
def test_units_open_the_block_list_in_forward_order():
    names = [name for name, _ in pipeline_units(TinyGPT())]
    assert names == ["embed", "blocks.0", "blocks.1", "blocks.2", "blocks.3", "norm", "head"]


def test_split_points_cut_where_named_and_keep_the_models_parameter_names():
    model = make_model()
    stages = split_model(model, 3, ["blocks.1", "norm"])
    assert [stage.unit_names for stage in stages] == [("embed", "blocks.0"), ("blocks.1", "blocks.2", "blocks.3"),
                                                      ("norm", "head")]
    keys = [set(stage.state_dict()) for stage in stages]
    assert set().union(*keys) == set(model.state_dict()) and sum(map(len, keys)) == len(model.state_dict())
    assert stages[1].get_submodule("blocks.2") is model.blocks[2]  # shared, not copied
    x = tokens()
    assert torch.equal(run_stages(stages, x), model(x))


def test_a_chain_childs_name_as_split_point_means_its_first_block():
    stages = split_model(make_model(), 2, ["blocks"])
    assert [stage.unit_names[0] for stage in stages] == ["embed", "blocks.0"]


def test_a_sequential_model_is_cut_between_its_children_and_keeps_its_keys():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Sequential(nn.Linear(8, 8), nn.Tanh()), nn.Linear(8, 2))
    assert [name for name, _ in pipeline_units(model)] == ["0", "1", "2.0", "2.1", "3"]
    stages = split_model(model, 2, ["2.1"])
    assert sorted(stages[0].state_dict()) == ["0.bias", "0.weight", "2.0.bias", "2.0.weight"]
    x = torch.randn(5, 4)
    assert torch.equal(run_stages(stages, x), model(x))


def _largest_stage(sizes, starts):
    bounds = list(zip(starts, starts[1:] + [len(sizes)]))
    return max(sum(sizes[a:b]) for a, b in bounds)


@pytest.mark.parametrize("sizes, stages", [([512, 1072, 1072, 1072, 1072, 32, 544], 2),
                                           ([512, 1072, 1072, 1072, 1072, 32, 544], 4),
                                           ([5, 0, 0, 9, 1, 1, 1, 7, 3], 3), ([1, 1, 1], 3), ([0, 0, 10, 0], 2)])
def test_even_split_is_the_most_balanced_contiguous_cut(sizes, stages):
    starts = _balanced_starts(sizes, stages)
    assert starts[0] == 0 and all(a < b for a, b in zip(starts, starts[1:])) and starts[-1] < len(sizes)
    best = min(_largest_stage(sizes, [0, *cut]) for cut in itertools.combinations(range(1, len(sizes)), stages - 1))
    assert _largest_stage(sizes, starts) == best


def test_even_split_of_the_tiny_gpt_by_parameter_count():
    model = make_model()
    stages = split_model(model, 2)
    assert [stage.unit_names for stage in stages] == [("embed", "blocks.0", "blocks.1"),
                                                      ("blocks.2", "blocks.3", "norm", "head")]
    x = tokens()
    assert torch.equal(run_stages(stages, x), model(x))


def test_a_model_that_cannot_be_cut_into_that_many_stages_lists_its_children():
    with pytest.raises(ValueError, match=r"8 pipeline stages.*7 unit\(s\).*\['embed', 'blocks', 'norm', 'head'\]"):
        split_model(TinyGPT(), 8)
    with pytest.raises(ValueError, match=r"Linear cannot be cut.*no child modules \(its children are \[\]\)"):
        split_model(nn.Linear(2, 2), 2)


@pytest.mark.parametrize("stages, points, message", [
    (2, ["blocks.9"], r"'blocks.9' is not a unit.*\['embed', 'blocks', 'norm', 'head'\]"),
    (2, ["embed"], r"'embed' does not come after"),
    (3, ["norm", "blocks.1"], r"'blocks.1' does not come after the previous stage's start \('norm'\)"),
    (3, ["norm"], r"needs 2 name\(s\) for 3 stages"),
])
def test_bad_split_points_say_what_is_wrong(stages, points, message):
    with pytest.raises(ValueError, match=message):
        split_model(TinyGPT(), stages, points)


def test_parameters_on_the_model_itself_cannot_go_to_a_stage():
    model = TinyGPT()
    model.position = nn.Parameter(torch.zeros(8, 16))
    with pytest.raises(ValueError, match=r"\['position'\] are registered on the model itself.*'blocks'"):
        split_model(model, 2)


def test_tied_weights_across_stages_are_refused_but_allowed_inside_one():
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 4))
    model[2].weight = model[0].weight
    with pytest.raises(ValueError, match=r"'0.weight' of stage 0 is also '2.weight' of stage 1 \(tied weights\)"):
        split_model(model, 2, ["1"])
    with pytest.raises(ValueError, match="tied weights"):
        split_model(model, 2, ["2"])
    split_model(nn.Sequential(model, nn.Linear(4, 4)), 2, ["1"])  # the tie stays inside stage 0


def test_example_input_catches_a_forward_that_is_not_the_chain_of_its_children():
    class SkipsNorm(TinyGPT):
        def forward(self, tokens):
            hidden = self.embed(tokens)
            for block in self.blocks:
                hidden = block(hidden)
            return self.head(hidden)

    model = make_model()
    split_model(model, 2, example_input=tokens())  # the real chain passes
    with pytest.raises(ValueError, match=r"not the chain of its children.*\['embed', 'blocks', 'norm', 'head'\]"):
        split_model(SkipsNorm(), 2, example_input=tokens())


def test_example_input_is_checked_without_dropout_and_leaves_the_modes_as_they_were():
    model = nn.Sequential(nn.Linear(4, 16), nn.Dropout(0.5), nn.Linear(16, 4))
    model[2].eval()
    split_model(model, 2, example_input=torch.randn(64, 4))  # in training mode the two runs would drop differently
    assert [module.training for module in model.modules()] == [True, True, True, False]


@pytest.mark.parametrize("stages", [0, -1, 1.5, True])
def test_num_stages_must_be_a_positive_whole_number(stages):
    with pytest.raises(ValueError, match="num_stages must be a whole number >= 1"):
        split_model(TinyGPT(), stages)


# ============================================================================================ pipeline sizes
def test_virtual_stages_per_schedule():
    assert _plan(2, 2, "gpipe", 4, None) == 1
    assert _plan(2, 2, "1f1b", 2, None) == 1
    assert _plan(4, 2, "interleaved_1f1b", 4, None) == 2
    assert _plan(6, 2, "interleaved_1f1b", 2, 3) == 3


@pytest.mark.parametrize("args, message", [
    ((2, 2, "zb", 4, None), r"Unknown pipeline schedule 'zb'; the schedules are \['1f1b', 'gpipe', "
                            r"'interleaved_1f1b'\]"),
    ((2, 2, "gpipe", 0, None), "num_micro_batches must be a whole number >= 1"),
    ((4, 4, "1f1b", 3, None), r"num_micro_batches=3 < 4"),
    ((4, 2, "interleaved_1f1b", 1, None), r"num_micro_batches=1 < 2"),
    ((4, 2, "interleaved_1f1b", 5, None), r"multiple of 2 rounds"),
    ((3, 2, "gpipe", 4, None), r"3 stage\(s\), but 2 pipeline rank\(s\) x 1 virtual stage\(s\) per rank = 2"),
    ((5, 2, "interleaved_1f1b", 4, None), r"5 stage\(s\), but 2 pipeline rank\(s\) x 2 virtual"),
    ((4, 2, "interleaved_1f1b", 4, 3), r"4 stage\(s\).*= 6"),
    ((4, 2, "gpipe", 4, 2), r"one stage per rank.*interleaved_1f1b"),
])
def test_bad_pipeline_sizes_raise_clear_errors(args, message):
    with pytest.raises(ValueError, match=message):
        _plan(*args)


def test_the_schedules_are_torchs():
    from torch.distributed import pipelining

    assert all(hasattr(pipelining, cls) for cls, _ in SCHEDULES.values())


def test_build_pipeline_needs_a_process_group():
    with pytest.raises(RuntimeError, match="torch.distributed to be initialised"):
        build_pipeline(split_model(TinyGPT(), 2), 0, None, num_micro_batches=2)


# ============================================================================================ on 2 processes
def test_schedules_train_like_one_process_and_bad_inputs_raise_before_communicating():
    result = run_launch("check_pipeline.py", num_processes=2)
    out = result.stdout
    assert "PIPELINE CHECKS PASSED" in out, out
    lines = out.splitlines()
    for name in RUNS:  # each check passed on both ranks
        for what in ("losses of 20 steps match one process", "final parameters of both ranks match one process"):
            assert sum(f"ok: {name} " in line and what in line for line in lines) == 2, (name, what, out)
        assert f"ok: {name} eval_step outputs match the last stage" in out
    assert out.count("raises before any communication") == 21, out
    assert out.count("ok: eval_step takes a new batch shape after step") == 2
    assert out.count("ok: step takes the training shape again after eval_step") == 2
    assert "ok: broadcast_loss=False gives the loss on this rank" in out
    assert "ok: broadcast_loss=False gives None on this rank" in out


def test_the_launchers_pipeline_size_reaches_the_parallelism_config(monkeypatch, tmp_path):
    from launch_fixtures import plan_for

    from hasten.parallel import resolve_parallelism_config

    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    env = plan_for(["--parallelism_config_pp_size", "2", "--parallelism_config_dp_shard_size", "2", "-n", "4",
                    str(script)]).env
    assert env["HASTEN_PARALLELISM_CONFIG_PP_SIZE"] == "2" and env["HASTEN_USE_PARALLELISM_CONFIG"] == "true"
    for key, value in env.items():
        if key.startswith("HASTEN_"):
            monkeypatch.setenv(key, value)
    config = resolve_parallelism_config(None)
    assert (config.pp_size, config.dp_shard_size) == (2, 2)
    from hasten.commands.errors import CommandError

    with pytest.raises(CommandError, match="pp_size=2"):
        plan_for(["--parallelism_config_pp_size", "2", "-n", "3", str(script)])
