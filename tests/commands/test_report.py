"""``hasten report``: the HTML page holds a chart per logged metric (grouped), the run's config and the PNGs,
from JSONL or TensorBoard logs; bad input gets a clear error. Rendered in a real headless browser where one is
installed."""
from __future__ import annotations

import base64
import re
import shutil
import subprocess
import sys

import pytest
import torch

from hasten import Accelerator
from hasten.commands import cli
from hasten.commands.report import OTHER, section_of

CHROMIUM = next((path for path in (shutil.which("chromium"), shutil.which("chromium-browser"),
                                   shutil.which("google-chrome"), "/usr/bin/chromium") if path and
                 shutil.os.path.exists(path)), None)


def make_run(folder, log_with=("jsonl", "tensorboard"), steps=5):
    accelerator = Accelerator(cpu=True, log_with=list(log_with), project_dir=folder)
    accelerator.init_trackers("run", config={"learning_rate": 0.003, "batch_size": 16, "model": "tiny-mlp"})
    for step in range(steps):
        accelerator.log({"train/loss": torch.tensor(2.0 / (step + 1)), "lr": 0.003 * (1 - step / steps),
                         "samples_per_second": 100.0 + step, "memory_allocated_mb": 12.5,
                         "eval/accuracy": 0.5 + step / 20, "note": "text is not plotted"}, step=step)
    accelerator.end_training()


def images(page: str) -> list[bytes]:
    return [base64.b64decode(data) for data in re.findall(r"src='data:image/png;base64,([^']+)'", page)]


def test_report_from_jsonl_and_tensorboard_holds_every_curve_and_the_config(tmp_path, capsys):
    make_run(tmp_path)
    assert cli.main(["report", str(tmp_path)]) == 0
    page_path = tmp_path / "report.html"
    assert f"wrote {page_path}" in capsys.readouterr().out
    page = page_path.read_text()
    metrics = ["train/loss", "lr", "samples_per_second", "memory_allocated_mb", "eval/accuracy"]
    for metric in metrics:
        assert f"data-metric='{metric}'" in page
    assert "note" not in re.findall(r"data-metric='([^']+)'", page)
    pngs = images(page)
    assert len(pngs) == len(metrics) and all(png.startswith(b"\x89PNG\r\n\x1a\n") for png in pngs)
    for section in ("Loss", "Learning rate", "Throughput", "Memory", "Evaluation", "Configuration"):
        assert f"<h2>{section}</h2>" in page
    assert page.index("<h2>Loss</h2>") < page.index("data-metric='train/loss'") < page.index("<h2>Learning rate")
    for key, value in (("learning_rate", "0.003"), ("batch_size", "16"), ("model", "tiny-mlp")):
        assert f"<td>{key}</td><td>{value}</td>" in page
    assert "<td>run</td><td>5</td><td>0.4</td><td>0.4</td><td>2</td>" in page  # last, min, max of the loss
    written = sorted(path.name for path in tmp_path.glob("report-*.png"))
    assert written == sorted(["report-train_loss.png", "report-lr.png", "report-samples_per_second.png",
                              "report-memory_allocated_mb.png", "report-eval_accuracy.png"])
    assert (tmp_path / "report-train_loss.png").read_bytes() in pngs


def test_report_from_tensorboard_only_to_another_path(tmp_path):
    make_run(tmp_path / "run_dir", log_with=["tensorboard"], steps=3)
    output = tmp_path / "out" / "page.html"
    assert cli.main(["report", str(tmp_path / "run_dir"), "--output", str(output)]) == 0
    page = output.read_text()
    assert "data-metric='train/loss'" in page and "<td>model</td><td>tiny-mlp</td>" in page  # from hparams.yml
    assert "tfevents" in page and (tmp_path / "out" / "page-train_loss.png").is_file()


def test_several_runs_in_one_folder_share_a_chart(tmp_path):
    for name in ("a", "b"):
        make_run(tmp_path / name, log_with=["jsonl"], steps=2)
    assert cli.main(["report", str(tmp_path)]) == 0
    page = (tmp_path / "report.html").read_text()
    assert len(images(page)) == 5 and "<h3>a/run</h3>" in page and "<h3>b/run</h3>" in page


def test_sections_group_metrics_by_name():
    assert section_of("eval_loss") == "Loss" and section_of("learning_rate") == "Learning rate"
    assert section_of("tokens_per_sec") == "Throughput" and section_of("gpu/memory_reserved") == "Memory"
    assert section_of("val_acc") == "Evaluation" and section_of("grad_norm") == OTHER


@pytest.mark.parametrize("content, match", [
    (None, "not a folder"),
    ({}, "No logs found under"),
    ({"run/metrics.jsonl": '{"step": 1, "time": 0, "values": {"note": "x"}}\n'}, "hold no numbers to plot"),
])
def test_bad_run_folders_are_clear_errors(tmp_path, capsys, content, match):
    folder = tmp_path / "missing"
    if content is not None:
        folder.mkdir()
        for name, text in content.items():
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            (folder / name).write_text(text)
    assert cli.main(["report", str(folder)]) == 2
    assert re.search(match, capsys.readouterr().err)
    assert not (folder / "report.html").exists()


def test_a_partial_last_line_is_skipped_and_said(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 0, "values": {"loss": 1.0}}\n{"step": 1, "val')
    assert cli.main(["report", str(tmp_path)]) == 0
    page = (tmp_path / "report.html").read_text()
    assert "data-metric='loss'" in page and "line 2 is not JSON" in page


def test_missing_matplotlib_names_the_extra(tmp_path, monkeypatch, capsys):
    make_run(tmp_path, log_with=["jsonl"], steps=2)
    monkeypatch.setitem(sys.modules, "matplotlib.backends.backend_agg", None)
    assert cli.main(["report", str(tmp_path)]) == 2
    assert "pip install 'hasten[report]'" in capsys.readouterr().err
    assert not (tmp_path / "report.html").exists()


def test_report_help_does_not_import_matplotlib():
    code = ("import sys\nfrom hasten.commands import cli\nassert cli.main(['report', '--help']) == 0\n"
            "assert 'matplotlib' not in sys.modules and 'torch' not in sys.modules\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "RUN_DIR" in result.stdout.upper() and "--output" in result.stdout


@pytest.mark.skipif(CHROMIUM is None, reason="no headless browser (chromium) installed")
def test_the_page_renders_in_a_headless_browser(tmp_path):
    make_run(tmp_path, steps=4)
    assert cli.main(["report", str(tmp_path)]) == 0
    page = tmp_path / "report.html"
    browser = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
               f"--user-data-dir={tmp_path / 'profile'}"]
    dom = subprocess.run([*browser, "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert 'data-images-rendered="5/5"' in dom.stdout  # every chart decoded, with a width, in a real browser
    assert "tiny-mlp" in dom.stdout
    shot = tmp_path / "shot.png"
    result = subprocess.run([*browser, f"--screenshot={shot}", "--window-size=1000,1400", page.as_uri()],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and shot.read_bytes().startswith(b"\x89PNG"), result.stderr[-2000:]
    from matplotlib.image import imread

    pixels = imread(shot)
    assert pixels.shape[0] == 1400 and pixels[..., :3].std() > 0.05  # not a blank page


def test_tensorboard_logs_without_the_tensorboard_package(tmp_path, monkeypatch, capsys):
    import importlib.util

    from hasten.tracking import readers

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(readers.importlib.util, "find_spec",
                        lambda name, *a: None if name == "tensorboard" else real_find_spec(name, *a))
    make_run(tmp_path / "tb", log_with=["tensorboard"], steps=2)
    assert cli.main(["report", str(tmp_path / "tb")]) == 2
    assert "pip install 'hasten[trackers]'" in capsys.readouterr().err
    make_run(tmp_path / "both", steps=2)  # JSONL is enough: the TensorBoard files are skipped and said so
    assert cli.main(["report", str(tmp_path / "both")]) == 0
    assert "tensorboard is not installed" in (tmp_path / "both" / "report.html").read_text()
