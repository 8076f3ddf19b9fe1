"""transformers' Trainer step through hasten (``HASTEN_AS_ACCELERATE=1``) vs the same Trainer on the reference.

    python bench/bench_trainer.py [--json out.json]    # BENCH_PAIRS rounds (default 30), BENCH_CHUNK steps each

One tiny Llama (built from a config), one process, the whole step as Trainer runs it: loader, forward, backward,
gradient accumulation over 2 batches, clipping, AdamW, the scheduler. Trainer imports ``accelerate`` by name, so
the two libraries cannot share one interpreter: two worker processes each build their Trainer once and train, and a
callback in each pauses between chunks of ``BENCH_CHUNK`` optimizer steps until the parent says go. The parent
lets them run one chunk at a time, taking turns (the order alternating), so the idle one waits on a pipe while the
other runs, and a slow moment of the machine falls on one chunk of one pair. ``ratio`` is the median over the
rounds of hasten's chunk time / the reference's in the same round (target: within 2%).

Without the reference library installed, only hasten's time is reported (ratio None).
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAIRS = int(os.environ.get("BENCH_PAIRS", 30))
CHUNK = int(os.environ.get("BENCH_CHUNK", 10))
WARMUP_CHUNKS = 2
BENCHMARK = "Trainer step, tiny Llama, 1 process, accumulation 2"


def worker(command_fd: int, result_fd: int) -> None:
    """Train, pausing before each chunk of CHUNK optimizer steps for a byte on ``command_fd``; write each chunk's
    seconds (one line) to ``result_fd``."""
    import torch
    from datasets import Dataset
    from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainerCallback, TrainingArguments

    import accelerate

    commands, results = os.fdopen(command_fd, "rb", buffering=0), os.fdopen(result_fd, "w", buffering=1)
    total_steps = (WARMUP_CHUNKS + PAIRS) * CHUNK

    class Pace(TrainerCallback):
        def __init__(self):
            self.started = None

        def on_step_begin(self, args, state, control, **kwargs):
            if state.global_step % CHUNK == 0 and self.started is None:
                if not commands.read(1):
                    raise SystemExit("bench_trainer: the parent went away")
                self.started = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step % CHUNK == 0:
                results.write(f"{time.perf_counter() - self.started}\n")
                self.started = None

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         attention_dropout=0.0, tie_word_embeddings=False)
    model = LlamaForCausalLM(config)
    ids = torch.randint(0, 256, (4096, 32), generator=torch.Generator().manual_seed(1)).tolist()
    data = Dataset.from_dict({"input_ids": ids, "labels": ids})
    arguments = TrainingArguments(output_dir=os.environ["BENCH_OUT"], per_device_train_batch_size=4,
                                  gradient_accumulation_steps=2, max_steps=total_steps, learning_rate=1e-4,
                                  logging_strategy="no", save_strategy="no", report_to=[], seed=0,
                                  dataloader_num_workers=0, use_cpu=True, disable_tqdm=True, max_grad_norm=1.0)
    results.write(json.dumps({"library": accelerate.__file__}) + "\n")
    Trainer(model=model, args=arguments, train_dataset=data, callbacks=[Pace()]).train()


class Worker:
    """One worker process and its two pipes."""

    def __init__(self, name: str, env: dict, out: Path):
        command_read, self.command_write = os.pipe()
        self.result_read, result_write = os.pipe()
        env = dict(env, BENCH_OUT=str(out / name), OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
        self.process = subprocess.Popen([sys.executable, __file__, "--worker", str(command_read), str(result_write)],
                                        env=env, pass_fds=(command_read, result_write), stdout=subprocess.DEVNULL,
                                        stderr=subprocess.PIPE)
        os.close(command_read)
        os.close(result_write)
        self.results = os.fdopen(self.result_read, "r")
        self.library = json.loads(self._line())["library"]

    def _line(self) -> str:
        line = self.results.readline()
        if not line:
            self.process.wait()
            raise SystemExit(f"bench_trainer: a worker failed:\n{self.process.stderr.read().decode()[-3000:]}")
        return line

    def chunk(self) -> float:
        os.write(self.command_write, b"g")
        return float(self._line())

    def close(self) -> None:
        os.close(self.command_write)
        self.process.wait(timeout=120)
        self.process.stderr.close()


def _reference_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("accelerate") is not None


def main(argv=None):
    import tempfile

    argv = list(sys.argv[1:] if argv is None else argv)
    if "--worker" in argv:
        position = argv.index("--worker")
        worker(int(argv[position + 1]), int(argv[position + 2]))
        return None
    base = {key: value for key, value in os.environ.items() if not key.startswith(("HASTEN_", "ACCELERATE_"))}
    hasten_env = dict(base, HASTEN_AS_ACCELERATE="1",
                      PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT / "src"), base.get("PYTHONPATH")])))
    with tempfile.TemporaryDirectory() as out:
        workers = {"hasten": Worker("hasten", hasten_env, Path(out))}
        if _reference_installed():
            workers["accelerate"] = Worker("accelerate", base, Path(out))
        assert workers["hasten"].library.startswith(str(ROOT / "src")), workers["hasten"].library
        names = list(workers)
        for _ in range(WARMUP_CHUNKS):
            for name in names:
                workers[name].chunk()
        times = {name: [] for name in names}
        for round_index in range(PAIRS):
            order = names if round_index % 2 == 0 else names[::-1]
            for name in order:
                times[name].append(workers[name].chunk() / CHUNK)
        for running in workers.values():
            running.close()
    reference = times.get("accelerate")
    rows = []
    for name, values in times.items():
        ratio = statistics.median(mine / theirs for mine, theirs in zip(values, reference)) if reference else None
        rows.append({"benchmark": BENCHMARK, "variant": name, "median_s": statistics.median(values),
                     "min_s": min(values), "repeats": PAIRS, "ratio": ratio,
                     "note": f"per optimizer step, {CHUNK}-step chunks; median per-round ratio to the reference"})
    for row in rows:
        ratio = "-" if row["ratio"] is None else f"{row['ratio']:.3f}"
        print(f"{row['benchmark']:55} {row['variant']:11} {row['median_s'] * 1e3:9.2f} ms {ratio:>7}", flush=True)
    if "--json" in argv:
        Path(argv[argv.index("--json") + 1]).write_text(json.dumps(rows, indent=2))
    return rows


if __name__ == "__main__":
    main()
