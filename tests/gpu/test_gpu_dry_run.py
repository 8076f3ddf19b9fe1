"""The GPU check (tests/gpu/run_all.sh) on the CPU with --dry-run, so that its first GPU run is not its first run:
every check reports a status, the comparisons give numbers, the summaries are written, failures set the exit code,
and a check that raises or hangs is reported as failed (the hang killed at its budget) instead of stopping the run.

The two runs start together (about 45 s on two CPU cores); the comparison code is also tested in-process.
"""
from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.append(str(HERE))

import gpu_checks  # noqa: E402

SKIPPED_ON_CPU = {"fp8_torchao": "fp8", "deepspeed": "needs CUDA"}
HAS_REFERENCE = importlib.util.find_spec("accelerate") is not None


def _start(out: Path, *options: str) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k not in ("OUT", "CUDA_VISIBLE_DEVICES")}
    env["PYTHON"] = sys.executable
    return subprocess.Popen(["bash", str(HERE / "run_all.sh"), str(out), *options],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The whole dry run; beside it a dry run where amp_bf16 raises and nccl hangs past a 3 s budget, and a GPU run
    on this machine without a GPU."""
    outs = {name: tmp_path_factory.mktemp(name) for name in ("full", "faults", "no_gpu")}
    started = time.monotonic()
    processes = {"full": _start(outs["full"], "--dry-run"),
                 "faults": _start(outs["faults"], "--dry-run", "--only", "amp_bf16,nccl,deepspeed", "--inject-failure",
                                  "amp_bf16", "--inject-hang", "nccl", "--budget", "nccl=3", "--no-reference"),
                 "no_gpu": _start(outs["no_gpu"], "--only", "nccl")}
    results = {}
    for name, process in processes.items():
        stdout, _ = process.communicate(timeout=240)
        out = outs[name]
        results[name] = {"code": process.returncode, "stdout": stdout, "wall": time.monotonic() - started,
                         "summary": json.loads((out / "summary.json").read_text()) if (out / "summary.json").exists()
                         else None, "markdown": (out / "summary.md").read_text() if (out / "summary.md").exists()
                         else "", "files": sorted(p.name for p in out.iterdir())}
        assert results[name]["summary"] is not None, stdout
    return results


def _rows(run) -> dict:
    return {row["name"]: row for row in run["summary"]["checks"]}


def test_every_check_reports_a_status_and_one_line(runs):
    run = runs["full"]
    rows = _rows(run)
    assert list(rows) == [check.name for check in gpu_checks.CHECKS], run["stdout"]
    lines = run["stdout"].splitlines()
    for name, row in rows.items():
        assert row["status"] in gpu_checks.KNOWN_STATUSES, row
        assert sum(line.split()[:2] == [row["status"], name] for line in lines) == 1, run["stdout"]
    assert lines[-1].startswith("GPU CHECKS: "), run["stdout"]
    assert run["files"] == ["checks.log", "summary.json", "summary.md"]  # at most 8 files come back from a device
    assert run["summary"]["dry_run"] is True and run["summary"]["environment"]["cuda"] is False


def test_the_exit_code_says_whether_a_check_failed(runs):
    run = runs["full"]
    failed = [row for row in run["summary"]["checks"] if row["status"] == "failed"]
    assert run["code"] == (1 if failed else 0) == run["summary"]["exit_code"], run["stdout"]
    assert run["summary"]["counts"]["failed"] == len(failed)


def test_nothing_fails_on_the_cpu(runs):
    """Every check that can run here passes, the FSDP ones included (FSDP on one process: a world of one)."""
    failed = {row["name"]: row["error"] for row in runs["full"]["summary"]["checks"] if row["status"] == "failed"}
    assert not failed, failed


def test_what_cannot_run_on_the_cpu_is_skipped_with_its_reason(runs):
    rows = _rows(runs["full"])
    for name, words in SKIPPED_ON_CPU.items():
        assert rows[name]["status"] == "skipped" and words in rows[name]["reason"], rows[name]
    for row in rows.values():
        if row["status"] == "skipped":
            assert row["reason"], row
        else:
            assert row["seconds"] > 0 and row["budget_s"] == gpu_checks.DRY_CHECK_BUDGET_S


def test_the_comparisons_are_numbers(runs):
    rows = _rows(runs["full"])
    for name in ("amp_bf16", "amp_fp16", "compile", "throughput"):
        ratios = rows[name]["ratios"]
        assert "hasten/plain" in ratios, (name, rows[name])
        assert all(isinstance(v, float) and math.isfinite(v) and v > 0 for v in ratios.values()), (name, ratios)
    assert "hasten_regional/plain_regional" in rows["compile"]["ratios"]
    throughput = rows["throughput"]
    loops = ("hasten", "plain") + (("reference", "plain (reference process)") if HAS_REFERENCE else ())
    for loop in loops:
        figures = throughput["throughput"][loop]
        assert figures["tokens_per_s"] > 0 and 0 <= figures["mfu"] < 1 and figures["step_ms"] > 0, (loop, figures)
    if HAS_REFERENCE:
        assert {"reference/plain", "hasten/reference"} <= set(throughput["ratios"]), throughput["ratios"]
        assert rows["amp_bf16"]["variants"]["reference"]["status"] == "ok", rows["amp_bf16"]["variants"]
    assert {g: v["met"] for g, v in throughput["goals"].items()} == {"hasten/plain": None, "hasten/reference": None}
    assert throughput["metrics"]["first_loss"]["hasten"] == pytest.approx(throughput["metrics"]["first_loss"]["plain"],
                                                                          rel=5e-2)


def test_the_markdown_summary_has_a_row_per_check_and_the_throughput_table(runs):
    text = runs["full"]["markdown"]
    for check in gpu_checks.CHECKS:
        assert f"| {check.name} | " in text
    assert "## Throughput" in text and "| hasten |" in text and "989 TFLOP/s" in text


def test_a_check_that_raises_or_hangs_is_reported_failed_and_the_run_goes_on(runs):
    run = runs["faults"]
    rows = _rows(run)
    assert run["code"] == 1, run["stdout"]
    assert rows["amp_bf16"]["status"] == "failed" and "injected" in rows["amp_bf16"]["error"]
    assert rows["amp_bf16"]["variants"].get("reference", {}).get("status") == "skipped"
    assert rows["nccl"]["status"] == "failed" and rows["nccl"]["error"].startswith("timeout"), rows["nccl"]
    assert 3 <= rows["nccl"]["seconds"] < 15, rows["nccl"]  # killed at its budget, not left to hang
    assert list(rows) == ["amp_bf16", "nccl", "deepspeed"] and rows["deepspeed"]["status"] == "skipped"  # goes on
    assert "## Failures" in run["markdown"] and "timeout" in run["markdown"]


def test_the_gpu_run_without_a_gpu_says_so_and_exits_2(runs):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the run was a real one")
    run = runs["no_gpu"]
    assert run["code"] == 2 and run["summary"]["problem"].startswith("no CUDA device"), run["stdout"]
    assert run["summary"]["checks"] == [] and "no CUDA device" in run["stdout"].splitlines()[-1]


# ------------------------------------------------------------------------------ in-process: the runner's logic
def test_median_speed_ratio_pairs_windows():
    assert gpu_checks.median_speed_ratio([1.0, 2.0, 1.0], [2.0, 2.0, 3.0]) == 2.0  # medians of 2, 1, 3
    assert gpu_checks.median_speed_ratio([], [1.0]) is None


def test_speed_ratios_go_through_the_plain_loop_of_each_process():
    hasten = {"result": {"timings": {"hasten": [1.0, 1.0], "plain": [1.1, 1.1]}}}
    reference = {"result": {"timings": {"reference": [2.0, 2.0], "plain": [2.0, 2.0]}}}
    ratios = gpu_checks.speed_ratios(hasten, reference)
    assert ratios == pytest.approx({"hasten/plain": 1.1, "reference/plain": 1.0, "hasten/reference": 1.1})
    named = {"result": {"timings": {"a": [1.0], "b": [3.0]}, "pairs": {"a/b": ["a", "b"]}}}
    assert gpu_checks.speed_ratios(named, None) == {"a/b": 3.0}


def test_throughput_figures_and_goals():
    variants = {"hasten": {"result": {"timings": {"hasten": [2.0], "plain": [2.0]}, "tokens_per_step": 1000,
                                      "steps_per_window": 10, "params": 10 ** 9}},
                "reference": {"result": {"timings": {"reference": [4.0], "plain": [2.0]}, "tokens_per_step": 1000,
                                         "steps_per_window": 10, "params": 10 ** 9}}}
    figures = gpu_checks.throughput_figures(variants, peak_tflops=1000.0)
    assert figures["hasten"]["tokens_per_s"] == 5000 and figures["hasten"]["mfu"] == pytest.approx(0.03)
    assert figures["reference"]["step_ms"] == 400 and figures["hasten/reference direct"] == 2.0
    check = gpu_checks.BY_NAME["throughput"]
    goals = gpu_checks.judge_goals(check, {"hasten/plain": 0.98, "hasten/reference": 1.2}, dry_run=False)
    assert goals["hasten/plain"]["met"] is False and goals["hasten/reference"]["met"] is True
    assert "GOAL MISSED: hasten/plain 0.980x < 0.99" in gpu_checks.one_line(
        {"name": "throughput", "status": "ok", "seconds": 1.0, "budget_s": 2, "goals": goals})


def test_needs_are_resolved_from_the_probe():
    fp8, deepspeed = gpu_checks.BY_NAME["fp8_torchao"], gpu_checks.BY_NAME["deepspeed"]
    hopper = {"cuda": True, "capability": [9, 0], "modules": {"torchao": "0.18.0", "deepspeed": None}}
    assert gpu_checks.unmet_need(fp8, hopper, dry_run=False) is None
    assert "sm_80" in gpu_checks.unmet_need(fp8, dict(hopper, capability=[8, 0]), dry_run=False)
    assert "deepspeed is not installed" in gpu_checks.unmet_need(deepspeed, hopper, dry_run=False)
    assert "dry run" in gpu_checks.unmet_need(fp8, hopper, dry_run=True)


def test_bad_arguments_are_refused(capsys):
    for argv in (["--only", "nope"], ["--budget", "throughput"], ["--budget", "nope=3"]):
        with pytest.raises(SystemExit) as exit_info:
            gpu_checks.parse_args(argv)
        assert exit_info.value.code == 2
    assert gpu_checks.main(["--list"]) == 0
    assert "throughput" in capsys.readouterr().out
    args = gpu_checks.parse_args(["--dry-run", "--budget", "nccl=3", "--budget", "throughput.reference=9", "x"])
    assert args.budgets == {"nccl": 3.0, "throughput.reference": 9.0}
    assert args.total_budget == 240 and args.jobs == 2 and str(args.out) == "x"
