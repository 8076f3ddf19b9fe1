"""Run with `hasten launch --use_deepspeed ...`: each rank prints the DeepSpeed settings it received.

One line per rank, written with ONE os.write so the ranks' lines never interleave:
    rank=R HASTEN_USE_DEEPSPEED=... HASTEN_DEEPSPEED_ZERO_STAGE=...
No Accelerator is built: this checks the launcher only.
"""
import os

NAMES = ("HASTEN_USE_DEEPSPEED", "HASTEN_DEEPSPEED_ZERO_STAGE")

line = " ".join([f"rank={os.environ.get('RANK', '?')}", *(f"{name}={os.environ.get(name, '')}" for name in NAMES)])
os.write(1, (line + "\n").encode())
