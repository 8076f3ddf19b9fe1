"""The calls the reference makes safe on any process, made on every process and on the main process only (run with
2 processes by tests/accelerator/test_training_distributed.py).

The process group's timeout is 20 s, so a call that waited for a process that never comes fails this script
loudly instead of hanging it. After each pattern every process meets at ``wait_for_everyone``.
"""
import json
import logging
import sys
from datetime import timedelta
from pathlib import Path

import torch
from torch import nn

from hasten import Accelerator
from hasten.checkpointing import CheckpointError
from hasten.utils import InitProcessGroupKwargs


def check(condition, what, accelerator):
    if not condition:
        raise AssertionError(f"[rank {accelerator.process_index}] {what}")


def trackers(accelerator: Accelerator, main_only: bool) -> None:
    """diffusers' pattern (trackers started and ended on the main process, ``log`` everywhere) and the plain one."""
    everywhere = not main_only
    if everywhere or accelerator.is_main_process:
        accelerator.init_trackers("main-only" if main_only else "everywhere", config={"lr": 0.1})
    for step in range(3):
        accelerator.log({"loss": torch.tensor(1.0 / (step + 1))}, step=step)  # every process, as diffusers does
    tracker = accelerator.get_tracker("jsonl")  # elsewhere than on the main process: a blank tracker
    check((getattr(tracker, "name", None) == "jsonl") == accelerator.is_main_process, f"get_tracker: {tracker!r}",
          accelerator)
    if everywhere or accelerator.is_main_process:
        accelerator.end_training()
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        lines = (Path(accelerator.logging_dir) / ("main-only" if main_only else "everywhere") / "metrics.jsonl")
        steps = [json.loads(line)["step"] for line in lines.read_text().splitlines()]
        check(steps == [0, 1, 2], f"logged steps {steps}", accelerator)
    if main_only:
        check(accelerator.trackers == [] or accelerator.is_main_process, "no tracker off the main process",
              accelerator)


def saving(accelerator: Accelerator, model: nn.Module, folder: Path, main_only: bool) -> None:
    """``save``, ``save_model``, ``get_state_dict``, ``unwrap_model`` and ``print`` under DDP."""
    if not main_only or accelerator.is_main_process:
        state = accelerator.get_state_dict(model)
        accelerator.save(state, folder / "weights.bin")
        accelerator.save_model(model, folder / "model")
        accelerator.unwrap_model(model).eval()
        accelerator.print("saved", "main-only" if main_only else "everywhere")
    accelerator.wait_for_everyone()
    expected = accelerator.unwrap_model(model).state_dict()
    from safetensors.torch import load_file

    written = load_file(folder / "model" / "model.safetensors")
    check(sorted(written) == sorted(expected), f"save_model wrote {sorted(written)}", accelerator)
    check(all(torch.equal(written[k], expected[k]) for k in expected), "save_model's weights", accelerator)
    loaded = torch.load(folder / "weights.bin", weights_only=True)
    check(all(torch.equal(loaded[k], expected[k]) for k in expected), "save's weights", accelerator)


class _Warnings(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def _draws() -> list:
    return torch.rand(3).tolist()


def save_states(accelerator: Accelerator, model: nn.Module, work: Path) -> None:
    """``save_state`` under DDP on every process, on the main process only (nothing waits for the other process,
    which is blocked elsewhere), into a folder per process, in the background, a failure of the main process's save,
    and a damaged file of process 1 (participation.py, contributions.py)."""
    from torch.distributed import distributed_c10d

    store = distributed_c10d._get_default_store()
    store.set_timeout(timedelta(seconds=30))
    optimizer = accelerator.prepare(torch.optim.SGD(model.parameters(), lr=0.1))
    loader = accelerator.prepare(torch.utils.data.DataLoader(list(range(16)), batch_size=2, shuffle=True))
    iter(loader).__next__()
    rank = accelerator.process_index
    warnings = _Warnings()
    logging.getLogger("hasten").addHandler(warnings)

    everywhere = work / "state-everywhere"
    accelerator.save_state(everywhere)
    after_save = _draws()
    accelerator.wait_for_everyone()
    marker = json.loads((everywhere / "hasten_checkpoint.json").read_text())
    record = json.loads((everywhere / "hasten_process_1.json").read_text())
    check(marker["contributions"] and record["save_id"] == marker["save_id"], f"marker {marker}, record {record}",
          accelerator)
    check(sorted(record["files"]) == ["loader_states_1.bin", "random_states_1.pkl"], f"record {record}", accelerator)
    check("random_states_1.pkl" not in marker["files"] and not list(work.glob(".state-everywhere*")),
          f"process 1's files are its own: {sorted(marker['files'])}, {list(work.iterdir())}", accelerator)
    accelerator.load_state(everywhere)
    check(_draws() == after_save, "every process's random states come back", accelerator)

    own = work / f"state-own-{rank}"
    accelerator.save_state(own)
    accelerator.wait_for_everyone()
    check((own / "model.safetensors").is_file() and (own / f"random_states_{rank}.pkl").is_file()
          and (rank == 0 or "contributions" not in json.loads((own / f"hasten_checkpoint.process_{rank}.json")
                                                              .read_text())),
          f"a folder per process holds a whole checkpoint: {sorted(own.iterdir())}", accelerator)

    background = work / "state-async"
    accelerator.save_state(background, async_save=True)
    accelerator.wait_for_checkpoint()
    accelerator.wait_for_everyone()
    check((background / "hasten_process_1.json").is_file() and (background / "random_states_1.pkl").is_file(),
          f"async: process 1's files added: {sorted(background.iterdir())}", accelerator)

    def fail_on_main(models, weights, folder):
        if accelerator.is_main_process:
            raise OSError("disk gone")

    hook = accelerator.register_save_state_pre_hook(fail_on_main)
    try:
        accelerator.save_state(work / "state-failed")
    except (OSError, CheckpointError) as error:
        check(("disk gone" in str(error)) and (rank == 0) == isinstance(error, OSError), f"failed save: {error!r}",
              accelerator)
    else:
        check(False, "the main process's failed save raised nowhere", accelerator)
    hook.remove()
    accelerator.wait_for_everyone()
    check(not (work / "state-failed").exists() and not list(work.glob(".state-failed*")),
          f"nothing left by the failed save: {sorted(work.iterdir())}", accelerator)

    main_only = work / "state-main-only"
    if accelerator.is_main_process:
        accelerator.save_state(main_only)  # process 1 waits below until this returned: a wait for it would hang
        store.set("main-only-saved", "1")
    else:
        store.wait(["main-only-saved"])
    accelerator.wait_for_everyone()
    check(sorted(path.name for path in main_only.iterdir()) ==
          ["hasten_checkpoint.json", "loader_states_0.bin", "model.safetensors", "optimizer.bin",
           "random_states_0.pkl"], f"main-only save: {sorted(main_only.iterdir())}", accelerator)
    before = torch.random.get_rng_state()
    warnings.lines.clear()
    accelerator.load_state(main_only)
    missing = [line for line in warnings.lines if "holds no random states of process" in line]
    check(len(missing) == (rank == 1), f"one warning on process 1 only: {warnings.lines}", accelerator)
    check(rank == 0 or torch.equal(torch.random.get_rng_state(), before), "process 1 keeps its generator",
          accelerator)

    if accelerator.is_main_process:
        damaged = everywhere / "random_states_1.pkl"
        data = bytearray(damaged.read_bytes())
        data[len(data) // 2] ^= 0xFF
        damaged.write_bytes(bytes(data))
    accelerator.wait_for_everyone()
    try:
        accelerator.load_state(everywhere)
    except CheckpointError as error:
        check(rank == 1 or "process 1" in str(error), f"damaged file of process 1: {error}", accelerator)
    else:
        check(False, "a damaged file of process 1 was loaded", accelerator)
    logging.getLogger("hasten").removeHandler(warnings)


def main(work: Path) -> None:
    accelerator = Accelerator(cpu=True, log_with=["jsonl", "tensorboard"], project_dir=work,
                              kwargs_handlers=[InitProcessGroupKwargs(timeout=timedelta(seconds=20))])
    check(accelerator.num_processes == 2, "needs 2 processes", accelerator)
    model = accelerator.prepare(nn.Linear(4, 3))
    for main_only in (True, False):
        trackers(accelerator, main_only)
        saving(accelerator, model, work / ("main-only" if main_only else "everywhere"), main_only)
    save_states(accelerator, model, work)
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        print("MAIN ONLY CALLS OK", flush=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
