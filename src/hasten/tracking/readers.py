"""Reading a run's logs back: the JSONL tracker's ``metrics.jsonl`` and TensorBoard event files, found anywhere
under a run folder, as scalar series per metric and per run (what ``hasten report`` draws).

Each folder holding logs is one run, labelled by its path relative to the folder searched. When a run has both
kinds of logs (``log_with=["jsonl", "tensorboard"]``), the JSONL values are used and TensorBoard fills in only the
metrics JSONL lacks.
"""
from __future__ import annotations

import importlib.util
import json
import numbers
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Union

from .jsonl import CONFIG_FILE, METRICS_FILE
from .tensorboard import HPARAMS_FILE

__all__ = ["RunLogs", "read_run_logs", "NoLogsFoundError"]

TENSORBOARD_GLOB = "events.out.tfevents.*"


class NoLogsFoundError(FileNotFoundError):
    """No JSONL or TensorBoard logs under the folder, or none with a scalar in them."""


@dataclass
class RunLogs:
    """``scalars[metric][run] = [(step, value), ...]`` in logging order; ``configs[run]`` the run's config."""

    scalars: dict = field(default_factory=dict)
    configs: dict = field(default_factory=dict)
    sources: list = field(default_factory=list)  # the files read
    skipped: list = field(default_factory=list)  # (path, why) of logs that could not be read

    def add(self, metric: str, run: str, step: Optional[int], value: float) -> None:
        self.scalars.setdefault(metric, {}).setdefault(run, []).append((step, float(value)))


def _flat(values: dict, prefix: str = ""):
    for key, value in values.items():
        if isinstance(value, dict):
            yield from _flat(value, f"{prefix}{key}/")
        elif isinstance(value, numbers.Real) and not isinstance(value, bool):
            yield f"{prefix}{key}", value


def _label(folder: Path, root: Path) -> str:
    relative = folder.relative_to(root).as_posix()
    return relative if relative != "." else folder.name


def _read_jsonl(path: Path, run: str, logs: RunLogs) -> set:
    """Add the file's scalars; a line without a step gets its line number. Returns the metric names seen."""
    seen = set()
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines()):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:  # a run killed mid-write leaves a partial last line
            logs.skipped.append((str(path), f"line {number + 1} is not JSON"))
            continue
        step = entry.get("step")
        for metric, value in _flat(entry.get("values", {})):
            logs.add(metric, run, number if step is None else step, value)
            seen.add(metric)
    logs.sources.append(str(path))
    config = path.parent / CONFIG_FILE
    if config.is_file():
        logs.configs[run] = json.loads(config.read_text(encoding="utf-8"))
    return seen


def _read_tensorboard(folder: Path, run: str, logs: RunLogs, already: set) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(folder), size_guidance={"scalars": 0})  # 0: keep every point
    events.Reload()
    for tag in events.Tags().get("scalars", []):
        if tag in already:
            continue
        for event in events.Scalars(tag):
            logs.add(tag, run, event.step, event.value)
    logs.sources.extend(str(path) for path in sorted(folder.glob(TENSORBOARD_GLOB)))
    hparams = _hparams_file(folder)
    if hparams is not None and run not in logs.configs:
        import yaml

        logs.configs[run] = yaml.safe_load(hparams.read_text(encoding="utf-8")) or {}


def _hparams_file(folder: Path) -> Optional[Path]:
    """The run's ``hparams.yml``: in the newest timestamped sub-run the tracker writes (the reference's layout), or
    beside the events (runs written by earlier hasten versions)."""
    stamped = sorted(folder.glob(f"*/{HPARAMS_FILE}"), key=lambda path: _stamp(path.parent.name))
    if stamped:
        return stamped[-1]
    return folder / HPARAMS_FILE if (folder / HPARAMS_FILE).is_file() else None


def _stamp(name: str) -> float:
    try:
        return float(name)
    except ValueError:
        return float("-inf")


def _is_hparams_sub_run(folder: Path, event_folders: set) -> bool:
    """A sub-run holding only a run's hyperparameters (``<run>/<time.time()>/``), not a run of its own."""
    return folder.parent in event_folders and (folder / HPARAMS_FILE).is_file() and _stamp(folder.name) > 0


def read_run_logs(run_dir: Union[str, os.PathLike]) -> RunLogs:
    """Every JSONL and TensorBoard log under ``run_dir``. Raises ``NoLogsFoundError`` when there is none (or none
    holds a scalar); TensorBoard files need the ``tensorboard`` package (ImportError naming the extra)."""
    root = Path(run_dir)
    if not root.is_dir():
        raise NoLogsFoundError(f"{root} is not a folder: give the run's folder (the Accelerator's project_dir or "
                               "logging_dir).")
    logs = RunLogs()
    seen_by_folder = {}
    for path in sorted(root.rglob(METRICS_FILE)):
        seen_by_folder[path.parent] = _read_jsonl(path, _label(path.parent, root), logs)
    found = {path.parent for path in root.rglob(TENSORBOARD_GLOB)}
    event_folders = sorted(folder for folder in found if not _is_hparams_sub_run(folder, found))
    if event_folders:
        if importlib.util.find_spec("tensorboard") is None:
            if not seen_by_folder:
                raise ImportError(f"{root} holds TensorBoard logs, and reading them needs the `tensorboard` "
                                  "package, which is not installed: pip install 'hasten[trackers]'") from None
            logs.skipped.extend((str(f), "tensorboard is not installed") for f in event_folders)
            event_folders = []
    for folder in event_folders:
        _read_tensorboard(folder, _label(folder, root), logs, seen_by_folder.get(folder, set()))
    if not logs.sources:
        raise NoLogsFoundError(f"No logs found under {root}: hasten report reads {METRICS_FILE} (written by "
                               f"log_with='jsonl') and TensorBoard {TENSORBOARD_GLOB} files.")
    if not logs.scalars:
        raise NoLogsFoundError(f"The logs under {root} hold no numbers to plot (read: {', '.join(logs.sources)}).")
    return logs
