"""Experiment tracking in a multi-process run (run with 2 processes by tests/tracking/test_tracking_distributed.py).

Every process calls init_trackers / log / end_training; only rank 0 writes TensorBoard and JSONL files. After
end_training, rank 0 reads them back (TensorBoard through its EventAccumulator) and checks the values and steps.
"""
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from hasten import Accelerator
from hasten.tracking import GeneralTracker

LOSSES = [2.0, 1.0, 0.5, 0.25]


class CountingTracker(GeneralTracker):
    """Runs on every process (main_process_only = False) and counts its log calls."""

    name = "counting"
    requires_logging_directory = False
    main_process_only = False

    def __init__(self):
        super().__init__()
        self.calls = 0

    @property
    def tracker(self):
        return self.calls

    def log(self, values, step=None, **kwargs):
        self.calls += 1


def check(condition, what):
    if not condition:
        raise AssertionError(f"[rank {dist.get_rank()}] {what}")


def main():
    run_dir = Path(sys.argv[1])
    counting = CountingTracker()
    accelerator = Accelerator(cpu=True, log_with=["tensorboard", "jsonl", counting], project_dir=run_dir)
    check(accelerator.num_processes == 2, "needs 2 processes")
    accelerator.init_trackers("dist", config={"lr": 0.1, "world": accelerator.num_processes})
    for step, loss in enumerate(LOSSES):
        # every process computes its own loss; the logged value is the mean, as a one-element tensor
        local = torch.tensor(loss * (1 + accelerator.process_index))
        accelerator.log({"loss": accelerator.reduce(local, "mean")}, step=step * 10)
    tensorboard = accelerator.get_tracker("tensorboard")
    if accelerator.is_main_process:
        check(tensorboard.writer is not None, "rank 0 opens the TensorBoard writer")
    else:
        check(type(tensorboard) is GeneralTracker, "other ranks get a blank tracker, not a writer")
    check([t.name for t in accelerator.trackers] == (["tensorboard", "jsonl", "counting"]
                                                       if accelerator.is_main_process else ["counting"]),
          f"trackers on this process: {[t.name for t in accelerator.trackers]}")
    check(counting.calls == len(LOSSES), "a main_process_only=False tracker logs on every process")
    accelerator.end_training()

    if accelerator.is_main_process:
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

        expected = [(step * 10, loss * 1.5) for step, loss in enumerate(LOSSES)]  # mean of loss*1 and loss*2
        events = EventAccumulator(str(run_dir / "dist"))
        events.Reload()
        got = [(event.step, event.value) for event in events.Scalars("loss")]
        check(got == expected, f"TensorBoard scalars {got} != {expected}")
        event_files = list((run_dir / "dist").glob("events.out.tfevents.*"))
        check(len({path.name.split(".")[-2] for path in event_files}) == 1, f"one writer process: {event_files}")
        lines = [json.loads(line) for line in (run_dir / "dist" / "metrics.jsonl").read_text().splitlines()]
        check([(line["step"], line["values"]["loss"]) for line in lines] == expected, f"JSONL lines {lines}")
        check(json.loads((run_dir / "dist" / "config.json").read_text()) == {"lr": 0.1, "world": 2}, "config.json")
        print("TRACKING OK", flush=True)


if __name__ == "__main__":
    main()
