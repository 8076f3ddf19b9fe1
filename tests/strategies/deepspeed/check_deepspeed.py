"""DeepSpeed checks on real processes, run by tests/strategies/deepspeed/test_deepspeed.py as ``hasten launch -n 2 check_deepspeed.py <work>``.

Training numbers against single-process PyTorch, for every ZeRO stage, are the conformance suite's
(check_strategy_conformance.py). Here, one Accelerator after another (the state is reset between them):

0. the process state of a DeepSpeed launch (ACCELERATE_USE_DEEPSPEED set, as transformers does) says DEEPSPEED;
1. "auto" filling from the run (batch sizes, accumulation, the model's hidden size, bf16), written back into the
   plugin's config; ``deepspeed_engine_wrapped``; a config's contradictions refused naming both values, before
   anything is prepared;
2. the accumulation boundary: the engine's and hasten's agree on every micro-batch;
3. bad input refused before work: two models in one engine, DummyOptim / DummyScheduler against the config,
   clipping that contradicts the config, norm types, async saves;
4. the optimizer and scheduler of the config (DummyOptim / DummyScheduler);
5. exact resume (ZeRO-2 fp32 through the engine's own checkpoint, ZeRO-3 bf16), bitwise;
6. two plugins: a trained ZeRO-2 student and a ZeRO-3 inference teacher;
7. save_model of a ZeRO-3 model: the gathered weights, in safetensors.

Prints ``DEEPSPEED CHECKS PASSED``.
"""
from __future__ import annotations

import contextlib
import logging
import math
import os
import shutil
import sys
from pathlib import Path
from types import SimpleNamespace

import torch
from safetensors.torch import load_file
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from hasten import Accelerator, DeepSpeedPlugin
from hasten.state import AcceleratorState, GradientState
from hasten.utils import DummyOptim, DummyScheduler, set_seed


def say(accelerator, line: str) -> None:
    if accelerator.is_main_process:
        os.write(1, (line + "\n").encode())


def fresh_accelerator(**kwargs) -> Accelerator:
    AcceleratorState._reset_state()
    GradientState._reset_state() if hasattr(GradientState, "_reset_state") else None
    return Accelerator(cpu=True, **kwargs)


def expect_error(function, *fragments):
    try:
        function()
    except (ValueError, TypeError, NotImplementedError, RuntimeError) as error:
        message = str(error)
        missing = [f for f in fragments if f not in message]
        assert not missing, f"the error {message!r} does not say {missing}"
        return message
    raise AssertionError(f"no error; expected one saying {fragments}")


class Net(nn.Module):
    """A small model with a transformers-style config (hidden_size drives three "auto" values)."""

    def __init__(self, hidden: int = 16):
        super().__init__()
        self.config = SimpleNamespace(hidden_size=hidden)
        self.inner = nn.Linear(8, hidden)
        self.outer = nn.Linear(hidden, 2)

    def forward(self, x):
        return self.outer(torch.tanh(self.inner(x)))


def data(n: int = 64):
    generator = torch.Generator().manual_seed(3)
    return TensorDataset(torch.randn(n, 8, generator=generator), torch.randn(n, 2, generator=generator))


def auto_config(stage: int) -> dict:
    return {"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto",
            "gradient_accumulation_steps": "auto", "gradient_clipping": "auto", "bf16": {"enabled": "auto"},
            "zero_optimization": {"stage": stage, "reduce_bucket_size": "auto",
                                  "stage3_prefetch_bucket_size": "auto",
                                  "stage3_param_persistence_threshold": "auto"}}


@contextlib.contextmanager
def captured_warnings():
    """The messages hasten's loggers emit in the block."""
    messages = []

    class Keep(logging.Handler):
        def emit(self, record):
            messages.append(record.getMessage())

    handler, logger = Keep(level=logging.WARNING), logging.getLogger("hasten")
    logger.addHandler(handler)
    try:
        yield messages
    finally:
        logger.removeHandler(handler)


def check_auto_filling_and_conflicts() -> None:
    accelerator = fresh_accelerator(mixed_precision="bf16", gradient_accumulation_steps=2,
                                    deepspeed_plugin=DeepSpeedPlugin(hf_ds_config=auto_config(3)))
    model = Net(16)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    assert accelerator.deepspeed_engine_wrapped is None  # before any engine
    engine, prepared_optimizer, loader = accelerator.prepare(model, optimizer, DataLoader(data(), batch_size=4))
    wrapped = accelerator.deepspeed_engine_wrapped
    assert wrapped.engine is engine and accelerator.deepspeed_engine_wrapped is wrapped
    plugin_config = accelerator.state.deepspeed_plugin.deepspeed_config  # "auto" replaced there too, as the reference
    assert plugin_config["train_micro_batch_size_per_gpu"] == 4 and plugin_config["gradient_accumulation_steps"] == 2
    assert plugin_config["zero_optimization"]["reduce_bucket_size"] == 16 * 16, plugin_config["zero_optimization"]
    assert engine.train_micro_batch_size_per_gpu() == 4
    assert engine.gradient_accumulation_steps() == 2
    assert engine.train_batch_size() == 4 * 2 * accelerator.num_processes
    assert engine.zero_reduce_bucket_size() == 16 * 16
    assert engine.zero_prefetch_bucket_size() == int(0.9 * 16 * 16)
    assert engine.zero_param_persistence_threshold() == 10 * 16
    assert engine.bfloat16_enabled() and engine.gradient_clipping() == 1.0
    assert engine.module.inner.weight.dtype == torch.bfloat16
    config = accelerator.deepspeed_config  # the config the engine was built from, as the reference exposes it
    assert config["train_micro_batch_size_per_gpu"] == 4 and config["gradient_accumulation_steps"] == 2, config
    assert engine._is_accelerate_prepared and prepared_optimizer._is_accelerate_prepared and loader.gradient_state
    say(accelerator, "ok: auto values filled from the run")

    conflicting = auto_config(2)
    conflicting["train_micro_batch_size_per_gpu"] = 8
    accelerator = fresh_accelerator(deepspeed_plugin=DeepSpeedPlugin(hf_ds_config=conflicting))
    model = Net()
    with captured_warnings() as messages:  # as in the reference: the config's value is used, the difference said
        engine, _, _ = accelerator.prepare(model, torch.optim.AdamW(model.parameters()),
                                           DataLoader(data(), batch_size=4))
    assert engine.train_micro_batch_size_per_gpu() == 8, engine.train_micro_batch_size_per_gpu()
    if accelerator.is_main_process:
        assert any("train_micro_batch_size_per_gpu=8" in m and "4 from" in m for m in messages), messages
    arithmetic = auto_config(2)
    arithmetic.update(train_batch_size=100, train_micro_batch_size_per_gpu=4, gradient_accumulation_steps=1)
    accelerator = fresh_accelerator(deepspeed_plugin=DeepSpeedPlugin(hf_ds_config=arithmetic))
    model = Net()
    expect_error(lambda: accelerator.prepare(model, torch.optim.AdamW(model.parameters()),
                                             DataLoader(data(), batch_size=4)), "train_batch_size=100",
                 "train_micro_batch_size_per_gpu=4 x gradient_accumulation_steps=1 x 2 data-parallel processes = 8")
    steps = auto_config(2)
    steps["gradient_accumulation_steps"] = 4
    with captured_warnings() as messages:  # both set and different: DeepSpeed's, as in the reference
        both = fresh_accelerator(gradient_accumulation_steps=2, deepspeed_plugin=DeepSpeedPlugin(hf_ds_config=steps))
    assert both.gradient_accumulation_steps == 4, both.gradient_accumulation_steps
    if both.is_main_process:
        assert any("Gradient accumulation steps mismatch" in m and "Using DeepSpeed's value" in m
                   for m in messages), messages
    adopted = fresh_accelerator(deepspeed_plugin=DeepSpeedPlugin(hf_ds_config=steps))
    assert adopted.gradient_accumulation_steps == 4, adopted.gradient_accumulation_steps
    say(adopted, "ok: the config's values are used with a warning naming both; batch sizes that do not multiply out "
             "are refused; the config's accumulation steps are adopted")


def check_boundary_and_bad_input(work: Path) -> None:
    accelerator = fresh_accelerator(gradient_accumulation_steps=2, deepspeed_plugin=DeepSpeedPlugin(zero_stage=2))
    model = Net()
    other = Net()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    loader = DataLoader(data(), batch_size=4)
    expect_error(lambda: accelerator.prepare(model, other, optimizer, loader), "2 models", "deepspeed_plugins")
    assert not accelerator._dataloaders, "a refused prepare() prepared the loader"
    expect_error(lambda: accelerator.prepare(model, DummyOptim(model.parameters()), loader),  # the reference's words
                 "You cannot create a `DummyOptim` without specifying an optimizer in the config file.",
                 "'optimizer' section")
    expect_error(lambda: accelerator.prepare(model, optimizer, DummyScheduler(optimizer), loader),
                 "Either specify a scheduler in the config file or pass in the `lr_scheduler_callable` parameter",
                 "'scheduler' section")
    engine, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    boundaries = []
    for x, y in loader:
        with accelerator.accumulate(engine):
            accelerator.backward(nn.functional.mse_loss(engine(x), y))
            boundaries.append((accelerator.sync_gradients, engine.is_gradient_accumulation_boundary()))
            if accelerator.sync_gradients:
                norm = accelerator.clip_grad_norm_(engine.parameters(), 0.5)
                assert type(norm) is float and math.isfinite(norm) and norm > 0, norm  # a number, as the reference
                expect_error(lambda: accelerator.clip_grad_norm_(engine.parameters(), 0.5, norm_type=1), "2-norm")
            optimizer.step()
            optimizer.zero_grad()
    assert all(ours == theirs for ours, theirs in boundaries), boundaries
    assert [ours for ours, _ in boundaries] == [False, True] * (len(boundaries) // 2), boundaries
    expect_error(lambda: accelerator.clip_grad_value_(engine.parameters(), 0.1), "global norm")
    expect_error(lambda: accelerator.save_state(work / "async", async_save=True), "async_save")
    assert not (work / "async").exists()
    say(accelerator, "ok: one accumulation boundary; bad input refused before any work")

    fixed = auto_config(2)
    fixed["gradient_clipping"] = 1.0
    accelerator = fresh_accelerator(deepspeed_plugin=DeepSpeedPlugin(hf_ds_config=fixed))
    model = Net()
    engine, optimizer, loader = accelerator.prepare(model, torch.optim.AdamW(model.parameters()),
                                                    DataLoader(data(), batch_size=4))
    x, y = next(iter(loader))
    accelerator.backward(nn.functional.mse_loss(engine(x), y))
    expect_error(lambda: accelerator.clip_grad_norm_(engine.parameters(), 0.5), "gradient_clipping=1.0", "0.5")
    say(accelerator, "ok: clipping that contradicts the config names both values")


def check_config_optimizer_and_scheduler() -> None:
    config = auto_config(2)
    config["optimizer"] = {"type": "AdamW", "params": {"lr": "auto", "weight_decay": "auto", "torch_adam": True}}
    config["scheduler"] = {"type": "WarmupLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto",
                                                          "warmup_num_steps": "auto", "warmup_type": "linear"}}
    accelerator = fresh_accelerator(deepspeed_plugin=DeepSpeedPlugin(hf_ds_config=config))
    model = Net()
    optimizer = DummyOptim(model.parameters(), lr=0.01, weight_decay=0.0)
    scheduler = DummyScheduler(optimizer, warmup_num_steps=4)
    expect_error(lambda: accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1)),
                 "You cannot specify an optimizer in the config file and in the code at the same time", "DummyOptim")
    own = torch.optim.lr_scheduler.StepLR(torch.optim.SGD(model.parameters(), lr=0.1), step_size=1)
    expect_error(lambda: accelerator.prepare(model, optimizer, own),
                 "You cannot specify a scheduler in the config file and in the code at the same time", "DummyScheduler")
    no_scheduler = {key: value for key, value in config.items() if key != "scheduler"}
    other = fresh_accelerator(deepspeed_plugin=DeepSpeedPlugin(hf_ds_config=no_scheduler))
    expect_error(lambda: other.prepare(model, optimizer, own),
                 "You can only specify `accelerate.utils.DummyScheduler` in the code when using "
                 "`accelerate.utils.DummyOptim`", "lr_scheduler_callable")
    accelerator = fresh_accelerator(deepspeed_plugin=DeepSpeedPlugin(hf_ds_config=config))
    engine, optimizer, scheduler, loader = accelerator.prepare(model, optimizer, scheduler,
                                                               DataLoader(data(), batch_size=4))
    rates = []
    for x, y in loader:
        accelerator.backward(nn.functional.mse_loss(engine(x), y))
        optimizer.step()
        scheduler.step()  # the engine steps it: this does nothing
        optimizer.zero_grad()
        rates.append(scheduler.get_last_lr()[0])
    # WarmupLR (linear, 4 steps, from 0 to DummyOptim's lr), stepped by the engine after each optimizer step
    expected = [0.01 * min(step, 4) / 4 for step in range(len(rates))]
    assert all(abs(a - b) < 1e-12 for a, b in zip(rates, expected)), (rates, expected)
    assert engine.get_lr()[0] == rates[-1]
    say(accelerator, "ok: the config's optimizer and warm-up scheduler, lr and steps filled from DummyOptim / "
                     "DummyScheduler")


def train_steps(accelerator, engine, optimizer, loader, skip: int = 0, limit: int = 8) -> list:
    losses = []
    batches = accelerator.skip_first_batches(loader, skip) if skip else loader
    for index, (x, y) in enumerate(batches):
        if index >= limit:
            break
        with accelerator.accumulate(engine):
            loss = nn.functional.mse_loss(engine(x), y)
            accelerator.backward(loss, model=engine)  # which engine, when several train
            if accelerator.sync_gradients:
                accelerator.clip_grad_norm_(engine.parameters(), 0.7)
            optimizer.step()
            optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def check_exact_resume(work: Path, stage: int, precision: str) -> None:
    def objects():
        accelerator = fresh_accelerator(mixed_precision=precision, gradient_accumulation_steps=2,
                                        deepspeed_plugin=DeepSpeedPlugin(zero_stage=stage))
        set_seed(11)
        model = Net()
        optimizer = torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.01)
        return (accelerator, *accelerator.prepare(model, optimizer, DataLoader(data(), batch_size=4)))

    folder = work / f"resume_zero{stage}_{precision}"
    accelerator, engine, optimizer, loader = objects()
    train_steps(accelerator, engine, optimizer, loader, limit=6)
    if stage == 2:
        expect_error(lambda: accelerator.save_state(folder, client_state={}), "client_state",
                     "exclude_frozen_parameters")
        accelerator.save_state(folder, exclude_frozen_parameters=True)  # to engine.save_checkpoint
    else:
        accelerator.save_state(folder)
    expected = train_steps(accelerator, engine, optimizer, loader, skip=6, limit=6)
    expected_weights = accelerator.strategy.master_model_state_dict(engine)

    accelerator, engine, optimizer, loader = objects()
    accelerator.load_state(folder)
    resumed = train_steps(accelerator, engine, optimizer, loader, skip=6, limit=6)
    weights = accelerator.strategy.master_model_state_dict(engine)
    assert resumed == expected, f"losses after resuming {resumed} vs {expected}"
    assert all(torch.equal(weights[k], expected_weights[k]) for k in expected_weights)
    assert (folder / "pytorch_model").is_dir() and (folder / "latest").is_file()
    say(accelerator, f"ok: ZeRO-{stage} {precision} resumes bitwise exactly")
    if stage != 2:
        return
    # a DeepSpeed checkpoint hasten's save_state did not complete holds pickles: read only when trusted
    foreign = work / "foreign_deepspeed"
    if accelerator.is_main_process:
        shutil.copytree(folder, foreign)
        (foreign / "hasten_checkpoint.json").unlink()
    accelerator.wait_for_everyone()
    before = accelerator.strategy.master_model_state_dict(engine)
    expect_error(lambda: accelerator.load_state(foreign), "pickles", 'load_kwargs={"weights_only": False}')
    after = accelerator.strategy.master_model_state_dict(engine)
    assert all(torch.equal(before[k], after[k]) for k in before), "a refused load changed the weights"
    accelerator.load_state(foreign, load_kwargs={"weights_only": False})
    say(accelerator, "ok: an unmarked DeepSpeed checkpoint is read only with weights_only=False")


def check_student_and_teacher() -> None:
    plugins = {"student": DeepSpeedPlugin(zero_stage=2),
               "teacher": DeepSpeedPlugin(hf_ds_config={"train_micro_batch_size_per_gpu": 4,
                                                        "zero_optimization": {"stage": 3}})}
    accelerator = fresh_accelerator(deepspeed_plugins=plugins)
    state = accelerator.state
    assert state.deepspeed_plugin is plugins["student"] and accelerator.deepspeed_plugin is plugins["student"]
    set_seed(5)
    student, teacher = Net(), Net()
    with torch.no_grad():
        probe = torch.randn(4, 8)
        teacher_expected = teacher(probe)
    optimizer = torch.optim.AdamW(student.parameters(), lr=0.01)
    student, optimizer, loader = accelerator.prepare(student, optimizer, DataLoader(data(), batch_size=4))
    state.select_deepspeed_plugin("teacher")
    assert state.deepspeed_plugin is plugins["teacher"] and not plugins["student"].selected
    with captured_warnings() as messages:
        teacher = accelerator.prepare(teacher)
    assert teacher.zero_optimization_stage() == 3 and student.zero_optimization_stage() == 2
    assert accelerator.deepspeed_engine_wrapped.engine is student  # the first engine this Accelerator prepared
    if accelerator.is_main_process:  # said as the reference says it
        assert any("A wrapped DeepSpeed engine reference is currently tied for this `Accelerator()` instance" in m
                   for m in messages), messages
    with torch.no_grad():
        assert torch.allclose(teacher(probe), teacher_expected, atol=1e-6)
    losses = []
    for x, _ in loader:
        with torch.no_grad():
            target = teacher(x)
        loss = nn.functional.mse_loss(student(x), target)
        accelerator.backward(loss)  # two models prepared: the engine that trains takes it
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < losses[0] / 2, losses
    expect_error(lambda: state.select_deepspeed_plugin("nobody"), "nobody", "student", "teacher")
    try:  # as in the reference: the run's plugins are the first Accelerator's
        Accelerator(deepspeed_plugin=DeepSpeedPlugin(zero_stage=1))
    except NotImplementedError as error:
        assert "You cannot pass in a `deepspeed_plugin` when creating a second `Accelerator`" in str(error), error
    else:
        raise AssertionError("a second Accelerator took another DeepSpeed plugin")
    assert state.deepspeed_plugin is plugins["teacher"]  # nothing changed
    say(accelerator, f"ok: a ZeRO-2 student learns from a ZeRO-3 teacher ({losses[0]:.3f} -> {losses[-1]:.3f})")


def check_save_model_zero3(work: Path) -> None:
    every_parameter_partitioned = {"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto",
                                   "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0}}
    accelerator = fresh_accelerator(mixed_precision="bf16",
                                    deepspeed_plugin=DeepSpeedPlugin(hf_ds_config=every_parameter_partitioned))
    model = Net(32)
    engine, optimizer, loader = accelerator.prepare(model, torch.optim.AdamW(model.parameters(), lr=0.01),
                                                    DataLoader(data(), batch_size=4))
    train_steps(accelerator, engine, optimizer, loader, limit=4)
    assert engine.module.inner.weight.numel() == 0  # partitioned: nothing whole on any rank
    gathered = accelerator.get_state_dict(engine)
    accelerator.save_model(engine, work / "zero3_model")
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        written = load_file(str(work / "zero3_model" / "model.safetensors"))
        assert written.keys() == gathered.keys()
        for name, value in gathered.items():
            assert written[name].dtype == torch.bfloat16 and tuple(written[name].shape) == tuple(value.shape)
            assert torch.equal(written[name], value), name
        assert tuple(written["inner.weight"].shape) == (32, 8)
    say(accelerator, "ok: save_model gathers ZeRO-3 partitions into 16-bit safetensors")

    # a model built partitioned on purpose (deepspeed.zero.Init): never whole on one process, trains the same way
    with accelerator.deepspeed_plugin.zero3_init():
        built = Net(32)
    assert hasattr(built.inner.weight, "ds_id") and built.inner.weight.numel() == 0
    engine, optimizer, loader = accelerator.prepare(built, torch.optim.AdamW(built.parameters(), lr=0.01),
                                                    DataLoader(data(), batch_size=4))
    losses = train_steps(accelerator, engine, optimizer, loader, limit=4)
    assert all(torch.isfinite(torch.tensor(losses))) and tuple(accelerator.get_state_dict(engine)["inner.weight"]
                                                               .shape) == (32, 8)
    say(accelerator, "ok: zero3_init builds a model already partitioned, and it trains")


def check_state_of_a_deepspeed_launch() -> None:
    """transformers' TrainingArguments(deepspeed=...) sets ACCELERATE_USE_DEEPSPEED before it makes its state and
    reads the state's distributed_type: DEEPSPEED before any Accelerator, as with the reference; not without."""
    from hasten.config.enums import DistributedType
    from hasten.state import PartialState

    AcceleratorState._reset_state(reset_partial_state=True)
    os.environ["ACCELERATE_USE_DEEPSPEED"] = "true"
    try:
        state = PartialState()
        assert state.distributed_type == DistributedType.DEEPSPEED and state.num_processes == 2, state
        assert state.use_distributed and state.backend == "gloo"
    finally:
        del os.environ["ACCELERATE_USE_DEEPSPEED"]
    AcceleratorState._reset_state(reset_partial_state=True)
    assert PartialState().distributed_type == DistributedType.MULTI_CPU


def main(work: Path) -> None:
    check_state_of_a_deepspeed_launch()
    check_auto_filling_and_conflicts()
    check_boundary_and_bad_input(work)
    check_config_optimizer_and_scheduler()
    check_exact_resume(work, 2, "no")
    check_exact_resume(work, 3, "bf16")
    check_student_and_teacher()
    check_save_model_zero3(work)
    accelerator = Accelerator(cpu=True)
    accelerator.wait_for_everyone()
    say(accelerator, "DEEPSPEED CHECKS PASSED")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
