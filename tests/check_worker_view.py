"""Launched by tests/test_warm_launch.py: prints what a worker sees of its start (one JSON line per rank), or fails on
rank 1 when asked, so that a warm start and a real ``hasten launch`` can be compared."""
import json
import os
import sys

import torch

VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK", "ROLE_WORLD_SIZE",
             "MASTER_ADDR", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "OMP_NUM_THREADS",
             "HASTEN_MIXED_PRECISION", "HASTEN_GRADIENT_ACCUMULATION_STEPS", "HASTEN_AS_ACCELERATE", "HASTEN_USE_CPU")

if sys.argv[1:2] == ["fail"] and os.environ["RANK"] == "1":
    raise ValueError("deliberate failure on rank 1")

from hasten import Accelerator  # noqa: E402

accelerator = Accelerator()
view = {"env": {name: os.environ.get(name) for name in VARIABLES}, "argv": sys.argv,
        "path0": sys.path[0], "name": __name__, "threads": torch.get_num_threads(),
        "processes": accelerator.num_processes, "index": accelerator.process_index,
        "mixed_precision": accelerator.mixed_precision, "accumulation": accelerator.gradient_accumulation_steps,
        "seed": torch.initial_seed(), "cwd": os.getcwd()}
os.write(1, ("VIEW " + json.dumps(view, sort_keys=True) + "\n").encode())  # one write: lines never interleave
