"""How right ``hasten plan`` is: each layout run for real on CPU processes (gloo), each rank's peak of live tensor
memory measured exactly (plan_measure.py), against the plan's prediction — and the same grid for Accelerate's
``estimate-memory`` (hasten's, which reproduces it) and DeepSpeed's model-state estimators.

    python bench/bench_plan.py [--processes 2 4] [--layouts ddp fsdp2 zero1 zero2 zero3] [--quick] [--output FILE]

Grid: models (an MLP, tiny GPT-2, Llama and BERT from configs: plan_models.py) x layouts x micro-batch {1, 4} x
precision {fp32, bf16} x activation checkpointing {off, on}, sequence 64, AdamW, three optimizer steps. One
``hasten launch`` per (processes, layout) runs all its cases. Reported: median and 95th percentile of
|predicted - measured| / measured per layout and overall, and the verdict given a budget 5% above and 5% below each
prediction (right when the measured peak is within the first and above the second). DeepSpeed allocates its whole
default gradient bucket (500M elements) on these tiny models, which dominates their peak: the ZeRO rows also show the
error of the rest. Prints Markdown (and writes it to ``--output``).
"""
from __future__ import annotations

import argparse
import fcntl
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(BENCH))
from plan_models import MODELS, blocks, build_model, config, make_batch  # noqa: E402

LOCK = Path(os.environ.get("HASTEN_TEST_LOCK", "/tmp/hasten-multiprocess-tests.lock"))
SEQ_LEN = 64


from hasten.planning.layout_memory import ZERO_BUCKET_ELEMENTS  # noqa: E402


def cases(models, layouts, quick: bool) -> list[dict]:
    grid = itertools.product(models, layouts, (1, 4), ("no", "bf16"), (False, True))
    out = [{"model": m, "layout": layout, "mb": mb, "precision": p, "ac": ac, "seq_len": SEQ_LEN,
            "blocks": blocks(m)} for m, layout, mb, p, ac in grid]
    return out[::3] if quick else out


def measured(processes: int, layout: str, batch: list[dict]) -> list[int]:
    """Each case's highest per-rank peak, from one launch of plan_measure.py."""
    folder = Path(tempfile.mkdtemp(prefix="hasten-bench-plan-"))
    (folder / "cases.json").write_text(json.dumps(batch))
    env = dict(os.environ, OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")])))
    command = [sys.executable, "-m", "hasten", "launch", "-n", str(processes), str(BENCH / "plan_measure.py"),
               str(folder / "cases.json"), str(folder / "peaks.json")]
    with open(LOCK, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        code = subprocess.call(command, env=env, cwd=ROOT)
    if code != 0:
        raise SystemExit(f"measuring {layout} on {processes} processes failed (exit {code})")
    return json.loads((folder / "peaks.json").read_text())


def predicted(processes: int, case: dict) -> int:
    from hasten.planning import plan
    from hasten.planning.model_source import factory_source

    name = case["model"]
    model = factory_source(lambda: build_model(name), lambda mb, seq: make_batch(name, mb, seq), name=name) \
        if name == "mlp" else config(name)
    family = "zero" if case["layout"].startswith("zero") else case["layout"]
    result = plan(model, seq_len=case["seq_len"], micro_batch_size=case["mb"], num_processes=processes,
                  gpu_memory=2 ** 40, mixed_precision=case["precision"], layouts=[family],
                  activation_checkpointing="on" if case["ac"] else "off")
    return result.row(case["layout"]).peak


def reference_estimates(case: dict, processes: int) -> dict:
    """What estimate-memory (Accelerate's formula, float32 Adam training) and DeepSpeed's model-state estimators
    say for the case (None where they do not apply)."""
    from hasten.commands.estimate import estimate

    model = build_model(case["model"])
    row = next(r for r in estimate(model, ["float32"]) if r["dtype"] == "float32")
    out = {"estimate-memory": row["training_adam"], "deepspeed": None}
    if case["layout"].startswith("zero"):
        try:
            from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
            from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs
        except ImportError:
            return out
        params = sum(p.numel() for p in model.parameters())
        if case["layout"] == "zero3":
            largest = max(sum(p.numel() for p in child.parameters()) for child in model.modules()
                          if type(child).__name__ in case["blocks"])
            out["deepspeed"] = estimate_zero3_model_states_mem_needs(params, largest, processes, 1, False, False)[1]
        else:
            out["deepspeed"] = estimate_zero2_model_states_mem_needs(params, processes, 1, False)[1]
    return out


def _errors(pairs: list) -> tuple:
    errors = [abs(p - m) / m for p, m in pairs if p is not None and m]
    if not errors:
        return None, None
    ordered = sorted(errors)
    return statistics.median(ordered), ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]


def main(argv=None) -> list:
    parser = argparse.ArgumentParser()
    parser.add_argument("--processes", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--layouts", nargs="+", default=["ddp", "fsdp2", "zero1", "zero2", "zero3"])
    parser.add_argument("--models", nargs="+", default=list(MODELS))
    parser.add_argument("--quick", action="store_true", help="every third case of the grid")
    parser.add_argument("--output", default=None)
    args = parser.parse_args(argv)
    records = []
    started = time.time()
    for processes in args.processes:
        for layout in args.layouts:
            batch = cases(args.models, [layout], args.quick)
            peaks = measured(processes, layout, batch)
            for case, peak in zip(batch, peaks):
                bucket = ZERO_BUCKET_ELEMENTS * (2 if case["precision"] == "bf16" else 4) \
                    if case["layout"].startswith("zero") else 0
                records.append({**case, "processes": processes, "measured": peak, "bucket": bucket,
                                "predicted": predicted(processes, case), **reference_estimates(case, processes)})
    lines = ["| layout | processes | cases | plan median error | plan p95 error | verdict right | "
             "ZeRO without its bucket: median / p95 | estimate-memory median error | "
             "DeepSpeed estimator median error |", "|---|---|---|---|---|---|---|---|---|"]
    groups = {}
    for record in records:
        groups.setdefault((record["layout"], record["processes"]), []).append(record)
    groups[("all", "all")] = records
    for (layout, processes), group in groups.items():
        median, p95 = _errors([(r["predicted"], r["measured"]) for r in group])
        right = sum((r["measured"] <= 1.05 * r["predicted"]) + (r["measured"] > 0.95 * r["predicted"])
                    for r in group)
        bucket = [(r["predicted"] - r["bucket"], r["measured"] - r["bucket"]) for r in group if r["bucket"]]
        inner, inner_p95 = _errors(bucket)
        reference, _ = _errors([(r["estimate-memory"], r["measured"]) for r in group])
        speed, _ = _errors([(r["deepspeed"], r["measured"]) for r in group])
        lines.append(f"| {layout} | {processes} | {len(group)} | {median:.1%} | {p95:.1%} | "
                     f"{right / (2 * len(group)):.0%} | "
                     f"{'-' if inner is None else f'{inner:.1%} / {inner_p95:.1%}'} | {reference:.0%} | "
                     f"{'-' if speed is None else f'{speed:.0%}'} |")
    text = "\n".join(lines) + f"\n\n({len(records)} runs, {time.time() - started:.0f} s)\n"
    print(text)
    (BENCH / "plan_accuracy.json").write_text(json.dumps(records, indent=1))
    if args.output:
        Path(args.output).write_text(text)
    return [{"benchmark": f"plan accuracy {layout} x{processes}", "variant": "hasten plan",
             "value": line, "ratio": None} for (layout, processes), line in zip(groups, lines[2:])]


if __name__ == "__main__":
    main()
