"""``hasten report RUN_DIR [--output PATH]``: one self-contained HTML page of a run's logged curves and config.

Reads the JSONL tracker's ``metrics.jsonl`` and TensorBoard event files found under RUN_DIR (see
``hasten.tracking.readers``), draws one chart per metric with matplotlib (the ``report`` extra), grouped into loss,
learning rate, throughput, memory, evaluation and the rest, and writes the page with the PNGs embedded (so it can
be mailed or attached) and also saved next to it.
"""
from __future__ import annotations

import argparse
import base64
import html
import io
import os
import re
from pathlib import Path
from typing import Optional, Union

from .errors import CommandError

__all__ = ["add_parser", "run", "build_report", "SECTIONS"]

# section title -> words that put a metric in it (the first section that matches wins)
SECTIONS = {
    "Loss": ("loss", "perplexity", "ppl"),
    "Learning rate": ("lr", "learning_rate", "learning rate"),
    "Throughput": ("throughput", "per_sec", "per_second", "/s", "_ps", "samples", "tokens", "it_s", "step_time",
                   "time"),
    "Memory": ("memory", "mem", "allocated", "reserved", "rss"),
    "Evaluation": ("eval", "val", "test", "accuracy", "acc", "f1", "score"),
}
OTHER = "Other metrics"


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``hasten report``."""
    parser = subparsers.add_parser("report", help="write an HTML page of a run's logged curves and config",
                                   description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", help="the run's folder (the Accelerator's project_dir or logging_dir)")
    parser.add_argument("--output", "-o", default=None,
                        help="where to write the HTML page (default: RUN_DIR/report.html); the PNGs go next to it")
    return parser


def section_of(metric: str) -> str:
    words = set(re.split(r"[/_.\s-]+", metric.lower()))
    lowered = metric.lower()
    for title, keys in SECTIONS.items():
        if any(key in words or (len(key) > 3 and key in lowered) for key in keys):
            return title
    return OTHER


def _pyplot_free_figure():
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise CommandError("hasten report draws with matplotlib, which is not installed: "
                           "pip install 'hasten[report]'") from None
    figure = Figure(figsize=(7, 3.6), dpi=100)
    FigureCanvasAgg(figure)  # the Agg canvas: no display, no global backend switch
    return figure


def _chart(metric: str, runs: dict) -> bytes:
    figure = _pyplot_free_figure()
    axes = figure.add_subplot()
    for run, points in runs.items():
        points = sorted(points, key=lambda point: point[0])
        axes.plot([p[0] for p in points], [p[1] for p in points], marker="." if len(points) < 50 else None,
                  label=run)
    axes.set_title(metric)
    axes.set_xlabel("step")
    axes.grid(alpha=0.3)
    if len(runs) > 1:
        axes.legend(fontsize="small")
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    return buffer.getvalue()


def _file_name(stem: str, metric: str) -> str:
    return f"{stem}-{re.sub(r'[^A-Za-z0-9_.-]+', '_', metric).strip('_') or 'metric'}.png"


def _config_rows(config: dict, prefix: str = ""):
    for key, value in config.items():
        if isinstance(value, dict):
            yield from _config_rows(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def _summary(runs: dict) -> str:
    rows = []
    for run, points in runs.items():
        values = [value for _, value in points]
        rows.append(f"<tr><td>{html.escape(run)}</td><td>{len(points)}</td><td>{values[-1]:.6g}</td>"
                    f"<td>{min(values):.6g}</td><td>{max(values):.6g}</td></tr>")
    return ("<table class='summary'><tr><th>run</th><th>points</th><th>last</th><th>min</th><th>max</th></tr>"
            + "".join(rows) + "</table>")


STYLE = """body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1000px;color:#222}
h1{font-size:1.6em}h2{border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:1.6em}
figure{display:inline-block;margin:.5em;vertical-align:top}img{max-width:100%;border:1px solid #eee}
table{border-collapse:collapse;font-size:.9em;margin:.4em 0}td,th{border:1px solid #ddd;padding:.2em .6em;
text-align:left}.muted{color:#777;font-size:.85em}"""


# marks <body data-images-rendered="N/M"> once loaded: a headless browser (or a person) can see every chart decoded
RENDER_CHECK = ("<script>window.addEventListener('load',function(){var all=document.images,ok=0;"
                "for(var i=0;i<all.length;i++){if(all[i].complete&&all[i].naturalWidth>0){ok++;}}"
                "document.body.setAttribute('data-images-rendered',ok+'/'+all.length);});</script>")


def build_report(run_dir: Union[str, os.PathLike], output: Optional[Union[str, os.PathLike]] = None) -> Path:
    """Write the report of ``run_dir`` to ``output`` (default ``run_dir/report.html``) and its PNGs next to it."""
    from ..tracking.readers import NoLogsFoundError, read_run_logs

    try:
        logs = read_run_logs(run_dir)
    except (NoLogsFoundError, ImportError) as error:
        raise CommandError(str(error)) from None
    _pyplot_free_figure()  # fail before writing anything when matplotlib is missing
    output = Path(output) if output is not None else Path(run_dir) / "report.html"
    output.parent.mkdir(parents=True, exist_ok=True)
    sections = {}
    for metric in sorted(logs.scalars):
        sections.setdefault(section_of(metric), []).append(metric)
    parts = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>hasten report: {html.escape(str(run_dir))}"
             f"</title><style>{STYLE}</style></head><body>",
             f"<h1>Run report: {html.escape(str(run_dir))}</h1>",
             f"<p class='muted'>Read from {len(logs.sources)} file(s): "
             f"{html.escape(', '.join(logs.sources))}</p>"]
    for title in [*SECTIONS, OTHER]:
        if title not in sections:
            continue
        parts.append(f"<h2>{html.escape(title)}</h2>")
        for metric in sections[title]:
            png = _chart(metric, logs.scalars[metric])
            (output.parent / _file_name(output.stem, metric)).write_bytes(png)
            encoded = base64.b64encode(png).decode("ascii")
            parts.append(f"<figure data-metric='{html.escape(metric, quote=True)}'><img alt='{html.escape(metric)}'"
                         f" src='data:image/png;base64,{encoded}'><figcaption>{html.escape(metric)}"
                         f"{_summary(logs.scalars[metric])}</figcaption></figure>")
    parts.append("<h2>Configuration</h2>")
    if not logs.configs:
        parts.append("<p class='muted'>No config was logged (pass config= to init_trackers).</p>")
    for run, config in logs.configs.items():
        rows = "".join(f"<tr><td>{html.escape(key)}</td><td>{html.escape(str(value))}</td></tr>"
                       for key, value in _config_rows(config))
        parts.append(f"<h3>{html.escape(run)}</h3><table class='config'><tr><th>key</th><th>value</th></tr>"
                     f"{rows}</table>")
    if logs.skipped:
        parts.append("<p class='muted'>Skipped: " + html.escape("; ".join(f"{p} ({why})" for p, why in logs.skipped))
                     + "</p>")
    parts.append(RENDER_CHECK + "</body></html>")
    output.write_text("\n".join(parts), encoding="utf-8")
    return output


def run(args: argparse.Namespace) -> int:
    path = build_report(args.run_dir, args.output)
    print(f"hasten report: wrote {path}")
    return 0
