"""How right ``hasten plan`` is: each layout run for real on CPU processes (gloo), each rank's peak of live tensor
memory measured exactly (plan_measure.py), against the plan's prediction — and the same grid for Accelerate's
``estimate-memory`` (hasten's, which reproduces it) and DeepSpeed's model-state estimators.

    python bench/bench_plan.py [--processes 2 4] [--layouts ddp fsdp2 fsdp1 hsdp zero tp fsdp2_tp cp] [--quick]
                               [--output FILE]

Grid: models (an MLP, tiny GPT-2, Llama and BERT from configs: plan_models.py) x every valid layout of the families
(ZeRO 0-3; tensor parallelism and FSDP2 x TP where the model has a tensor-parallel plan and the degree divides its
heads; context parallelism for the models with attention and without attention dropout; HSDP at 4 processes as 2
machines of 2) x micro-batch {1, 4} x precision {fp32, bf16} x activation checkpointing {off, on}, sequence 64,
AdamW, three optimizer steps. Offload layouts are not measured: on CPU processes the device and the host are the
same memory, so the split the plan predicts cannot be seen. One
``hasten launch`` per (processes, family) runs all its cases. Reported: median and 95th percentile of
|predicted - measured| / measured per layout and overall, and the verdict given a budget 5% above and 5% below each
prediction (right when the measured peak is within the first and above the second). DeepSpeed allocates its whole
default gradient bucket (500M elements) on these tiny models, which dominates their peak: the ZeRO rows also show the
error of the rest. Prints Markdown (and writes it to ``--output``); every record is kept in plan_accuracy.json, where
a call replaces the records of the (processes, family) pairs it measures and keeps the others (``--report``: the
table of the stored records, nothing measured; ``--report --repredict``: their predictions made again).
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


#: the layouts measured, as plan families; offload is not (see the module docstring)
MEASURED = ("ddp", "fsdp2", "fsdp1", "hsdp", "zero", "tp", "fsdp2_tp", "cp")


def _machines(family: str) -> int:
    return 2 if family == "hsdp" else 1  # HSDP replicates across machines: two of half the processes each


def cases(models, family: str, processes: int, quick: bool) -> list[dict]:
    """The grid's cases of one family at ``processes``: each valid layout of it (the plan says which; offload
    layouts left out) x model x micro-batch x precision x activation checkpointing (every third with ``quick``)."""
    from hasten.planning.layouts import candidate_layouts, why_invalid

    if family == "hsdp" and processes < 4:
        return []  # one shard per machine would be plain replication
    out = []
    for layout in candidate_layouts(processes, _machines(family), [family]):
        if layout.offload_optimizer or layout.offload_parameters:
            continue
        for m, mb, p, ac in itertools.product(models, (1, 4), ("no", "bf16"), (False, True)):
            if family == "cp" and m == "mlp":
                continue  # no attention: context parallelism has nothing to do there
            if why_invalid(layout, _source(m), SEQ_LEN) is None:
                out.append({"model": m, "layout": layout.name, "family": family, "zero_stage": layout.zero_stage,
                            "tp": layout.tp, "cp": layout.cp, "processes": processes, "mb": mb, "precision": p,
                            "ac": ac, "seq_len": SEQ_LEN, "blocks": blocks(m)})
    return out[::3] if quick else out


def _source(name: str):
    from hasten.planning.model_source import factory_source, transformers_source

    if name == "mlp":
        return factory_source(lambda: build_model(name), lambda mb, seq: make_batch(name, mb, seq), name=name)
    return transformers_source(config(name))


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
        raise RuntimeError(f"measuring {layout} on {processes} processes failed (exit {code})")
    return json.loads((folder / "peaks.json").read_text())


def predicted(case: dict) -> int:
    from hasten.planning import plan

    result = plan(_source(case["model"]), seq_len=case["seq_len"], micro_batch_size=case["mb"],
                  num_processes=case["processes"], num_machines=_machines(case["family"]), gpu_memory=2 ** 40,
                  mixed_precision=case["precision"], layouts=[case["family"]],
                  activation_checkpointing="on" if case["ac"] else "off")
    return result.row(case["layout"]).peak


def _bucket(case: dict) -> int:
    """Bytes of DeepSpeed's gradient bucket in the case (stages 1-3 allocate it whole; stage 0 has none)."""
    if case["family"] != "zero" or not case.get("zero_stage"):
        return 0
    return ZERO_BUCKET_ELEMENTS * (2 if case["precision"] == "bf16" else 4)


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
    parser.add_argument("--layouts", nargs="+", default=list(MEASURED), choices=MEASURED)
    parser.add_argument("--models", nargs="+", default=list(MODELS))
    parser.add_argument("--quick", action="store_true", help="every third case of the grid")
    parser.add_argument("--output", default=None)
    parser.add_argument("--report", action="store_true", help="measure nothing: the table of plan_accuracy.json")
    parser.add_argument("--repredict", action="store_true",
                        help="with --report: predict the stored records again with the planner as it is now")
    args = parser.parse_args(argv)
    store = BENCH / "plan_accuracy.json"
    earlier = json.loads(store.read_text()) if store.exists() else []
    if args.report and args.repredict:
        for record in _with_earlier([], earlier):
            record["predicted"], record["bucket"] = predicted(record), _bucket(record)
    records = []
    started = time.time()
    for processes in [] if args.report else args.processes:
        for family in args.layouts:
            batch = cases(args.models, family, processes, args.quick)
            if not batch:
                continue
            try:
                peaks = measured(processes, family, batch)
            except RuntimeError as error:  # the other families still run; this one keeps its earlier records
                print(error, file=sys.stderr)
                continue
            for case, peak in zip(batch, peaks):
                records.append({**case, "measured": peak, "bucket": _bucket(case), "predicted": predicted(case),
                                **reference_estimates(case, processes)})
            store.write_text(json.dumps(_with_earlier(records, earlier), indent=1))  # kept as it goes
    records = _with_earlier(records, earlier)
    store.write_text(json.dumps(records, indent=1))
    groups, lines = _table(records)
    text = "\n".join(lines) + f"\n\n({len(records)} runs; this call measured for {time.time() - started:.0f} s)\n"
    print(text)
    if args.output:
        Path(args.output).write_text(text)
    return [{"benchmark": f"plan accuracy {layout} x{processes}", "variant": "hasten plan",
             "value": line, "ratio": None} for (layout, processes), line in zip(groups, lines[2:])]


def _with_earlier(records: list, earlier: list) -> list:
    """This call's records, and those of plan_accuracy.json for the (processes, family) pairs it did not measure."""
    for record in earlier:  # records from before the family field
        record.setdefault("family", "zero" if record["layout"].startswith("zero") else record["layout"])
    measured_now = {(r["processes"], r["family"]) for r in records}
    kept = [r for r in earlier if (r["processes"], r["family"]) not in measured_now]
    return sorted(kept + records, key=lambda r: (MEASURED.index(r["family"]), r["layout"], r["processes"]))


def _table(records: list) -> tuple:
    lines = ["| layout | processes | cases | plan median error | plan p95 error | verdict right | "
             "ZeRO without its bucket: median / p95 | estimate-memory median error | "
             "DeepSpeed estimator median error |", "|---|---|---|---|---|---|---|---|---|"]
    groups: dict = {}
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
    return groups, lines


if __name__ == "__main__":
    main()
