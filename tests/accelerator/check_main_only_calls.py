"""The calls the reference makes safe on any process, made on every process and on the main process only (run with
2 processes by tests/accelerator/test_main_only_calls.py).

The process group's timeout is 20 s, so a call that waited for a process that never comes fails this script
loudly instead of hanging it. After each pattern every process meets at ``wait_for_everyone``.
"""
import json
import sys
from datetime import timedelta
from pathlib import Path

import torch
from torch import nn

from hasten import Accelerator
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


def main(work: Path) -> None:
    accelerator = Accelerator(cpu=True, log_with=["jsonl", "tensorboard"], project_dir=work,
                              kwargs_handlers=[InitProcessGroupKwargs(timeout=timedelta(seconds=20))])
    check(accelerator.num_processes == 2, "needs 2 processes", accelerator)
    model = accelerator.prepare(nn.Linear(4, 3))
    for main_only in (True, False):
        trackers(accelerator, main_only)
        saving(accelerator, model, work / ("main-only" if main_only else "everywhere"), main_only)
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        print("MAIN ONLY CALLS OK", flush=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
