"""A small side-by-side benchmark harness.

One workload, several named variants (usually "torch" — plain PyTorch, the baseline — "hasten", and
"accelerate" when the reference library is installed). The variants run in turns (round-robin), so a
machine that gets slower or faster during the run affects them all alike; each is repeated, the
median is reported with the ratio to the baseline's median.

    from harness import compare
    rows = compare("gather 1 MiB", {"torch": run_torch, "hasten": run_hasten, "accelerate": run_acc})

A variant is a callable with no arguments. It is timed from the outside, unless it returns a number:
then that number (seconds) is its time, for workloads that must time only part of what they do.
A variant given as ``None`` is reported as unavailable (e.g. the reference library is not installed).
``BENCH_REPEATS`` in the environment overrides the number of repetitions (``run_all.py --repeats``).
"""
from __future__ import annotations

import importlib.util
import os
import statistics
import time
from typing import Any, Callable, Mapping, Optional

__all__ = ["compare", "format_table", "to_markdown", "is_installed", "measure"]


def is_installed(module: str) -> bool:
    """Whether ``module`` can be imported (without importing it)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def measure(function: Callable[[], Any]) -> float:
    """Seconds one call of ``function`` took (or the seconds it returned)."""
    start = time.perf_counter()
    result = function()
    elapsed = time.perf_counter() - start
    if isinstance(result, (int, float)) and not isinstance(result, bool):
        return float(result)
    return elapsed


def compare(benchmark: str, variants: Mapping[str, Optional[Callable[[], Any]]], *, repeats: int = 5,
            warmup: int = 1, baseline: str = "torch", show: bool = True) -> list:
    """Time every variant ``repeats`` times (after ``warmup`` untimed calls); print and return the rows.

    Each row: ``benchmark``, ``variant``, ``median_s``, ``min_s``, ``repeats``, ``ratio`` (median over the
    baseline's median, ``None`` without a baseline) and ``note``.
    """
    repeats = int(os.environ.get("BENCH_REPEATS", repeats))
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}.")
    runnable = {name: fn for name, fn in variants.items() if fn is not None}
    for _ in range(warmup):
        for function in runnable.values():
            function()
    times = {name: [] for name in runnable}
    for _ in range(repeats):
        for name, function in runnable.items():
            times[name].append(measure(function))
    medians = {name: statistics.median(values) for name, values in times.items()}
    base = medians.get(baseline)
    rows = []
    for name in variants:
        if name not in runnable:
            rows.append({"benchmark": benchmark, "variant": name, "median_s": None, "min_s": None, "repeats": 0,
                         "ratio": None, "note": "not available"})
            continue
        rows.append({"benchmark": benchmark, "variant": name, "median_s": medians[name], "min_s": min(times[name]),
                     "repeats": repeats, "ratio": medians[name] / base if base else None,
                     "note": "baseline" if name == baseline else ""})
    if show:
        print(format_table(rows), flush=True)
    return rows


def _cells(row: dict) -> list:
    def seconds(value):
        if value is None:
            return "-"
        return f"{value * 1e3:.3f} ms" if value < 1 else f"{value:.3f} s"

    ratio = "-" if row["ratio"] is None else f"{row['ratio']:.2f}x"
    return [row["variant"], seconds(row["median_s"]), seconds(row["min_s"]), str(row["repeats"]), ratio, row["note"]]


_HEADER = ["variant", "median", "min", "runs", "vs baseline", "note"]


def format_table(rows: list) -> str:
    """Rows as an aligned text table, one block per benchmark."""
    blocks = []
    for benchmark in dict.fromkeys(row["benchmark"] for row in rows):
        lines = [_HEADER] + [_cells(row) for row in rows if row["benchmark"] == benchmark]
        widths = [max(len(line[i]) for line in lines) for i in range(len(_HEADER))]
        text = ["  ".join(cell.ljust(width) for cell, width in zip(line, widths)).rstrip() for line in lines]
        blocks.append("\n".join([benchmark, *text]))
    return "\n\n".join(blocks)


def to_markdown(rows: list) -> str:
    """Rows as Markdown tables, one per benchmark."""
    blocks = []
    for benchmark in dict.fromkeys(row["benchmark"] for row in rows):
        lines = [f"**{benchmark}**", "", "| " + " | ".join(_HEADER) + " |", "|" + "---|" * len(_HEADER)]
        lines += ["| " + " | ".join(_cells(row)) + " |" for row in rows if row["benchmark"] == benchmark]
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def reset_peak_rss() -> None:
    """Reset this process's peak resident memory (VmHWM) to the current RSS (Linux; elsewhere nothing happens)."""
    try:
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")
    except OSError:
        pass


def _status_bytes(field: str):
    try:
        with open("/proc/self/status") as handle:
            for line in handle:
                if line.startswith(field):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def peak_rss() -> int:
    """This process's peak resident memory in bytes since the start or the last ``reset_peak_rss``."""
    value = _status_bytes("VmHWM:")
    if value is None:
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return value


def current_rss() -> int:
    """This process's resident memory now, in bytes."""
    value = _status_bytes("VmRSS:")
    if value is None:
        import psutil

        return psutil.Process().memory_info().rss
    return value
