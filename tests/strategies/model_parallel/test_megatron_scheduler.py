"""Megatron-LM's schedule (``MegatronLMDummyScheduler``, ``megatron_param_groups``): closed forms, groups, resume.

Every expected value is written from the formula, not read back from the code: warmup ramps linearly from
``lr_warmup_init``, linear decay is ``1 - t``, cosine ``0.5 * (1 + cos(pi * t))``, inverse-square-root
``max_lr * sqrt(warmup / step)``, WSD holds then anneals over its last steps, the weight decay increments with
``t`` or ``0.5 * (1 - cos(pi * t))``. Pure CPU, one process.
"""
from __future__ import annotations

import io
import math

import pytest
import torch
from torch import nn

from hasten import Accelerator
from hasten.scheduler import AcceleratedScheduler
from hasten.utils.megatron_lm import MegatronLMDummyScheduler, megatron_param_groups
from hasten.strategies.model_parallel.megatron_scheduler import MegatronParamScheduler, MegatronSchedule

PEAK = 1.0


def _optimizer(lr=PEAK, weight_decay=0.0, groups=None):
    params = groups if groups is not None else [nn.Parameter(torch.zeros(2))]
    return torch.optim.SGD(params, lr=lr, weight_decay=weight_decay)


def _lrs(scheduler, steps, **step_kwargs):
    """The first group's lr after each of ``steps`` steps (index 0: before any step)."""
    seen = [scheduler.optimizer.param_groups[0]["lr"]]
    for _ in range(steps):
        scheduler.optimizer.step()
        scheduler.step(**step_kwargs)
        seen.append(scheduler.optimizer.param_groups[0]["lr"])
    return seen


# ----------------------------------------------------------------------------- learning-rate styles
def test_warmup_ramps_linearly_then_linear_decay_reaches_min_lr():
    scheduler = MegatronLMDummyScheduler(_optimizer(), total_num_steps=10, warmup_num_steps=4, min_lr=0.1)
    seen = _lrs(scheduler, 12)
    for step in range(0, 5):
        assert seen[step] == pytest.approx(PEAK * step / 4)
    for step in range(4, 11):
        assert seen[step] == pytest.approx(0.1 + (PEAK - 0.1) * (1 - (step - 4) / 6))
    assert seen[11] == seen[12] == pytest.approx(0.1)


def test_cosine_decay_follows_half_a_cosine():
    scheduler = MegatronLMDummyScheduler(_optimizer(), total_num_steps=12, warmup_num_steps=2,
                                         lr_decay_style="cosine", min_lr=0.05)
    seen = _lrs(scheduler, 14)
    assert seen[1] == pytest.approx(0.5)
    for step in (2, 3, 5, 7, 8, 11, 12):
        t = (step - 2) / 10
        assert seen[step] == pytest.approx(0.05 + (PEAK - 0.05) * 0.5 * (1 + math.cos(math.pi * t)))
    assert seen[13] == seen[14] == pytest.approx(0.05)


def test_constant_holds_max_lr_after_warmup_even_past_the_decay():
    scheduler = MegatronLMDummyScheduler(_optimizer(lr=0.3), total_num_steps=5, warmup_num_steps=2,
                                         lr_decay_style="constant", min_lr=0.01)
    assert _lrs(scheduler, 8) == pytest.approx([0.0, 0.15, 0.3, 0.3, 0.3, 0.3, 0.3, 0.3, 0.3])


def test_min_lr_clamp_once_a_shorter_decay_is_over():
    scheduler = MegatronLMDummyScheduler(_optimizer(), total_num_steps=20, lr_decay_iters=8, min_lr=0.2)
    seen = _lrs(scheduler, 20)
    assert seen[0] == pytest.approx(PEAK)  # no warmup: the schedule starts at its peak
    assert seen[4] == pytest.approx(0.2 + 0.8 * 0.5)
    assert seen[8] == pytest.approx(0.2)
    assert all(lr == pytest.approx(0.2) for lr in seen[9:])


def test_inverse_square_root_decay_is_clamped_at_min_lr():
    scheduler = MegatronLMDummyScheduler(_optimizer(), total_num_steps=100, warmup_num_steps=4,
                                         lr_decay_style="inverse-square-root", min_lr=0.3)
    seen = _lrs(scheduler, 12)
    assert seen[2] == pytest.approx(0.5)
    for step in (5, 6, 9, 12):
        assert seen[step] == pytest.approx(PEAK * math.sqrt(4 / step))
    clamp = MegatronLMDummyScheduler(_optimizer(), total_num_steps=100, warmup_num_steps=4,
                                     lr_decay_style="inverse-square-root", min_lr=0.6)
    assert _lrs(clamp, 12)[12] == pytest.approx(0.6)


@pytest.mark.parametrize("style, coefficient", [
    ("exponential", lambda r: 2 * 0.5 ** r - 1), ("linear", lambda r: 1 - r),
    ("cosine", lambda r: 0.5 * (1 + math.cos(math.pi * r))), ("minus_sqrt", lambda r: 1 - math.sqrt(r)),
])
def test_wsd_holds_then_anneals_over_its_last_steps(style, coefficient):
    scheduler = MegatronLMDummyScheduler(_optimizer(), total_num_steps=20, warmup_num_steps=2, lr_decay_style="WSD",
                                         lr_wsd_decay_iters=8, lr_wsd_decay_style=style, min_lr=0.1)
    seen = _lrs(scheduler, 22)
    assert seen[1] == pytest.approx(0.5)
    assert seen[2:13] == pytest.approx([PEAK] * 11)  # stable until 20 - 8 = 12
    for step in (13, 15, 18, 20):
        assert seen[step] == pytest.approx(0.1 + (PEAK - 0.1) * coefficient((step - 12) / 8))
    assert seen[21] == seen[22] == pytest.approx(0.1)


def test_warmup_starts_at_lr_warmup_init_and_fraction_is_of_the_decay():
    scheduler = MegatronLMDummyScheduler(_optimizer(), total_num_steps=40, lr_decay_iters=20,
                                         lr_warmup_fraction=0.25, lr_warmup_init=0.2)
    seen = _lrs(scheduler, 6)
    for step in range(6):  # warmup: 0.25 of the 20-iteration decay
        assert seen[step] == pytest.approx(0.2 + (PEAK - 0.2) * step / 5)
    assert scheduler.schedule.warmup_steps == pytest.approx(5)


def test_max_lr_overrides_the_groups_lr_and_a_groups_max_lr_wins():
    groups = [{"params": [nn.Parameter(torch.zeros(1))]}, {"params": [nn.Parameter(torch.zeros(1))], "max_lr": 0.5}]
    scheduler = MegatronLMDummyScheduler(_optimizer(lr=9.0, groups=groups), total_num_steps=4, warmup_num_steps=2,
                                         max_lr=2.0)
    scheduler.optimizer.step()
    scheduler.step()
    assert scheduler.get_last_lr() == pytest.approx([1.0, 0.25])


def test_a_groups_min_lr_overrides_the_schedules_floor():
    groups = [{"params": [nn.Parameter(torch.zeros(1))]}, {"params": [nn.Parameter(torch.zeros(1))], "min_lr": 0.4}]
    scheduler = MegatronLMDummyScheduler(_optimizer(groups=groups), total_num_steps=4, min_lr=0.2)
    for _ in range(2):
        scheduler.step()
    assert scheduler.get_last_lr() == pytest.approx([0.2 + 0.8 * 0.5, 0.4 + 0.6 * 0.5])
    with pytest.raises(ValueError, match=r"min_lr \(1.5\) is above max_lr \(1.0\) for param group 1"):
        MegatronLMDummyScheduler(_optimizer(groups=[groups[0], dict(groups[1], min_lr=1.5)]), total_num_steps=4)


# ----------------------------------------------------------------------------- samples vs iterations
@pytest.mark.parametrize("style", ["linear", "cosine", "inverse-square-root", "WSD", "constant"])
def test_sample_based_schedule_equals_the_iteration_based_one(style):
    batch, iters = 8, 16
    wsd_iters = {"lr_wsd_decay_iters": 5} if style == "WSD" else {}
    wsd_samples = {"lr_wsd_decay_samples": 5 * batch} if style == "WSD" else {}
    by_iters = MegatronLMDummyScheduler(_optimizer(), train_iters=iters, lr_warmup_iters=3, lr_decay_iters=12,
                                        lr_decay_style=style, min_lr=0.1, start_weight_decay=0.0,
                                        end_weight_decay=0.1, weight_decay_incr_style="cosine", **wsd_iters)
    by_samples = MegatronLMDummyScheduler(_optimizer(), train_samples=iters * batch, lr_warmup_samples=3 * batch,
                                          lr_decay_samples=12 * batch, lr_decay_style=style, min_lr=0.1,
                                          start_weight_decay=0.0, end_weight_decay=0.1,
                                          weight_decay_incr_style="cosine", **wsd_samples)
    with_option = MegatronLMDummyScheduler(_optimizer(), train_samples=iters * batch, lr_warmup_samples=3 * batch,
                                           lr_decay_samples=12 * batch, lr_decay_style=style, min_lr=0.1,
                                           start_weight_decay=0.0, end_weight_decay=0.1,
                                           weight_decay_incr_style="cosine", samples_per_step=batch, **wsd_samples)
    reference = _lrs(by_iters, iters + 2)
    assert _lrs(by_samples, iters + 2, increment=batch) == pytest.approx(reference)
    assert _lrs(with_option, iters + 2) == pytest.approx(reference)
    for a, b in ((by_iters, by_samples), (by_iters, with_option)):
        assert a.optimizer.param_groups[0]["weight_decay"] == pytest.approx(b.optimizer.param_groups[0]["weight_decay"])
    assert (by_samples.consumed_samples, with_option.consumed_samples) == ((iters + 2) * batch, (iters + 2) * batch)


def test_samples_per_step_drives_the_same_curve_as_explicit_increments():
    def build(**extra):
        return MegatronLMDummyScheduler(_optimizer(), train_samples=64, lr_warmup_fraction=0.25,
                                        lr_decay_style="cosine", **extra)

    assert _lrs(build(samples_per_step=4), 18) == pytest.approx(_lrs(build(), 18, increment=4))


def test_sample_schedule_without_a_step_size_refuses_a_bare_step_and_keeps_its_place():
    scheduler = MegatronLMDummyScheduler(_optimizer(), train_samples=64)
    with pytest.raises(ValueError, match="samples_per_step"):
        scheduler.step()
    assert scheduler.num_steps == 0
    scheduler.step(increment=16)
    assert scheduler.consumed_samples == 16
    assert scheduler.get_last_lr() == pytest.approx([PEAK * (1 - 16 / 64)])


# ----------------------------------------------------------------------------- weight decay
@pytest.mark.parametrize("style, increment", [
    ("linear", lambda t: t), ("cosine", lambda t: 0.5 * (1 - math.cos(math.pi * t))),
])
def test_weight_decay_increments_from_start_to_end_over_the_run(style, increment):
    scheduler = MegatronLMDummyScheduler(_optimizer(), total_num_steps=10, lr_decay_iters=4,
                                         weight_decay_incr_style=style, start_weight_decay=0.01,
                                         end_weight_decay=0.11)
    seen = [scheduler.optimizer.param_groups[0]["weight_decay"]]
    for _ in range(12):
        scheduler.step()
        seen.append(scheduler.optimizer.param_groups[0]["weight_decay"])
    for step in range(11):  # over train_iters (10), not the lr decay (4)
        assert seen[step] == pytest.approx(0.01 + 0.1 * increment(step / 10))
    assert seen[11] == seen[12] == pytest.approx(0.11)


def test_constant_weight_decay_is_written_when_given_and_left_alone_when_not():
    given = MegatronLMDummyScheduler(_optimizer(weight_decay=0.5), total_num_steps=4, start_weight_decay=0.2,
                                     end_weight_decay=0.2)
    assert given.optimizer.param_groups[0]["weight_decay"] == pytest.approx(0.2)
    untouched = MegatronLMDummyScheduler(_optimizer(weight_decay=0.5), total_num_steps=4)
    untouched.step()
    assert untouched.optimizer.param_groups[0]["weight_decay"] == 0.5


def test_schedule_closed_forms_directly():
    schedule = MegatronSchedule(decay_steps=10, warmup_steps=2, decay_style="linear", min_lr=0.0,
                                wd_incr_steps=10, wd_incr_style="linear", start_wd=0.0, end_wd=1.0)
    assert schedule.lr(1, max_lr=2.0) == pytest.approx(1.0)
    assert schedule.lr(6, max_lr=2.0, min_lr=1.0) == pytest.approx(1.5)
    assert schedule.weight_decay(3) == pytest.approx(0.3)
    assert schedule.weight_decay(3, start=0.5, end=0.5) == pytest.approx(0.5)


# ----------------------------------------------------------------------------- Megatron param groups
class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(5, 4)
        self.norm = nn.LayerNorm(4)
        self.proj = nn.Linear(4, 4)
        self.head = nn.Linear(4, 2, bias=False)
        self.frozen = nn.Linear(4, 4)
        self.frozen.requires_grad_(False)


def _names(model, group):
    ids = {id(p) for p in group["params"]}
    return sorted(name for name, p in model.named_parameters() if id(p) in ids)


def test_param_groups_leave_biases_and_1d_params_without_weight_decay():
    model = _Net()
    groups = megatron_param_groups(model, weight_decay=0.1)
    assert [(g["wd_mult"], g["lr_mult"], g["weight_decay"]) for g in groups] == [(1.0, 1.0, 0.1), (0.0, 1.0, 0.0)]
    assert _names(model, groups[0]) == ["embed.weight", "head.weight", "proj.weight"]
    assert _names(model, groups[1]) == ["norm.bias", "norm.weight", "proj.bias"]


def test_param_groups_follow_the_conditions_and_the_scheduler_applies_the_multipliers():
    model = _Net()
    groups = megatron_param_groups(model, weight_decay=0.1, no_wd_decay_cond=lambda name, p: name.startswith("embed"),
                                   scale_lr_cond=lambda name, p: name.startswith("head"), lr_mult=0.5)
    keyed = {(g["wd_mult"], g["lr_mult"]): _names(model, g) for g in groups}
    assert keyed == {(0.0, 1.0): ["embed.weight"], (1.0, 1.0): ["norm.bias", "norm.weight", "proj.bias", "proj.weight"],
                     (1.0, 0.5): ["head.weight"]}
    optimizer = torch.optim.AdamW(groups, lr=2.0)
    scheduler = MegatronLMDummyScheduler(optimizer, total_num_steps=10, warmup_num_steps=2,
                                         weight_decay_incr_style="linear", start_weight_decay=0.0,
                                         end_weight_decay=0.2)
    scheduler.step()
    by_key = {(g["wd_mult"], g["lr_mult"]): (g["lr"], g["weight_decay"]) for g in optimizer.param_groups}
    assert by_key[(1.0, 1.0)] == pytest.approx((1.0, 0.02))
    assert by_key[(1.0, 0.5)] == pytest.approx((0.5, 0.02))
    assert by_key[(0.0, 1.0)] == pytest.approx((1.0, 0.0))


def test_param_groups_refuse_bad_input():
    with pytest.raises(ValueError, match="weight_decay must be a number >= 0"):
        megatron_param_groups(_Net(), weight_decay=-1)
    with pytest.raises(TypeError, match="no_wd_decay_cond must be a function"):
        megatron_param_groups(_Net(), 0.1, no_wd_decay_cond="bias")
    with pytest.raises(ValueError, match="no trainable parameter"):
        megatron_param_groups(nn.Linear(2, 2).requires_grad_(False), 0.1)


# ----------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("kwargs, message", [
    ({"total_num_steps": 10, "lr_decay_style": "sawtooth"},
     "lr_decay_style must be one of 'constant', 'linear', 'cosine', 'inverse-square-root', 'WSD'"),
    ({"total_num_steps": 10, "lr_decay_style": "WSD", "lr_wsd_decay_iters": 2, "lr_wsd_decay_style": "step"},
     "lr_wsd_decay_style must be one of 'exponential', 'linear', 'cosine', 'minus_sqrt'"),
    ({"total_num_steps": 10, "weight_decay_incr_style": "exponential", "start_weight_decay": 0,
      "end_weight_decay": 1}, "weight_decay_incr_style must be one of 'constant', 'linear', 'cosine'"),
    ({"total_num_steps": 10, "warmup_num_steps": 10}, r"warmup \(10\) must be shorter than the lr decay \(10\)"),
    ({"total_num_steps": 10, "lr_decay_iters": 4, "warmup_num_steps": 5}, "must be shorter than the lr decay"),
    ({"total_num_steps": 10, "train_samples": 80}, "counts iterations and train_samples"),
    ({"train_iters": 10, "train_samples": 80}, "Give train_iters .* or train_samples .*, not both"),
    ({"train_samples": 80, "lr_warmup_iters": 2}, "counts iterations but the schedule counts samples"),
    ({"train_iters": 10, "lr_decay_samples": 40}, "counts samples but the schedule counts iterations"),
    ({"train_iters": 10, "lr_decay_iters": 5, "lr_decay_samples": 40}, "lr_decay_iters or lr_decay_samples"),
    ({"total_num_steps": 10, "warmup_num_steps": 2, "lr_warmup_fraction": 0.1}, "both set the warmup"),
    ({"total_num_steps": 10, "lr_warmup_iters": 2, "lr_warmup_fraction": 0.1}, "lr_warmup_fraction .* not both"),
    ({"total_num_steps": 10, "lr_warmup_fraction": 1.0}, "below 1"),
    ({"total_num_steps": 10, "train_iters": 12}, "disagree"),
    ({}, "needs the run's length"),
    ({"total_num_steps": 10, "min_lr": 2.0}, r"min_lr \(2.0\) is above max_lr \(1.0\)"),
    ({"total_num_steps": 10, "max_lr": 0.5, "min_lr": 0.6}, r"min_lr \(0.6\) is above max_lr \(0.5\)"),
    ({"total_num_steps": 10, "lr_warmup_init": 3.0}, "lr_warmup_init"),
    ({"total_num_steps": 10, "lr_decay_style": "WSD"}, "needs the length of its final decay"),
    ({"total_num_steps": 10, "lr_decay_style": "WSD", "warmup_num_steps": 4, "lr_wsd_decay_iters": 7},
     "fit after the warmup"),
    ({"total_num_steps": 10, "lr_wsd_decay_iters": 3}, "only apply to lr_decay_style='WSD'"),
    ({"total_num_steps": 10, "weight_decay_incr_style": "linear"}, "needs both start_weight_decay"),
    ({"total_num_steps": 10, "start_weight_decay": 0.1, "end_weight_decay": 0.2}, "keeps one weight decay"),
    ({"total_num_steps": 10, "weight_decay_incr_style": "cosine", "start_weight_decay": 0.2,
      "end_weight_decay": 0.1}, "must be >= start_weight_decay"),
    ({"total_num_steps": 10, "lr_mult": 2.0}, "megatron_param_groups"),
    ({"total_num_steps": 10, "lr_decay_stlye": "cosine"}, "unknown option.*lr_decay_stlye"),
    ({"total_num_steps": 0}, "train_iters must be a whole number >= 1"),
    ({"total_num_steps": 10, "consumed_samples": 12}, "consumed_samples=12 cannot place"),
])
def test_bad_input_raises_before_the_optimizer_is_touched(kwargs, message):
    optimizer = _optimizer(lr=1.0)
    step_before = optimizer.step
    with pytest.raises(ValueError, match=message):
        MegatronLMDummyScheduler(optimizer, **kwargs)
    assert optimizer.param_groups[0]["lr"] == 1.0 and "initial_lr" not in optimizer.param_groups[0]
    assert optimizer.step == step_before


def test_a_non_optimizer_is_refused():
    with pytest.raises(TypeError, match="torch.optim.Optimizer"):
        MegatronLMDummyScheduler(object(), total_num_steps=3)


# ----------------------------------------------------------------------------- hasten wraps it; resume
def _build(**kwargs):
    model = nn.Linear(3, 1)
    optimizer = torch.optim.SGD(megatron_param_groups(model, 0.01), lr=0.5)
    scheduler = MegatronLMDummyScheduler(optimizer, **kwargs)
    return model, optimizer, scheduler


def test_accelerator_prepares_it_and_the_lr_moves_as_the_closed_form_says():
    accelerator = Accelerator(cpu=True)
    model, optimizer, scheduler = _build(total_num_steps=8, warmup_num_steps=2, lr_decay_style="cosine", min_lr=0.05)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    assert isinstance(scheduler, AcceleratedScheduler)
    assert isinstance(scheduler.scheduler, MegatronParamScheduler)
    seen = []
    for _ in range(9):
        loss = model(torch.ones(2, 3)).pow(2).mean()
        accelerator.backward(loss)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        seen.append(scheduler.get_last_lr()[0])
    expected = [0.25, 0.5] + [0.05 + 0.45 * 0.5 * (1 + math.cos(math.pi * (s - 2) / 6)) for s in range(3, 9)] + [0.05]
    assert seen == pytest.approx(expected)
    assert all(g["lr"] == pytest.approx(expected[-1]) for g in optimizer.optimizer.param_groups)


def test_state_dict_round_trip_resumes_exactly():
    kwargs = dict(train_samples=200, lr_warmup_samples=40, lr_decay_style="cosine", min_lr=0.01,
                  weight_decay_incr_style="linear", start_weight_decay=0.0, end_weight_decay=0.1, samples_per_step=10)
    _, _, original = _build(**kwargs)
    _lrs(original, 7)
    buffer = io.BytesIO()
    torch.save(original.state_dict(), buffer)
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=True)
    _, _, resumed = _build(**kwargs)
    resumed.load_state_dict(saved)
    assert resumed.num_steps == original.num_steps == 70 and resumed.consumed_samples == 70
    assert resumed.get_last_lr() == pytest.approx(original.get_last_lr())
    assert _lrs(resumed, 16) == pytest.approx(_lrs(original, 16))
    for mine, theirs in zip(resumed.optimizer.param_groups, original.optimizer.param_groups):
        assert (mine["lr"], mine["weight_decay"]) == pytest.approx((theirs["lr"], theirs["weight_decay"]))


def test_load_state_dict_refuses_a_foreign_state_and_keeps_its_own():
    _, _, scheduler = _build(total_num_steps=10)
    scheduler.step()
    with pytest.raises(ValueError, match="Not a Megatron scheduler state"):
        scheduler.load_state_dict({"last_epoch": 3, "base_lrs": [0.1]})
    with pytest.raises(ValueError, match="lr_decay_style must be one of"):
        scheduler.load_state_dict(dict(scheduler.state_dict(), schedule=dict(scheduler.state_dict()["schedule"],
                                                                             decay_style="sawtooth")))
    with pytest.raises(ValueError, match="unexpected fields"):
        scheduler.load_state_dict(dict(scheduler.state_dict(), schedule={"decay_steps": 10, "period": 3}))
    assert scheduler.num_steps == 1 and scheduler.schedule.decay_style == "linear"


def test_consumed_samples_starts_a_resumed_run_at_its_place():
    kwargs = dict(total_num_steps=20, warmup_num_steps=4, samples_per_step=8)
    _, _, fresh = _build(**kwargs)
    _lrs(fresh, 6)
    _, _, resumed = _build(consumed_samples=[48, 0, 0], **kwargs)
    assert resumed.num_steps == 6 and resumed.consumed_samples == 48
    assert resumed.get_last_lr() == pytest.approx(fresh.get_last_lr())
    _, _, by_samples = _build(train_samples=160, lr_warmup_samples=32, consumed_samples=48)
    assert by_samples.get_last_lr() == pytest.approx(fresh.get_last_lr())


def test_dummy_scheduler_keeps_accelerates_attributes():
    _, _, scheduler = _build(total_num_steps=12, warmup_num_steps=3, lr_decay_style="cosine")
    assert (scheduler.total_num_steps, scheduler.warmup_num_steps, scheduler.kwargs) == (
        12, 3, {"lr_decay_style": "cosine"})
    assert (scheduler.schedule.decay_steps, scheduler.schedule.warmup_steps, scheduler.unit) == (12, 3, "iterations")


def test_accelerator_save_state_and_load_state_resume_the_schedule(tmp_path):
    kwargs = dict(total_num_steps=12, warmup_num_steps=3, lr_decay_style="cosine", weight_decay_incr_style="linear",
                  start_weight_decay=0.0, end_weight_decay=0.1)
    accelerator = Accelerator(cpu=True)
    model, optimizer, scheduler = accelerator.prepare(*_build(**kwargs))
    for _ in range(5):
        optimizer.step()
        scheduler.step()
    accelerator.save_state(tmp_path / "ckpt")
    expected = [scheduler.get_last_lr()[0]]
    for _ in range(4):
        optimizer.step()
        scheduler.step()
        expected.append(scheduler.get_last_lr()[0])
    accelerator.load_state(tmp_path / "ckpt")
    assert scheduler.num_steps == 5
    seen = [scheduler.get_last_lr()[0]]
    for _ in range(4):
        optimizer.step()
        scheduler.step()
        seen.append(scheduler.get_last_lr()[0])
    assert seen == pytest.approx(expected)
    assert optimizer.optimizer.param_groups[0]["weight_decay"] == pytest.approx(0.1 * 9 / 12)
