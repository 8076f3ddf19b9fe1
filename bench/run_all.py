"""Run every benchmark (`bench/bench_*.py` with a `main()`), print their tables, write them as Markdown.

    python bench/run_all.py [--only launcher collectives ...] [--repeats N] [--output bench/RESULTS.md]

Each benchmark runs in its own Python process (one that initialises torch.distributed or changes
global state cannot disturb the next). The convention: `main()`, callable without arguments, returns
the rows of `harness.compare`, or rows of a measure with its `value` and `ratio` (bench_fsdp, bench_deepspeed).
A file without such a `main()` is run as a script and its printed output is kept instead. A benchmark that
fails is reported and the others still run; the exit status is then 1.
"""
from __future__ import annotations

import argparse
import datetime
import importlib.util
import inspect
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
from harness import to_markdown  # noqa: E402


def discover(only=None) -> list:
    """The benchmark files, sorted; ``only`` keeps those whose name (without ``bench_``) is listed."""
    files = sorted(BENCH.glob("bench_*.py"))
    if only:
        wanted = {name.removeprefix("bench_").removesuffix(".py") for name in only}
        unknown = wanted - {path.stem.removeprefix("bench_") for path in files}
        if unknown:
            raise SystemExit(f"run_all: no benchmark named {sorted(unknown)}; there are "
                             f"{[path.stem.removeprefix('bench_') for path in files]}.")
        files = [path for path in files if path.stem.removeprefix("bench_") in wanted]
    return files


def _callable_without_arguments(function) -> bool:
    try:
        parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):
        return False
    return all(p.default is not p.empty or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in parameters)


def _run_in_this_process(path: Path, rows_file: Path) -> None:
    """Child mode: import the benchmark, call its main(), save the rows as JSON."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.argv = [str(path)]
    spec.loader.exec_module(module)
    main = getattr(module, "main", None)
    if not callable(main) or not _callable_without_arguments(main):
        rows_file.write_text(json.dumps({"as_script": True}))
        return
    rows = main()
    rows_file.write_text(json.dumps({"rows": rows if isinstance(rows, list) else []}))


def run_benchmark(path: Path, repeats=None) -> dict:
    """Run one benchmark file in a fresh process.

    Returns ``{"rows": [...]}``, ``{"output": text}`` (a file run as a script) or ``{"error": ...}``.
    """
    env = dict(os.environ)
    if repeats:
        env["BENCH_REPEATS"] = str(repeats)
    with tempfile.TemporaryDirectory(prefix="hasten-bench-") as folder:
        rows_file = Path(folder) / "rows.json"
        code = subprocess.call([sys.executable, __file__, "--child", str(path), "--rows-file", str(rows_file)],
                               env=env)
        if code != 0 or not rows_file.exists():
            return {"error": f"exit status {code}"}
        result = json.loads(rows_file.read_text())
    if result.get("as_script"):  # no main() returning rows: run it as a script and keep what it printed
        finished = subprocess.run([sys.executable, str(path)], env=env, capture_output=True, text=True)
        sys.stdout.write(finished.stdout)
        sys.stderr.write(finished.stderr[-4000:])
        if finished.returncode != 0:
            return {"error": f"exit status {finished.returncode}", "output": finished.stdout}
        return {"output": finished.stdout}
    return result


def machine_summary() -> str:
    try:
        import torch

        torch_version = torch.__version__
        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    except ImportError:
        torch_version, gpus = "not installed", 0
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return (f"{platform.platform()}, Python {platform.python_version()}, torch {torch_version}, "
            f"{cores} usable CPU cores, {gpus} GPU(s)")


def rows_markdown(rows: list) -> str:
    """Rows as Markdown: ``harness.compare`` rows (timed variants) as its tables; rows that carry a measured
    ``value`` and a ``ratio`` instead (bench_fsdp, bench_deepspeed) as one table of measure, value and ratio."""
    timed = [row for row in rows if "median_s" in row]
    measured = [row for row in rows if "median_s" not in row]
    blocks = [to_markdown(timed)] if timed else []
    if measured:
        lines = ["| measure | variant | value | ratio |", "|---|---|---|---|"]
        for row in measured:
            ratio = "-" if row.get("ratio") is None else f"{row['ratio']:.2f}x"
            cells = [row["benchmark"].strip(), row.get("variant", ""), row.get("value", ""), ratio]
            lines.append("| " + " | ".join(cells) + " |")
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def write_markdown(results: dict, output: Path) -> None:
    lines = ["# Benchmark results", "",
             f"Measured {datetime.date.today().isoformat()} on {machine_summary()} with `python bench/run_all.py`.",
             "Medians of repeated runs, variants interleaved; `vs baseline` is the median over the plain-PyTorch "
             "variant's median (lower is faster).", ""]
    for name, result in results.items():
        lines += [f"## {name}", ""]
        if result.get("rows"):
            lines += [rows_markdown(result["rows"]), ""]
        elif result.get("output"):
            if result.get("error"):
                lines += [f"_failed: {result['error']}_", ""]
            lines += ["```", result["output"].rstrip(), "```", ""]
        else:
            lines += [f"_{result.get('error') or 'no rows returned'}_", ""]
    output.write_text("\n".join(lines))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="Run every bench/bench_*.py benchmark.")
    parser.add_argument("--only", nargs="+", metavar="NAME", help="run only these (e.g. launcher collectives)")
    parser.add_argument("--repeats", type=int, default=None, help="repetitions per variant (default: each bench's)")
    parser.add_argument("--output", type=Path, default=BENCH / "RESULTS.md", help="Markdown file to write")
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--rows-file", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        _run_in_this_process(args.child, args.rows_file)
        return 0
    results, failed = {}, False
    for path in discover(args.only):
        print(f"\n=== {path.name}", flush=True)
        results[path.stem] = run_benchmark(path, args.repeats)
        failed |= "error" in results[path.stem]
    write_markdown(results, args.output)
    print(f"\nwrote {args.output}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
