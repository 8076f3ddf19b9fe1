"""The strategy conformance suite: every strategy trains to single-process PyTorch's numbers, and a checkpoint
saved under one strategy loads under another (tests/strategies/check_strategy_conformance.py does the work).

Each backend adds itself with one line in the script's STRATEGIES table; the chain below then runs it after the
ones before of its workload (the MLP, or the language model of the strategies that need attention heads), loading
the previous one's checkpoint, and the first strategy of each workload loads the last one's. Pipeline-parallel
inference runs the MLP on the weights of checkpoints of several layouts.
"""
import sys
from pathlib import Path

import pytest
from helpers import run_launch

HERE = Path(__file__).resolve().parent  # the scripts these tests launch live beside them
sys.path.insert(0, str(HERE))
from check_strategy_conformance import STRATEGIES, workload_of  # noqa: E402

ORDER = list(STRATEGIES)


def conformance(line: str, work, *others, num_processes: int):
    """Launch the script's ``line`` (a strategy, or ``pipeline_inference``) on ``num_processes`` processes; DeepSpeed's
    lines start from a process that already imported DeepSpeed (as the script does when it builds the plugin)."""
    deepspeed = line in STRATEGIES and STRATEGIES[line][2] == "DeepSpeedStrategy"
    return run_launch("check_strategy_conformance.py", line, work, *others, num_processes=num_processes,
                      preload=("deepspeed",) if deepspeed else ())


def previous_of(position: int) -> list:
    """The strategy before ``ORDER[position]`` with the same workload (its checkpoint is loaded), if any."""
    workload = workload_of(ORDER[position])
    earlier = [name for name in ORDER[:position] if workload_of(name) == workload]
    return earlier[-1:]


def chains() -> list:
    """(first, last) strategy of each workload."""
    ends = {}
    for name in ORDER:
        ends.setdefault(workload_of(name), [name, name])[1] = name
    return [tuple(pair) for pair in ends.values()]


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    return tmp_path_factory.mktemp("conformance")


def _marked(position: int):
    """DeepSpeed's lines carry the ``deepspeed`` marker (``-m 'not deepspeed'`` deselects them)."""
    name = ORDER[position]
    marks = [pytest.mark.deepspeed] if STRATEGIES[name][2] == "DeepSpeedStrategy" else []
    return pytest.param(position, id=name, marks=marks)


@pytest.mark.parametrize("position", [_marked(i) for i in range(len(ORDER))])
def test_strategy_matches_single_process_pytorch_and_loads_the_previous_checkpoint(work, position):
    strategy = ORDER[position]
    world = STRATEGIES[strategy][0]
    previous = previous_of(position)
    result = conformance(strategy, work, *previous, num_processes=world)
    assert f"CONFORMANCE PASSED {strategy}" in result.stdout, result.stdout
    if previous:
        assert f"ok: {strategy} loaded {previous[0]}'s checkpoint" in result.stdout


@pytest.mark.parametrize("first, last", chains(), ids=[workload_of(first) for first, _ in chains()])
def test_the_first_strategy_loads_the_last_strategys_checkpoint(work, first, last):
    if not (work / last).is_dir():  # run alone: produce the last strategy's checkpoint first
        conformance(last, work, num_processes=STRATEGIES[last][0])
    result = conformance(first, work, last, num_processes=STRATEGIES[first][0])
    assert f"ok: {first} loaded {last}'s checkpoint" in result.stdout, result.stdout


# Sharded checkpoints reshard: besides the chain above (where fsdp2_config loads FSDP2's shards of 2 processes on 4,
# and the next line those of 4 on 2), load on 2 what 1 and 4 processes saved, under both FSDP versions.
CROSS_LOADS = [("fsdp2", "single"), ("fsdp2", "fsdp2_config"), ("fsdp2", "hsdp"), ("fsdp1_sharded", "hsdp")]
CROSS_LOADS += [("single", "tp"), ("tp", "fsdp2")]  # TP=2 shards on one process; full FSDP files split over tp
if "zero3" in STRATEGIES:  # an FSDP run loads ZeRO-3 partitions; a ZeRO-2 offload engine its sibling's own files
    CROSS_LOADS += [("fsdp2", "zero3"), ("zero2_offload", "zero2"), ("zero3_bf16", "hsdp")]


@pytest.mark.parametrize("strategy, other", CROSS_LOADS, ids=[f"{a}<-{b}" for a, b in CROSS_LOADS])
def test_a_checkpoint_loads_on_another_number_of_processes(work, strategy, other):
    if not (work / other).is_dir():  # run alone: produce the other strategy's checkpoint first
        conformance(other, work, num_processes=STRATEGIES[other][0])
    result = conformance(strategy, work, other, num_processes=STRATEGIES[strategy][0])
    assert f"ok: {strategy} loaded {other}'s checkpoint" in result.stdout, result.stdout


# Pipeline-parallel inference (prepare_pippy, one stage per process) on the weights of full files, FSDP2 shards and a
# ZeRO-3 engine's own partitions: the whole model's outputs on one process.
PIPELINE_WEIGHTS = ["single", "fsdp2"] + (["zero3"] if "zero3" in STRATEGIES else [])


@pytest.mark.parametrize("other", [pytest.param(name, marks=[pytest.mark.deepspeed] if name == "zero3" else [])
                                   for name in PIPELINE_WEIGHTS])
def test_pipeline_inference_on_a_checkpoints_weights_equals_the_whole_model(work, other):
    if not (work / other).is_dir():  # run alone: produce the checkpoint first
        conformance(other, work, num_processes=STRATEGIES[other][0])
    result = conformance("pipeline_inference", work, other, num_processes=2)
    assert f"PIPELINE INFERENCE PASSED on {other}'s weights (2 stages)" in result.stdout, result.stdout
