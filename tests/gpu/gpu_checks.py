"""Every CUDA path of hasten on one GPU, measured side by side with plain PyTorch and the reference library.

    bash tests/gpu/run_all.sh [OUT_DIR]            # on a machine with one CUDA GPU (at most 8 minutes)
    bash tests/gpu/run_all.sh --dry-run [OUT_DIR]  # anywhere: the same logic on the CPU, tiny sizes

Each check of the table ``CHECKS`` runs in a process of its own (forked from a server that imported torch once),
killed with its children when it passes its time budget, so a CUDA crash or a hung collective costs one check,
never the run. A check that compares with the reference library runs that loop in a second process (hasten and
the reference never share a process's global state); speed ratios are medians of per-window ratios measured in
the same process as the plain PyTorch loop (see ``gpu_common.alternate``). One line is printed per check; the
summaries go to OUT_DIR (``$OUT`` when set): ``summary.json``, ``summary.md`` and ``checks.log`` (each check's
output). The exit code is 1 when a check failed, 0 otherwise.

This file is the runner only: the registry, the process handling, the comparisons and the summaries. It imports
neither torch nor hasten; the checks live in ``check_*.py`` beside it.
"""
from __future__ import annotations

import argparse
import datetime
import importlib
import json
import math
import multiprocessing
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
GPU_TOTAL_BUDGET_S = 470.0   # the whole GPU run, the server's start included, stays under 8 minutes
DRY_TOTAL_BUDGET_S = 240.0
DRY_CHECK_BUDGET_S = 60.0    # per process in the dry run (the CPU may be shared)
PEAK_BF16_TFLOPS = 989.0     # H100/H200 SXM dense bf16, datasheet (KINDS.md measured ~790 on random data)
KNOWN_STATUSES = ("ok", "failed", "skipped")


@dataclass(frozen=True)
class Check:
    """One row of the registry. ``target`` ("module:function") runs in the check's own process and returns a
    dict (``gpu_common`` documents it); ``budget_s`` is its wall-clock limit on the GPU, ``reference_s``
    (when > 0) that of the same loop run with the reference library; ``needs`` lists what must be present:
    ``cuda`` (the check has no CPU form, so the dry run skips it), ``fp8`` (compute capability 8.9+), or the
    name of an optional module."""

    name: str
    target: str
    proves: str
    budget_s: float
    reference_s: float = 0.0
    needs: tuple = ()
    goals: tuple = ()  # (ratio name, minimum): judged on the GPU run, reported (not failed) when missed


CHECKS = (
    Check("throughput", "check_gpu_throughput:throughput",
          "a ~1B Llama, seq 2048, bf16, FSDP2 on one GPU + regional compile: tokens/s and MFU through hasten, "
          "by hand in plain PyTorch and through the reference library",
          budget_s=200, reference_s=120, goals=(("hasten/plain", 0.99), ("hasten/reference", 1.0))),
    Check("amp_bf16", "check_gpu_training:amp_bf16",
          "bf16 autocast: the same losses as torch.autocast by hand, at the same speed",
          budget_s=25, reference_s=20),
    Check("amp_fp16", "check_gpu_training:amp_fp16",
          "fp16 with the gradient scaler: an overflow step is skipped, the scheduler held, the weights equal a "
          "hand-written GradScaler loop", budget_s=25, reference_s=20),
    Check("fp8_torchao", "check_gpu_training:fp8_torchao",
          "fp8 training through torchao: the loss stays close to bf16 over 50 steps",
          budget_s=40, needs=("fp8", "torchao")),
    Check("compile", "check_gpu_training:compile_full_and_regional",
          "torch.compile and regional compilation: the same losses as eager, the speed of torch.compile by hand",
          budget_s=75),
    Check("nccl", "check_gpu_training:nccl_world_of_one",
          "a process group on a world of one (NCCL on CUDA): hasten adopts it and its collectives are exact",
          budget_s=20),
    Check("fsdp2", "check_gpu_sharded:fsdp2",
          "FSDP2 on one process: trains like the unsharded model, a sharded async save from device tensors, an "
          "exact resume", budget_s=30),
    Check("fsdp1", "check_gpu_sharded:fsdp1",
          "FSDP1 on one process: trains like the unsharded model, saves and resumes exactly", budget_s=30),
    Check("fsdp2_cpu_offload", "check_gpu_sharded:fsdp2_cpu_offload",
          "FSDP2 with CPU offload: shards in pinned CPU memory, trains like the unsharded model", budget_s=30),
    Check("deepspeed", "check_gpu_sharded:deepspeed_zero",
          "DeepSpeed ZeRO-2 fp16 and ZeRO-3 bf16 on one GPU, with exact resume", budget_s=60,
          needs=("cuda", "deepspeed")),
    Check("plan", "check_gpu_plan:plan_vs_allocated",
          "hasten plan's peak per rank for DDP of one, FSDP2 and ZeRO-3 of a ~1B Llama against "
          "torch.cuda.max_memory_allocated over three steps; the allocator's overhead and the CUDA context",
          budget_s=120),
    Check("bnb_8bit", "check_gpu_inference:bnb_8bit",
          "bitsandbytes 8-bit loading: int8 linear layers, logits close to the float model, generation",
          budget_s=25, needs=("bitsandbytes",)),
    Check("bnb_4bit", "check_gpu_inference:bnb_4bit",
          "bitsandbytes 4-bit (nf4) loading: 4-bit linear layers, logits close to the float model, generation",
          budget_s=25, needs=("bitsandbytes",)),
    Check("big_model_dispatch", "check_gpu_inference:big_model_dispatch",
          "big-model dispatch over GPU + CPU + disk: the same logits and tokens as the model loaded whole",
          budget_s=25),
)
BY_NAME = {check.name: check for check in CHECKS}


# ============================================================================================ child processes
def _child(target: str, ctx: dict, result_path: str, log_path: str, inject: str | None) -> None:
    """Body of a check's process: its own process group (so a timeout kills its helpers too), its output in its
    log, its outcome as JSON in ``result_path``."""
    os.setsid()
    log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    sys.stdout = open(1, "w", buffering=1, closefd=False)
    sys.stderr = open(2, "w", buffering=1, closefd=False)
    started = time.perf_counter()
    try:
        if inject == "fail":
            raise RuntimeError("failure injected by --inject-failure")
        if inject == "hang":
            time.sleep(10 ** 6)
        module, function = target.split(":")
        common = importlib.import_module("gpu_common")
        result = getattr(importlib.import_module(module), function)(common.Ctx(**ctx)) or {}
        failed = result.pop("failed", None)
        outcome = {"status": "failed" if failed else "ok", "error": failed, "result": result}
    except BaseException as error:  # everything a check raises is its outcome
        if type(error).__name__ == "Skip":
            outcome = {"status": "skipped", "reason": str(error)}
        else:
            outcome = {"status": "failed", "error": f"{type(error).__name__}: {error}",
                       "traceback": traceback.format_exc()}
        traceback.print_exc()
    outcome["check_s"] = time.perf_counter() - started
    sys.stdout.flush()
    sys.stderr.flush()
    Path(result_path + ".tmp").write_text(json.dumps(outcome, default=str))
    os.replace(result_path + ".tmp", result_path)
    os._exit(0)  # done: no interpreter shutdown that a leftover thread or process group could hold up


class Runner:
    """Starts one process per check variant and keeps the run inside its total budget."""

    def __init__(self, args, work: Path, checks: int):
        self.args, self.work = args, work
        self.deadline = time.monotonic() + args.total_budget
        self.use_forkserver(heavy=checks > 3)
        (work / "logs").mkdir(parents=True, exist_ok=True)
        self.logs: list = []

    def use_forkserver(self, heavy: bool) -> None:
        """Children forked from a server that imported torch (and, for a run of several checks, dynamo) once:
        seconds saved per check. The server never touches CUDA (imports only; they do not call torch.cuda), so each
        child initialises its own."""
        os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")  # is_available() without initialising CUDA
        self.mp = multiprocessing.get_context("forkserver")
        preload = ["torch", "torch._dynamo"] if heavy else ["torch"]
        if heavy and self.args.dry_run:  # on the CPU only: its import looks for CUDA, which a child must do itself
            preload.append("bitsandbytes")
        self.mp.set_forkserver_preload(preload)

    def use_spawn(self) -> None:
        """Fresh interpreters: the fallback when a forked child finds CUDA unusable."""
        self.mp = multiprocessing.get_context("spawn")

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def run(self, name: str, variant: str, target: str, timeout: float, inputs: dict | None = None,
            inject: str | None = None) -> dict:
        """Run ``target`` in a fresh process for at most ``timeout`` seconds; returns its outcome."""
        folder = self.work / name / variant
        folder.mkdir(parents=True, exist_ok=True)
        result_path, log_path = str(folder / "result.json"), str(self.work / "logs" / f"{name}.{variant}.log")
        self.logs.append((f"{name} ({variant})", log_path))
        ctx = dict(name=name, variant=variant, dry_run=self.args.dry_run, device="cpu" if self.args.dry_run else "cuda",
                   work_dir=str(folder), inputs=inputs or {})
        process = self.mp.Process(target=_child, args=(target, ctx, result_path, log_path, inject), daemon=True)
        started = time.monotonic()
        process.start()
        try:
            process.join(timeout)
        finally:
            if process.is_alive():
                _kill_group(process.pid)
                process.join(10)
        seconds = time.monotonic() - started
        if os.path.exists(result_path):
            return dict(json.loads(Path(result_path).read_text()), seconds=seconds)  # wall time, the start included
        if seconds >= timeout:
            return {"status": "failed", "error": f"timeout: still running after its budget of {timeout:.0f} s "
                                                 "(killed with its process group)", "seconds": seconds}
        code = process.exitcode
        how = f"killed by signal {-code}" if code is not None and code < 0 else f"exit code {code}"
        return {"status": "failed", "error": f"crashed ({how}) before reporting; see checks.log", "seconds": seconds,
                "log_tail": _tail(log_path, 15)}


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _tail(path: str, lines: int) -> str:
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


# ============================================================================================ one check
def unmet_need(check: Check, probe: dict, dry_run: bool) -> str | None:
    """Why ``check`` cannot run here (the skip reason), or None."""
    for need in check.needs:
        if need == "cuda" and (dry_run or not probe.get("cuda")):
            return "needs CUDA (the dry run is on the CPU)" if dry_run else "needs CUDA: no CUDA device here"
        if need == "fp8":
            capability = probe.get("capability") or [0, 0]
            if dry_run or not probe.get("cuda") or tuple(capability) < (8, 9):
                where = "the dry run is on the CPU" if dry_run else f"this GPU is sm_{capability[0]}{capability[1]}"
                return f"needs a GPU with fp8 (compute capability 8.9+; {where})"
        if need not in ("cuda", "fp8") and not probe.get("modules", {}).get(need):
            return f"{need} is not installed (carry its wheel in .whl: tests/gpu/README.md)"
    return None


def run_check(check: Check, runner: Runner, probe: dict) -> dict:
    """Run a check's variants and compare them; returns its summary row."""
    args = runner.args
    row = {"name": check.name, "proves": check.proves, "status": "skipped", "seconds": 0.0}
    budget = args.budgets.get(check.name, DRY_CHECK_BUDGET_S if args.dry_run else check.budget_s)
    row["budget_s"] = budget
    reason = unmet_need(check, probe, args.dry_run)
    if reason is None and runner.left() < 5:
        reason = f"no time left in the run's total budget of {args.total_budget:.0f} s"
    if reason is not None:
        row["reason"] = reason
        return row
    inject = "fail" if check.name in args.inject_failure else "hang" if check.name in args.inject_hang else None
    hasten = runner.run(check.name, "hasten", check.target, min(budget, runner.left()), inject=inject)
    variants = {"hasten": hasten}
    if check.reference_s:
        variants["reference"] = _reference(check, runner, probe, hasten)
    row.update(summarize(check, variants, dry_run=args.dry_run))
    row["seconds"] = sum(v.get("seconds", 0.0) for v in variants.values())
    return row


def _reference(check: Check, runner: Runner, probe: dict, hasten: dict) -> dict:
    args = runner.args
    if args.no_reference:
        return {"status": "skipped", "reason": "--no-reference"}
    if not probe.get("modules", {}).get("accelerate"):
        return {"status": "skipped", "reason": "the reference library (accelerate) is not installed"}
    if not hasten.get("result"):
        return {"status": "skipped", "reason": "the hasten variant gave no figures to compare with"}
    budget = args.budgets.get(check.name + ".reference", DRY_CHECK_BUDGET_S if args.dry_run else check.reference_s)
    if runner.left() < 5:
        return {"status": "skipped", "reason": "no time left in the run's total budget"}
    return runner.run(check.name, "reference", check.target, min(budget, runner.left()),
                      inputs=hasten["result"].get("for_reference", {}))


# ============================================================================================ comparisons
def median_speed_ratio(times_a: list, times_b: list) -> float | None:
    """How much faster a ran than b: the median over paired windows of time_b / time_a (> 1: a is faster)."""
    pairs = [(a, b) for a, b in zip(times_a or [], times_b or []) if a and b and a > 0 and b > 0]
    return statistics.median(b / a for a, b in pairs) if pairs else None


def speed_ratios(hasten: dict, reference: dict | None) -> dict:
    """``hasten/plain`` (or the pairs the check names), ``reference/plain`` from the reference's process, and
    ``hasten/reference`` through the plain loop that ran beside each (the two processes ran one after the other)."""
    ratios = {}
    result = hasten.get("result") or {}
    timings = result.get("timings") or {}
    pairs = result.get("pairs") or {f"{loop}/plain": [loop, "plain"] for loop in timings
                                     if loop != "plain" and "plain" in timings}
    for name, (a, b) in pairs.items():
        ratios[name] = median_speed_ratio(timings.get(a), timings.get(b))
    ref_timings = ((reference or {}).get("result") or {}).get("timings") or {}
    if "reference" in ref_timings and "plain" in ref_timings:
        ratios["reference/plain"] = median_speed_ratio(ref_timings["reference"], ref_timings["plain"])
        if ratios.get("hasten/plain") and ratios["reference/plain"]:
            ratios["hasten/reference"] = ratios["hasten/plain"] / ratios["reference/plain"]
    return {name: value for name, value in ratios.items() if value is not None}


def throughput_figures(variants: dict, peak_tflops: float) -> dict:
    """tokens/s (median window) and MFU = 6 * N * tokens/s / peak of every loop that the throughput check timed."""
    figures = {}
    for variant in variants.values():
        result = variant.get("result") or {}
        tokens, params = result.get("tokens_per_step"), result.get("params")
        steps = result.get("steps_per_window")
        for loop, times in (result.get("timings") or {}).items():
            if not (tokens and steps and times):
                continue
            key = loop if loop != "plain" or variant is variants["hasten"] else "plain (reference process)"
            tokens_per_s = statistics.median(tokens * steps / t for t in times)
            figures[key] = {"tokens_per_s": tokens_per_s, "mfu": 6 * params * tokens_per_s / (peak_tflops * 1e12),
                            "step_ms": 1000 * statistics.median(times) / steps}
    if "hasten" in figures and "reference" in figures:
        figures["hasten/reference direct"] = figures["hasten"]["tokens_per_s"] / figures["reference"]["tokens_per_s"]
    return figures


def judge_goals(check: Check, ratios: dict, dry_run: bool) -> dict:
    """Each goal with its value; ``met`` is None in the dry run (tiny sizes on a CPU say nothing of speed)."""
    goals = {}
    for name, minimum in check.goals:
        value = ratios.get(name)
        goals[name] = {"goal": minimum, "value": value,
                       "met": None if dry_run or value is None else bool(value >= minimum)}
    return goals


def summarize(check: Check, variants: dict, dry_run: bool) -> dict:
    """A check's status, one-line detail, ratios, goals and figures, from its variants' outcomes."""
    hasten = variants["hasten"]
    reference = variants.get("reference")
    result = hasten.get("result") or {}
    row = {"status": hasten["status"], "detail": result.get("detail", ""), "metrics": result.get("metrics", {}),
           "ratios": speed_ratios(hasten, reference), "variants": {}}
    for key in ("error", "reason", "traceback", "log_tail"):
        if hasten.get(key):
            row[key] = hasten[key]
    if check.name == "throughput":
        row["throughput"] = throughput_figures(variants, PEAK_BF16_TFLOPS)
        row["peak_tflops"] = PEAK_BF16_TFLOPS
    row["goals"] = judge_goals(check, row["ratios"], dry_run)
    for name, variant in variants.items():
        row["variants"][name] = {k: variant.get(k) for k in ("status", "seconds", "error", "reason") if variant.get(k)}
        if name != "hasten":
            row["variants"][name]["detail"] = (variant.get("result") or {}).get("detail", "")
    return row


# ============================================================================================ summaries
def format_ratio(value) -> str:
    return f"{value:.3f}x" if isinstance(value, (int, float)) and math.isfinite(value) else "n/a"


def one_line(row: dict) -> str:
    """The line printed for a check: status, name, time / budget, ratios, goals, then what it showed."""
    parts = [f"{row['status']:<7} {row['name']:<19} {row['seconds']:6.1f}s/{row['budget_s']:.0f}s"]
    ratios = "  ".join(f"{k} {format_ratio(v)}" for k, v in row.get("ratios", {}).items())
    if ratios:
        parts.append(ratios)
    missed = [f"{k} {format_ratio(g['value'])} < {g['goal']}" for k, g in row.get("goals", {}).items()
              if g["met"] is False]
    if missed:
        parts.append("GOAL MISSED: " + ", ".join(missed))
    text = row.get("error") or row.get("reason") or ""
    detail = row.get("detail") or ""
    parts.append(" | ".join(p for p in (detail, text) if p))
    reference = row.get("variants", {}).get("reference", {})
    if reference.get("status") in ("failed", "skipped"):
        parts.append(f"[reference {reference['status']}: {reference.get('error') or reference.get('reason')}]")
    return "  ".join(p for p in parts if p)


def write_summaries(out: Path, summary: dict, logs: list) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    (out / "summary.md").write_text(markdown(summary))
    with open(out / "checks.log", "w") as handle:  # one file: at most 8 come back from a device run
        for title, path in logs:
            handle.write(f"===== {title} =====\n{_tail(path, 300)}\n\n")


def markdown(summary: dict) -> str:
    env = summary["environment"]
    lines = [f"# hasten GPU checks{' (dry run on the CPU)' if summary['dry_run'] else ''}", "",
             f"{summary['started']} · {env.get('device_name', 'cpu')} · torch {env.get('torch')} · "
             f"hasten {env.get('hasten')} from `{env.get('hasten_path')}` · reference accelerate "
             f"{env.get('modules', {}).get('accelerate') or 'not installed'} · {summary['wall_s']:.0f} s of "
             f"{summary['total_budget_s']:.0f} s · " + ", ".join(f"{n} {k}" for k, n in summary["counts"].items()), "",
             f"**{summary['problem']}**" if summary.get("problem") else "",
             "| check | status | seconds (budget) | ratios | result |", "| --- | --- | --- | --- | --- |"]
    for row in summary["checks"]:
        ratios = ", ".join(f"{k} {format_ratio(v)}" for k, v in row.get("ratios", {}).items())
        result = " — ".join(str(row[k]) for k in ("detail", "error", "reason") if row.get(k))
        lines.append(f"| {row['name']} | {row['status']} | {row['seconds']:.1f} ({row['budget_s']:.0f}) | "
                     f"{ratios} | {result.replace('|', '/')} |")
    for row in summary["checks"]:
        if row.get("throughput"):
            layout = row.get("metrics", {}).get("layout", "?")
            lines += ["", f"## Throughput ({layout} layout; MFU = 6 x N x tokens/s / {row['peak_tflops']:.0f} TFLOP/s, "
                          "the datasheet's dense bf16 peak)", "", row.get("detail", ""), "",
                      "| loop | tokens/s | MFU | ms/step |", "| --- | --- | --- | --- |"]
            for loop, fig in row["throughput"].items():
                if isinstance(fig, dict):
                    lines.append(f"| {loop} | {fig['tokens_per_s']:.0f} | {100 * fig['mfu']:.2f}% | "
                                 f"{fig['step_ms']:.1f} |")
            direct = row["throughput"].get("hasten/reference direct")
            if direct:
                lines.append(f"\nhasten/reference from the two processes' tokens/s directly: {format_ratio(direct)} "
                             "(the goal below is judged through each process's plain loop).")
            for name, goal in row.get("goals", {}).items():
                verdict = {True: "met", False: "MISSED", None: "not judged (dry run)"}[goal["met"]]
                lines.append(f"\nGoal {name} >= {goal['goal']}: {format_ratio(goal['value'])}, {verdict}.")
    failures = [row for row in summary["checks"] if row["status"] == "failed"]
    if failures:
        lines += ["", "## Failures", ""]
        for row in failures:
            where = "\n".join((row.get("traceback") or "").strip().splitlines()[-7:-1])  # the innermost frames
            lines += [f"### {row['name']}", "", row.get("error", ""), "", "```", where or "(no traceback)", "```", ""]
    return "\n".join(lines) + "\n"


# ============================================================================================ the run
def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", nargs="?", help="folder for summary.json, summary.md, checks.log (default: $OUT, "
                                               "else ./gpu-checks-out)")
    parser.add_argument("--dry-run", action="store_true", help="run every check's logic on the CPU, tiny sizes")
    parser.add_argument("--only", default="", help="comma-separated checks to run (default: all)")
    parser.add_argument("--skip", default="", help="comma-separated checks not to run")
    parser.add_argument("--budget", action="append", default=[], metavar="NAME=SECONDS",
                        help="override a check's time budget (NAME.reference for its reference variant)")
    parser.add_argument("--total-budget", type=float, default=None,
                        help=f"seconds for the whole run (default {GPU_TOTAL_BUDGET_S:.0f}, "
                             f"dry run {DRY_TOTAL_BUDGET_S:.0f})")
    parser.add_argument("--no-reference", action="store_true", help="do not run the reference library's variants")
    parser.add_argument("--jobs", type=int, default=None,
                        help="checks run at once (default 1 on the GPU, where timings must not overlap; "
                             "2 in the dry run)")
    parser.add_argument("--keep-work", action="store_true", help="keep the checks' scratch folder (logs, checkpoints)")
    parser.add_argument("--list", action="store_true", help="list the checks and exit")
    parser.add_argument("--inject-failure", default="", help=argparse.SUPPRESS)  # tests: this check raises
    parser.add_argument("--inject-hang", default="", help=argparse.SUPPRESS)     # tests: this check never returns
    args = parser.parse_args(argv)
    def names(text: str) -> list:
        return [n for n in text.split(",") if n]

    for option in ("only", "skip", "inject_failure", "inject_hang"):
        unknown = [n for n in names(getattr(args, option)) if n not in BY_NAME]
        if unknown:
            parser.error(f"--{option.replace('_', '-')}: unknown check(s) {unknown}; the checks: {sorted(BY_NAME)}")
        setattr(args, option, names(getattr(args, option)))
    args.budgets = {}
    for item in args.budget:
        name, _, seconds = item.partition("=")
        if name.split(".")[0] not in BY_NAME or not seconds.replace(".", "", 1).isdigit():
            parser.error(f"--budget {item!r}: write NAME=SECONDS with NAME one of {sorted(BY_NAME)}")
        args.budgets[name] = float(seconds)
    if args.total_budget is None:
        args.total_budget = DRY_TOTAL_BUDGET_S if args.dry_run else GPU_TOTAL_BUDGET_S
    if args.jobs is None:
        args.jobs = 2 if args.dry_run else 1
    args.out = Path(args.out or os.environ.get("OUT") or "gpu-checks-out")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.list:
        for check in CHECKS:
            reference = f" + {check.reference_s:.0f}s ref" if check.reference_s else ""
            print(f"{check.name:<19} {check.budget_s:>4.0f}s{reference:<11} {check.proves}")
        return 0
    if args.dry_run:
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # the dry run is the CPU run, also on a GPU machine
    sys.path.insert(0, str(HERE))
    work = Path(tempfile.mkdtemp(prefix="hasten-gpu-checks-"))
    try:
        return run_all(args, work)
    finally:
        if not args.keep_work:
            shutil.rmtree(work, ignore_errors=True)


def run_all(args, work: Path) -> int:
    """The probe, then every selected check in the registry's order; the summaries; the exit code."""
    started, wall = datetime.datetime.now().isoformat(timespec="seconds"), time.monotonic()
    selected = [c for c in CHECKS if (not args.only or c.name in args.only) and c.name not in args.skip]
    runner = Runner(args, work, checks=len(selected))
    print(f"hasten GPU checks{' (dry run on the CPU)' if args.dry_run else ''}: scratch {work}, summaries in "
          f"{args.out}, total budget {args.total_budget:.0f} s", flush=True)
    probe = runner.run("probe", "hasten", "gpu_common:probe", 120)
    if (probe.get("result") or {}).get("bad_fork"):
        print("CUDA is unusable in forked children: starting each check in a fresh interpreter", flush=True)
        runner.use_spawn()
        probe = runner.run("probe", "hasten", "gpu_common:probe", 120)
    environment = probe.get("result") or {}
    print(f"environment: {environment.get('line') or probe.get('error')}", flush=True)
    problem = (f"the probe failed ({probe.get('error')}): nothing was checked" if probe["status"] != "ok" else
               "no CUDA device here: run with --dry-run on a machine without a GPU"
               if not args.dry_run and not environment.get("cuda") else None)
    rows = []
    if problem is None:
        with ThreadPoolExecutor(max_workers=args.jobs) as pool:  # one at a time on the GPU: timings side by side
            for future in [pool.submit(run_check, check, runner, environment) for check in selected]:
                rows.append(future.result())
                print(one_line(rows[-1]), flush=True)
    counts = {status: sum(r["status"] == status for r in rows) for status in KNOWN_STATUSES}
    code = 2 if problem else 1 if counts["failed"] else 0
    summary = {"schema": 1, "dry_run": args.dry_run, "started": started, "wall_s": time.monotonic() - wall,
               "total_budget_s": args.total_budget, "exit_code": code, "counts": counts, "problem": problem,
               "environment": environment, "checks": rows}
    write_summaries(args.out, summary, runner.logs)
    print(problem or f"GPU CHECKS: {counts['ok']} ok, {counts['failed']} failed, {counts['skipped']} skipped in "
                     f"{summary['wall_s']:.0f} s -> {args.out}/summary.md", flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
