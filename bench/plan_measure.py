"""Launched by bench_plan.py (``hasten launch -n N bench/plan_measure.py CASES.json OUT.json``): each case trained
for real through hasten's ``Accelerator`` on this job's gloo processes, and each rank's peak of live tensor memory
measured over the first three optimizer steps.

The measure is a dispatch mode that sees every tensor storage PyTorch's operators create on this thread (the model's
weights included: it is entered before the model is built) and counts its bytes until the storage is freed: the
quantity a GPU's ``max_memory_allocated`` counts, less the allocator's rounding, and independent of the device. Its
peak is the steps' (what ``prepare()`` leaves behind counted, its own moment not): the plan predicts the steps, and
``prepare()`` on CPU processes holds the model built whole beside its shards in the one memory they share.
"""
from __future__ import annotations

import contextlib
import json
import sys
import weakref
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass
from torch.utils._pytree import tree_leaves

sys.path.insert(0, str(Path(__file__).resolve().parent))
from plan_models import build_model, make_batch  # noqa: E402


class LiveStorage(TorchDispatchMode):
    """Bytes of the tensor storages alive now, and the most alive at once (``peak``). A storage resized in place
    (FSDP frees a gathered parameter with ``storage.resize_(0)`` and gathers into it again) counts its new size."""

    def __init__(self) -> None:
        super().__init__()
        self.live: dict[int, int] = {}
        self.current = 0
        self.peak = 0

    def _free(self, key: int) -> None:
        self.current -= self.live.pop(key, 0)

    def _track(self, tensor: torch.Tensor) -> None:
        if getattr(tensor, "is_fake", False) or tensor.device.type == "meta":
            return
        if is_traceable_wrapper_subclass(tensor):  # a DTensor: its memory is its local tensor's
            attributes, _ = tensor.__tensor_flatten__()
            for name in attributes:
                inner = getattr(tensor, name)
                if isinstance(inner, torch.Tensor):
                    self._track(inner)
            return
        try:
            storage = tensor.untyped_storage()
        except (RuntimeError, NotImplementedError):
            return
        try:
            if storage.data_ptr() == 0:
                return  # no memory: a wrapper subclass's (DTensor's) own storage, or an empty tensor
        except RuntimeError:
            return  # a wrapper subclass's storage that has no data at all
        key = storage._cdata
        if key in self.live:
            return
        self.live[key] = storage.nbytes()
        self.current += self.live[key]
        self.peak = max(self.peak, self.current)
        weakref.finalize(storage, self._free, key)

    def _resized(self, storage: torch.UntypedStorage, size: int) -> None:
        key = storage._cdata
        if key in self.live:
            self.current += size - self.live[key]
            self.live[key] = size
            self.peak = max(self.peak, self.current)

    def __enter__(self):
        original = torch.UntypedStorage.resize_
        tracker = self

        def resize_(storage, size):
            result = original(storage, size)
            tracker._resized(storage, int(size))
            return result

        self._original_resize = original
        torch.UntypedStorage.resize_ = resize_
        return super().__enter__()

    def __exit__(self, *exc):
        torch.UntypedStorage.resize_ = self._original_resize
        return super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for leaf in tree_leaves(out):
            if isinstance(leaf, torch.Tensor):
                self._track(leaf)
        return out


#: the plan families hasten runs with an FSDP plugin
FSDP_FAMILIES = ("fsdp2", "hsdp", "fsdp2_tp", "cp", "fsdp1")


def _accelerator(case: dict):
    """The ``Accelerator`` of the case's layout (its ``family`` and degrees, as the plan's row names them)."""
    from hasten import Accelerator, DeepSpeedPlugin, FullyShardedDataParallelPlugin, ParallelismConfig
    from hasten.planning.launch_config import FSDP1_OPTIONS

    family, precision, processes = case["family"], case["precision"], case["processes"]
    if family == "zero":
        plugin = DeepSpeedPlugin(zero_stage=case["zero_stage"], gradient_accumulation_steps=1)
        plugin.deepspeed_config["train_micro_batch_size_per_gpu"] = case["mb"]  # no loader is prepared
        return Accelerator(mixed_precision=precision, deepspeed_plugin=plugin)
    sizes = {}
    if family == "hsdp":
        sizes = dict(dp_replicate_size=2, dp_shard_size=processes // 2)
    elif family == "tp":
        sizes = dict(tp_size=case["tp"], dp_replicate_size=processes // case["tp"])
    elif family == "fsdp2_tp":
        sizes = dict(tp_size=case["tp"], dp_shard_size=processes // case["tp"])
    elif family == "cp":
        sizes = dict(cp_size=case["cp"], dp_shard_size=processes // case["cp"])
    parallelism = {"parallelism_config": ParallelismConfig(**sizes)} if sizes else {}
    if family in FSDP_FAMILIES or (family == "tp" and case["ac"]):  # TP takes activation checkpointing from it
        version1 = dict(FSDP1_OPTIONS) if family == "fsdp1" else {}  # as the config the plan writes
        plugin = FullyShardedDataParallelPlugin(fsdp_version=1 if family == "fsdp1" else 2,
                                                auto_wrap_policy="transformer_based_wrap" if case["blocks"] else None,
                                                transformer_cls_names_to_wrap=case["blocks"] or None,
                                                activation_checkpointing=case["ac"], **version1)
        return Accelerator(mixed_precision=precision, fsdp_plugin=plugin, **parallelism)
    return Accelerator(mixed_precision=precision, **parallelism)


def _checkpoint_blocks(model, blocks: list) -> None:
    """Activation checkpointing on the model's blocks, as FSDP's plugin applies it, for layouts without one."""
    from hasten.config.fsdp import FullyShardedDataParallelPlugin
    from hasten.strategies.fsdp.wrapping import apply_activation_checkpointing, wrap_policy, wrap_units

    plugin = FullyShardedDataParallelPlugin(fsdp_version=2, auto_wrap_policy="transformer_based_wrap",
                                            transformer_cls_names_to_wrap=blocks)
    apply_activation_checkpointing(model, wrap_units(model, wrap_policy(model, plugin)))


def measure(case: dict) -> int:
    from hasten.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=False)
    GradientState._reset_state()
    torch.manual_seed(0)
    tracker = LiveStorage()
    family = case["family"]
    fsdp = family in FSDP_FAMILIES
    with tracker:
        accelerator = _accelerator(case)
        model = build_model(case["model"])
        if case["ac"] and not fsdp and family != "tp":
            _checkpoint_blocks(model, case["blocks"])
        foreach = {"foreach": True} if family in ("single", "ddp", "zero") else {}  # as the plan traces them
        optimizer = torch.optim.AdamW(model.parameters(), **foreach)
        model, optimizer = accelerator.prepare(model, optimizer)
        tracker.peak = tracker.current  # the steps' peak from here (the module docstring)
        for _ in range(3):
            batch = make_batch(case["model"], case["mb"], case["seq_len"])
            if family == "cp" and isinstance(batch, dict):  # each rank computes on its share of the sequence
                positions = torch.arange(case["seq_len"]).expand(case["mb"], -1).clone()
                batch["position_ids"] = positions
                split = accelerator.maybe_context_parallel(buffers=[batch["input_ids"], batch["labels"], positions],
                                                           buffer_seq_dims=[1, 1, 1])
            elif family == "cp":
                split = accelerator.maybe_context_parallel(buffers=[batch], buffer_seq_dims=[1])
            else:
                split = contextlib.nullcontext()
            with split:
                with accelerator.autocast():
                    output = model(**batch) if isinstance(batch, dict) else model(batch)
                loss = output.loss if hasattr(output, "loss") else output.float().sum()
                accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            del batch, output, loss
        peak = tracker.peak
        del model, optimizer
        accelerator.free_memory()
    return peak


def main() -> None:
    import torch.distributed as dist

    from hasten.state import PartialState

    cases = json.loads(Path(sys.argv[1]).read_text())
    state = PartialState()
    peaks = []
    for case in cases:
        peak = torch.tensor([measure(case)], dtype=torch.float64)
        gathered = [torch.zeros_like(peak) for _ in range(state.num_processes)]
        dist.all_gather(gathered, peak)
        peaks.append(max(int(value.item()) for value in gathered))  # the highest rank's
    if state.is_main_process:
        Path(sys.argv[2]).write_text(json.dumps(peaks))
    state.wait_for_everyone()
    state.destroy_process_group()


if __name__ == "__main__":
    main()
