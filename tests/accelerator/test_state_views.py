"""The state users and libraries read says what is running, as the reference's does: every attribute that
tests/accelerator/state_views.py records, for every way a backend is chosen (argument, launcher environment,
config file), on one and on two processes, equal between the reference and hasten behind HASTEN_AS_ACCELERATE (the
same script under torchrun, the same launcher for both)."""
import json

import pytest

from helpers import clean_env, run_torchrun

pytest.importorskip("deepspeed")
pytest.importorskip("accelerate")

FSDP = "DistributedType.FSDP"


# what says which processes run (and not which backend): on several CPU processes hasten's DeepSpeed runs them as one
# job, where each of the reference's ranks runs alone, so these come from the reference's plain multi-CPU run
PROCESS_VIEWS = {"num_processes", "process_index", "local_process_index", "is_main_process", "is_local_main_process",
                 "is_last_process", "backend", "use_distributed", "should_save_model"}


def on_purpose(processes: int, scenario: str, attribute: str, theirs, plain: dict):
    """What hasten answers instead of the reference, on purpose (docs/migration.md), else the reference's value.
    ``plain``: what the reference's "plain" scenario read on the same rank."""
    fsdp, version_2 = scenario.startswith("fsdp"), scenario.startswith("fsdp2")
    owner, _, name = attribute.partition(".")
    if fsdp and name == "is_xla_gradients_synced":  # torch_xla's own FSDP reduces them: the reference says True under
        return False  # any FSDP; hasten says whether XLA reduced them (never, off XLA)
    if processes > 1:
        if name == "device":  # the reference says cpu:0, which no CPU tensor's device equals
            return "cpu"
        if scenario.startswith("deepspeed") and name in PROCESS_VIEWS:
            return plain[attribute]
        if scenario.startswith("deepspeed") and attribute == "state.repr.first_line":
            return theirs + "  Backend: gloo"
    if fsdp:  # hasten runs FSDP on CPUs and on one process too; the reference falls back to MULTI_CPU or NO
        if name == "distributed_type" and owner != "partial":
            return "FSDP"  # DistributedType is a str enum: recorded as its value
        if name in ("is_fsdp2", "is_composable_parallelism_enabled"):
            return version_2
        if attribute == "state.repr.first_line":
            text = theirs.replace("DistributedType.NO", FSDP).replace("DistributedType.MULTI_CPU", FSDP)
            return text + ("  Backend: gloo" if processes == 1 and scenario == "fsdp2 argument" else "")
        if processes == 1 and name == "backend" and scenario == "fsdp2 argument":
            return "gloo"  # the process group FSDP runs on
    return theirs


PRELOAD = ("accelerate", "accelerate.utils", "deepspeed")  # what state_views.py imports first: paid once per library


def record(tmp_path, name: str, processes: int, **env) -> list:
    """What each process of a ``processes``-process run of state_views.py read, rank by rank."""
    config = tmp_path / "ds_config.json"
    config.write_text(json.dumps({"zero_optimization": {"stage": 1}, "train_micro_batch_size_per_gpu": "auto",
                                  "gradient_accumulation_steps": 1}))
    out = tmp_path / f"{name}-{processes}"
    result = run_torchrun("state_views.py", out, config, num_processes=processes, timeout=300, env=clean_env(**env),
                          preload=PRELOAD)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    return [json.loads((tmp_path / f"{out.name}.rank{rank}.json").read_text()) for rank in range(processes)]


@pytest.mark.parametrize("processes", [1, 2])
def test_every_attribute_matches_the_reference_for_every_way_a_backend_is_chosen(tmp_path, processes):
    differences = []
    for rank, (theirs, mine) in enumerate(zip(record(tmp_path, "reference", processes),
                                              record(tmp_path, "hasten", processes, HASTEN_AS_ACCELERATE="1"))):
        assert sorted(mine) == sorted(theirs)
        for scenario, views in theirs.items():
            assert "error" not in views, (rank, scenario, views)  # every scenario runs on the reference
            assert "error" not in mine[scenario], (rank, scenario, mine[scenario])
            for attribute, value in views.items():
                if value == "<absent>" or str(value).startswith("<raises"):  # the reference cannot answer: any
                    continue  # answer is at least as good
                expected = on_purpose(processes, scenario, attribute, value, theirs["plain"])
                if mine[scenario].get(attribute, "<missing>") != expected:
                    differences.append(f"rank {rank}, {scenario}: {attribute} is "
                                       f"{mine[scenario].get(attribute, '<missing>')!r} on hasten, {value!r} on the "
                                       "reference")
    assert not differences, "\n".join(differences)
