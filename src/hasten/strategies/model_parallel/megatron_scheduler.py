"""Megatron-LM's learning-rate and weight-decay schedule as plain math, and a torch scheduler that applies it.

Megatron anneals two values of every param group per optimizer step: the learning rate (a linear warmup from
``lr_warmup_init`` to the group's maximum, then a decay style down to ``min_lr``, held there once the decay is over)
and the weight decay (an increment from ``start_weight_decay`` to ``end_weight_decay`` over the whole run). A group
may carry ``lr_mult`` / ``wd_mult`` (``megatron_param_groups`` builds such groups) and its own ``max_lr`` / ``min_lr``
/ ``start_wd`` / ``end_wd``. A schedule counts optimizer iterations or consumed samples; both give the same curve when
samples = iterations * global batch size. Nothing here imports megatron: any torch optimizer works.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from numbers import Real
from typing import Any, Optional, Sequence, Union

import torch
from torch.optim.lr_scheduler import LRScheduler

__all__ = [
    "LR_DECAY_STYLES", "WSD_DECAY_STYLES", "WEIGHT_DECAY_INCR_STYLES", "MegatronSchedule", "resolve_megatron_schedule",
    "MegatronParamScheduler", "annealing_coefficient",
]

LR_DECAY_STYLES = ("constant", "linear", "cosine", "inverse-square-root", "WSD")
WSD_DECAY_STYLES = ("exponential", "linear", "cosine", "minus_sqrt")
WEIGHT_DECAY_INCR_STYLES = ("constant", "linear", "cosine")
ITERATIONS, SAMPLES = "iterations", "samples"


def annealing_coefficient(style: str, ratio: float) -> float:
    """How much of the way from the low value to the high one remains: 1 at ``ratio`` 0, 0 at ``ratio`` 1."""
    if style == "linear":
        return 1.0 - ratio
    if style == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * ratio))
    if style == "exponential":
        return 2.0 * 0.5 ** ratio - 1.0
    if style == "minus_sqrt":
        return 1.0 - math.sqrt(ratio)
    raise ValueError(f"Unknown annealing style {style!r}: use one of linear, cosine, exponential, minus_sqrt.")


def _choice(name: str, value, accepted: Sequence[str]) -> str:
    if value not in accepted:
        raise ValueError(f"{name} must be one of {', '.join(repr(a) for a in accepted)}; got {value!r}.")
    return value


def _number(name: str, value, minimum: float = 0.0) -> float:
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value) or value < minimum:
        raise ValueError(f"{name} must be a finite number >= {minimum}; got {value!r}.")
    return float(value)


def _count(name: str, value, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be a whole number >= {minimum}; got {value!r}.")
    return value


@dataclass(frozen=True)
class MegatronSchedule:
    """One Megatron schedule; every length is in the schedule's unit (iterations or samples).

    ``lr(step, max_lr, min_lr)`` and ``weight_decay(step, start, end)`` are its closed forms: the value after
    ``step`` units, for one param group. Fields are checked when built; a bad one raises ``ValueError``.
    """

    decay_steps: float
    warmup_steps: float = 0.0
    decay_style: str = "linear"
    min_lr: float = 0.0
    warmup_init_lr: float = 0.0
    wsd_decay_steps: Optional[float] = None
    wsd_decay_style: str = "exponential"
    wd_incr_steps: Optional[float] = None
    wd_incr_style: str = "constant"
    start_wd: Optional[float] = None
    end_wd: Optional[float] = None

    def __post_init__(self):
        _choice("lr_decay_style", self.decay_style, LR_DECAY_STYLES)
        _choice("lr_wsd_decay_style", self.wsd_decay_style, WSD_DECAY_STYLES)
        _choice("weight_decay_incr_style", self.wd_incr_style, WEIGHT_DECAY_INCR_STYLES)
        decay = _number("the lr decay length", self.decay_steps)
        warmup = _number("the lr warmup length", self.warmup_steps)
        if decay <= 0:
            raise ValueError(f"The lr decay length must be positive; got {self.decay_steps!r}.")
        if warmup >= decay:
            raise ValueError(f"The lr warmup ({self.warmup_steps:g}) must be shorter than the lr decay "
                             f"({self.decay_steps:g}): shorten the warmup or lengthen lr_decay_iters / "
                             "lr_decay_samples (which default to the whole run).")
        _number("min_lr", self.min_lr)
        _number("lr_warmup_init", self.warmup_init_lr)
        self._check_wsd(decay, warmup)
        self._check_weight_decay()

    def _check_wsd(self, decay: float, warmup: float) -> None:
        if self.decay_style != "WSD":
            if self.wsd_decay_steps is not None:
                raise ValueError("lr_wsd_decay_iters / lr_wsd_decay_samples only apply to lr_decay_style='WSD'; "
                                 f"this schedule is {self.decay_style!r}.")
            return
        if self.wsd_decay_steps is None:
            raise ValueError("lr_decay_style='WSD' needs the length of its final decay: give lr_wsd_decay_iters "
                             "(iteration schedule) or lr_wsd_decay_samples (sample schedule).")
        wsd = _number("the WSD decay length", self.wsd_decay_steps)
        if not 0 < wsd <= decay - warmup:
            raise ValueError(f"The WSD decay length must be positive and fit after the warmup, at most "
                             f"{decay - warmup:g} (decay {decay:g} - warmup {warmup:g}); got {wsd:g}.")

    def _check_weight_decay(self) -> None:
        start, end = self.start_wd, self.end_wd
        if start is not None:
            _number("start_weight_decay", start)
        if end is not None:
            _number("end_weight_decay", end)
        if self.wd_incr_style == "constant":
            if start is not None and end is not None and start != end:
                raise ValueError(f"weight_decay_incr_style='constant' keeps one weight decay, but "
                                 f"start_weight_decay={start} and end_weight_decay={end} differ: make them equal or "
                                 "use 'linear' / 'cosine'.")
            return
        if start is None or end is None:
            raise ValueError(f"weight_decay_incr_style={self.wd_incr_style!r} needs both start_weight_decay and "
                             "end_weight_decay.")
        if end < start:
            raise ValueError(f"The weight decay increases over the run (Megatron's weight_decay_incr_style): "
                             f"end_weight_decay ({end}) must be >= start_weight_decay ({start}).")
        if self.wd_incr_steps is None or _number("the weight decay increment length", self.wd_incr_steps) <= 0:
            raise ValueError(f"The weight decay increment length must be positive; got {self.wd_incr_steps!r}.")

    def lr(self, step: float, max_lr: float, min_lr: Optional[float] = None) -> float:
        """The learning rate after ``step`` units, for a group whose peak is ``max_lr`` (``min_lr``: the floor)."""
        floor = self.min_lr if min_lr is None else min_lr
        if self.warmup_steps > 0 and step <= self.warmup_steps:
            return self.warmup_init_lr + (max_lr - self.warmup_init_lr) * step / self.warmup_steps
        if self.decay_style == "constant":
            return max_lr
        if step > self.decay_steps:
            return floor
        if self.decay_style == "inverse-square-root":
            return max(floor, max_lr * math.sqrt(max(self.warmup_steps, 1.0) / max(step, 1.0)))
        if self.decay_style == "WSD":
            anneal_start = self.decay_steps - self.wsd_decay_steps
            coefficient = 1.0 if step <= anneal_start else annealing_coefficient(
                self.wsd_decay_style, (step - anneal_start) / self.wsd_decay_steps)
        else:
            ratio = (step - self.warmup_steps) / (self.decay_steps - self.warmup_steps)
            coefficient = annealing_coefficient(self.decay_style, ratio)
        return floor + coefficient * (max_lr - floor)

    def weight_decay(self, step: float, start: Optional[float] = None, end: Optional[float] = None) -> Optional[float]:
        """The weight decay after ``step`` units (before a group's ``wd_mult``); None when none is scheduled."""
        start = self.start_wd if start is None else start
        end = self.end_wd if end is None else end
        if start is None and end is None:
            return None
        if start is None or end is None or self.wd_incr_style == "constant":
            return end if end is not None else start
        if step > self.wd_incr_steps:
            return end
        return end - annealing_coefficient(self.wd_incr_style, step / self.wd_incr_steps) * (end - start)


def _pick(what: str, iters, samples, unit: str, default=None, zero_is_unset: bool = False):
    """The one length of ``what`` in ``unit``: refuses it in both units, or in the other unit than the schedule's."""
    given_iters = iters is not None and not (zero_is_unset and iters == 0)
    given_samples = samples is not None and not (zero_is_unset and samples == 0)
    if given_iters and given_samples:
        raise ValueError(f"Give {what}_iters or {what}_samples, not both.")
    if unit == ITERATIONS and given_samples:
        raise ValueError(f"{what}_samples={samples} counts samples but the schedule counts iterations (train_iters): "
                         f"give {what}_iters, or make the schedule sample-based with train_samples.")
    if unit == SAMPLES and given_iters:
        raise ValueError(f"{what}_iters={iters} counts iterations but the schedule counts samples (train_samples): "
                         f"give {what}_samples, or make the schedule iteration-based with train_iters.")
    value = iters if unit == ITERATIONS else samples
    return value if (value is not None and not (zero_is_unset and value == 0)) else default


def resolve_megatron_schedule(*, train_iters: Optional[int] = None, train_samples: Optional[int] = None,
                              lr_decay_iters: Optional[int] = None, lr_decay_samples: Optional[int] = None,
                              lr_warmup_iters: Optional[int] = None, lr_warmup_samples: Optional[int] = None,
                              lr_warmup_fraction: Optional[float] = None, lr_decay_style: str = "linear",
                              min_lr: float = 0.0, lr_warmup_init: float = 0.0,
                              lr_wsd_decay_iters: Optional[int] = None, lr_wsd_decay_samples: Optional[int] = None,
                              lr_wsd_decay_style: str = "exponential", weight_decay_incr_style: str = "constant",
                              start_weight_decay: Optional[float] = None,
                              end_weight_decay: Optional[float] = None) -> tuple[MegatronSchedule, str]:
    """Megatron's arguments -> (the schedule, its unit: ``"iterations"`` or ``"samples"``), as Megatron resolves them.

    The run's length is ``train_iters`` or ``train_samples`` (exactly one). The decay lasts ``lr_decay_*`` (default:
    the whole run); the warmup lasts ``lr_warmup_*`` or ``lr_warmup_fraction`` of the decay; the weight decay
    increments over the whole run. Lengths in the other unit than the run's are refused.
    """
    if train_iters is not None and train_samples is not None:
        raise ValueError(f"Give train_iters ({train_iters}) or train_samples ({train_samples}), not both: the "
                         "schedule counts iterations or consumed samples.")
    if train_iters is None and train_samples is None:
        raise ValueError("The schedule needs the run's length: give train_iters (or total_num_steps) for an "
                         "iteration-based schedule, or train_samples for a sample-based one.")
    unit = ITERATIONS if train_iters is not None else SAMPLES
    total = _count("train_iters" if unit == ITERATIONS else "train_samples",
                   train_iters if unit == ITERATIONS else train_samples, minimum=1)
    decay = _count("lr_decay_iters" if unit == ITERATIONS else "lr_decay_samples",
                   _pick("lr_decay", lr_decay_iters, lr_decay_samples, unit, default=total), minimum=1)
    warmup = _pick("lr_warmup", lr_warmup_iters, lr_warmup_samples, unit, default=0, zero_is_unset=True)
    if lr_warmup_fraction is not None:
        if warmup:
            raise ValueError(f"Give lr_warmup_fraction ({lr_warmup_fraction}) or lr_warmup_iters / "
                             f"lr_warmup_samples ({warmup}), not both.")
        fraction = _number("lr_warmup_fraction", lr_warmup_fraction)
        if fraction >= 1:
            raise ValueError(f"lr_warmup_fraction is the share of the decay spent warming up, below 1; got "
                             f"{lr_warmup_fraction}.")
        warmup = fraction * decay
    else:
        warmup = _count(f"lr_warmup_{'iters' if unit == ITERATIONS else 'samples'}", warmup)
    wsd = _pick("lr_wsd_decay", lr_wsd_decay_iters, lr_wsd_decay_samples, unit)
    schedule = MegatronSchedule(
        decay_steps=decay, warmup_steps=warmup, decay_style=lr_decay_style,
        min_lr=_number("min_lr", 0.0 if min_lr is None else min_lr),
        warmup_init_lr=_number("lr_warmup_init", 0.0 if lr_warmup_init is None else lr_warmup_init),
        wsd_decay_steps=wsd, wsd_decay_style=lr_wsd_decay_style or "exponential", wd_incr_steps=total,
        wd_incr_style=weight_decay_incr_style or "constant", start_wd=start_weight_decay, end_wd=end_weight_decay)
    return schedule, unit


def _set_value(group: dict, key: str, value: float) -> None:
    """Write ``value`` into ``group[key]``, in place where the optimizer keeps it as a tensor (capturable, fused)."""
    if isinstance(group.get(key), torch.Tensor):
        group[key].fill_(value)
    else:
        group[key] = value


def _as_float(value) -> float:
    return float(value.item()) if isinstance(value, torch.Tensor) else float(value)


class MegatronParamScheduler(LRScheduler):
    """Sets every param group's ``lr`` and ``weight_decay`` from a Megatron schedule, one ``step()`` at a time.

    Parameters (Megatron's names; see ``resolve_megatron_schedule`` for the schedule's own):
        optimizer: any ``torch.optim.Optimizer``.
        max_lr: the peak learning rate; default: each group's initial ``lr`` (a group's ``max_lr`` key wins).
        samples_per_step: samples one ``step()`` consumes (the global batch size). A sample-based schedule advances
            by it when ``step()`` gets no ``increment``; an iteration-based one uses it to report
            ``consumed_samples``.
        consumed_samples: where a resumed run starts (an int, or Megatron's per-loader list: its first entry).

    ``step(increment=None)`` advances by ``increment`` units (default: one iteration, or ``samples_per_step``
    samples). A group's lr is ``schedule.lr(...) * lr_mult``; when a weight decay is scheduled (``start_weight_decay``
    / ``end_weight_decay``, or a group's ``start_wd`` / ``end_wd``) its weight decay is ``schedule * wd_mult``,
    otherwise the group's ``weight_decay`` is left as built. ``load_state_dict`` restores the position and the
    schedule saved in the checkpoint (the checkpoint's values win, as Megatron's default does).
    """

    def __init__(self, optimizer: torch.optim.Optimizer, *, max_lr: Optional[float] = None,
                 samples_per_step: Optional[int] = None, consumed_samples: Union[int, Sequence[int], None] = None,
                 **schedule_args: Any):
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"A Megatron schedule drives a torch.optim.Optimizer's param groups; got "
                            f"{type(optimizer).__name__}.")
        schedule, unit = resolve_megatron_schedule(**schedule_args)
        if max_lr is not None:
            max_lr = _number("max_lr", max_lr)
        if samples_per_step is not None:
            samples_per_step = _count("samples_per_step", samples_per_step, minimum=1)
        self.schedule, self.unit, self.max_lr, self.samples_per_step = schedule, unit, max_lr, samples_per_step
        for index, group in enumerate(optimizer.param_groups):
            self._check_group(index, group)
        self.num_steps = self._start(consumed_samples)
        self._started = False
        super().__init__(optimizer)  # records each group's initial_lr, then applies the schedule at num_steps

    def _start(self, consumed_samples) -> Union[int, float]:
        if isinstance(consumed_samples, (list, tuple)):
            consumed_samples = consumed_samples[0] if consumed_samples else None
        if consumed_samples is None:
            return 0
        consumed = _count("consumed_samples", consumed_samples)
        if self.unit == SAMPLES:
            return consumed
        if consumed == 0:
            return 0
        if self.samples_per_step is None or consumed % self.samples_per_step:
            raise ValueError(f"consumed_samples={consumed} cannot place an iteration-based schedule: give "
                             "samples_per_step (the global batch size) dividing it, or a sample-based schedule "
                             "(train_samples).")
        return consumed // self.samples_per_step

    def _group_max_lr(self, group: dict) -> float:
        if "max_lr" in group:
            return _as_float(group["max_lr"])
        if self.max_lr is not None:
            return self.max_lr
        return _as_float(group.get("initial_lr", group["lr"]))

    def _check_group(self, index: int, group: dict) -> None:
        peak = self._group_max_lr(group)
        floor = self.schedule.min_lr if group.get("min_lr") is None else group["min_lr"]
        if floor > peak:
            raise ValueError(f"min_lr ({floor}) is above max_lr ({peak}) for param group {index}: lower min_lr or "
                             "raise max_lr (default: the group's lr).")
        if self.schedule.warmup_init_lr > peak:
            raise ValueError(f"lr_warmup_init ({self.schedule.warmup_init_lr}) is above max_lr ({peak}) for param "
                             f"group {index}: the warmup rises to max_lr.")
        for key in ("lr_mult", "wd_mult"):
            _number(f"param group {index}'s {key}", group.get(key, 1.0))

    # ---------------------------------------------------------------- stepping
    def get_lr(self) -> list[float]:
        """Each group's learning rate at the current position (what the last ``step()`` set)."""
        return [self.schedule.lr(self.num_steps, self._group_max_lr(group), group.get("min_lr"))
                * group.get("lr_mult", 1.0) for group in self.optimizer.param_groups]

    def step(self, increment: Optional[int] = None) -> None:
        if not self._started:  # the base class's first call: apply the schedule where it starts
            self._started, increment = True, 0
        elif increment is None:
            if self.unit == SAMPLES and self.samples_per_step is None:
                raise ValueError("This schedule counts samples: call step(increment=global_batch_size), or build it "
                                 "with samples_per_step=<global batch size>.")
            increment = 1 if self.unit == ITERATIONS else self.samples_per_step
        else:
            increment = _count("step(increment=...)", increment)
        self.num_steps += increment
        self.last_epoch += 1
        self._step_count = getattr(self, "_step_count", 0) + 1
        self._apply()

    def _apply(self) -> None:
        for group, lr in zip(self.optimizer.param_groups, self.get_lr()):
            _set_value(group, "lr", lr)
            decay = self.schedule.weight_decay(self.num_steps, group.get("start_wd"), group.get("end_wd"))
            if decay is not None:
                _set_value(group, "weight_decay", decay * group.get("wd_mult", 1.0))
        self._last_lr = [_as_float(group["lr"]) for group in self.optimizer.param_groups]

    @property
    def consumed_samples(self) -> Optional[int]:
        """Samples consumed so far; None for an iteration schedule without ``samples_per_step``."""
        if self.unit == SAMPLES:
            return self.num_steps
        return None if self.samples_per_step is None else self.num_steps * self.samples_per_step

    # ---------------------------------------------------------------- checkpoints
    def state_dict(self) -> dict:
        """The position and the schedule, as plain numbers and strings (safe for ``weights_only`` loading)."""
        return {"num_steps": self.num_steps, "unit": self.unit, "schedule": dataclasses.asdict(self.schedule),
                "max_lr": self.max_lr, "samples_per_step": self.samples_per_step, "last_epoch": self.last_epoch,
                "_step_count": self._step_count, "_last_lr": list(self._last_lr)}

    def load_state_dict(self, state_dict: dict) -> None:
        """Resume from ``state_dict``: its schedule and position replace this one's and the groups are set again."""
        missing = [key for key in ("num_steps", "unit", "schedule") if key not in (state_dict or {})]
        if missing:
            raise ValueError(f"Not a Megatron scheduler state: it lacks {', '.join(missing)} (got keys "
                             f"{sorted(state_dict or {})}).")
        unit = _choice("the saved unit", state_dict["unit"], (ITERATIONS, SAMPLES))
        try:
            schedule = MegatronSchedule(**state_dict["schedule"])
        except TypeError as error:
            raise ValueError(f"The saved Megatron schedule has unexpected fields: {error}.") from None
        num_steps = _number("the saved num_steps", state_dict["num_steps"])
        self.schedule, self.unit = schedule, unit
        self.num_steps = int(num_steps) if float(num_steps).is_integer() else num_steps
        self.max_lr = state_dict.get("max_lr", self.max_lr)
        self.samples_per_step = state_dict.get("samples_per_step", self.samples_per_step)
        self.last_epoch = state_dict.get("last_epoch", self.last_epoch)
        self._step_count = state_dict.get("_step_count", self._step_count)
        self._apply()
