"""The Accelerator in one process: preparation, the training step, accumulation, precision, bad input."""
import copy
import pickle

import pytest
import torch
from torch import nn

from hasten import Accelerator, GradientAccumulationPlugin
from hasten.config.kwargs import DistributedDataParallelKwargs, GradScalerKwargs
from hasten.config.resolution import ConfigConflictError
from hasten.optimizer import AcceleratedOptimizer
from hasten.scheduler import AcceleratedScheduler


def make_model(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))


def batches(n=8, size=4, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(size, 4, generator=g), torch.randn(size, 1, generator=g)) for _ in range(n)]


def plain_training(data, accumulation, clip=None):
    """Reference: plain PyTorch on the concatenation of each accumulation cycle's micro-batches."""
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.9)
    for start in range(0, len(data), accumulation):
        cycle = data[start:start + accumulation]
        x = torch.cat([b[0] for b in cycle])
        y = torch.cat([b[1] for b in cycle])
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        if clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
    return model


def hasten_training(data, accumulation, clip=None, **kwargs):
    accelerator = Accelerator(gradient_accumulation_steps=accumulation, **kwargs)
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.9)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    for x, y in data:
        with accelerator.accumulate(model):
            loss = nn.functional.mse_loss(model(x), y)
            accelerator.backward(loss)
            if clip and accelerator.sync_gradients:
                accelerator.clip_grad_norm_(model.parameters(), clip)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
    return accelerator, model, scheduler


@pytest.mark.parametrize("accumulation", [1, 2, 4])
@pytest.mark.parametrize("clip", [None, 0.05])
def test_accumulated_training_equals_big_batches(accumulation, clip):
    data = batches()
    expected = plain_training(data, accumulation, clip)
    accelerator, model, scheduler = hasten_training(data, accumulation, clip)
    for a, b in zip(expected.parameters(), accelerator.unwrap_model(model).parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert scheduler.scheduler.last_epoch == len(data) // accumulation


def test_prepare_keeps_order_types_and_already_prepared_objects():
    accelerator = Accelerator()
    model = make_model()
    optimizer = torch.optim.AdamW(model.parameters())
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    out = accelerator.prepare(scheduler, model, optimizer)
    assert isinstance(out[0], AcceleratedScheduler) and isinstance(out[2], AcceleratedOptimizer)
    assert isinstance(out[1], nn.Module)
    assert accelerator.prepare(out[2]) is out[2] and accelerator.prepare(out[0]) is out[0]
    again = accelerator.prepare(out[1])
    assert again is out[1]
    assert accelerator.prepare_model(out[1]) is out[1]


def test_prepared_objects_carry_the_references_mark_and_a_later_accelerator_keeps_them():
    """transformers reads ``_is_accelerate_prepared`` to skip preparing twice; a prepared loader carries the run's
    ``gradient_state``; an object a previous Accelerator prepared comes back as it is, and is known."""
    from hasten.state import AcceleratorState

    accelerator = Accelerator()
    model = make_model()
    data = torch.utils.data.TensorDataset(torch.randn(8, 4), torch.randn(8, 1))
    model, optimizer, loader = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1),
                                                   torch.utils.data.DataLoader(data, batch_size=4))
    assert all(obj._is_accelerate_prepared is True for obj in (model, optimizer, loader))
    assert loader.gradient_state.__dict__ is accelerator.gradient_state.__dict__  # one shared state
    AcceleratorState._reset_state(True)
    second = Accelerator()
    assert second.prepare(model) is model and model in second._models
    assert second.prepare(optimizer) is optimizer and optimizer in second._optimizers


def test_prepare_warns_about_foreign_optimizers_and_checks_device_placement(caplog):
    # unknown objects pass through prepare() unchanged: tests/accelerator/test_loop_behaviour.py
    accelerator = Accelerator()
    model = make_model()
    other = copy.deepcopy(model)
    with caplog.at_level("WARNING", logger="hasten.accelerator"):
        accelerator.prepare(model, torch.optim.SGD(other.parameters(), lr=0.1))
    assert "none of the parameters" in caplog.text
    with pytest.raises(ValueError, match="device_placement has"):
        accelerator.prepare(make_model(), device_placement=[True, False])


def test_scheduler_needs_its_optimizer_prepared():
    accelerator = Accelerator()
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1)
    with pytest.raises(ValueError, match="optimizer has not been prepared"):
        accelerator.prepare(scheduler)


@pytest.mark.parametrize("kwargs,error,match", [
    ({"mixed_precision": "fp12"}, ValueError, "mixed_precision"),
    ({"gradient_accumulation_steps": 0}, ValueError, "gradient_accumulation_steps"),
    ({"gradient_accumulation_steps": -3}, ValueError, "gradient_accumulation_steps"),
    ({"gradient_accumulation_steps": 2, "gradient_accumulation_plugin": GradientAccumulationPlugin(num_steps=2)},
     ValueError, "not both"),
    ({"fsdp_plugin": object()}, TypeError, "fsdp_plugin must be a FullyShardedDataParallelPlugin"),
    ({"deepspeed_plugin": object()}, TypeError, "must be a DeepSpeedPlugin"),
    ({"megatron_lm_plugin": object()}, TypeError, "megatron_lm_plugin must be a MegatronLMPlugin"),
    ({"log_with": "tensorboard"}, ValueError, "requires a `logging_dir`"),
    ({"kwargs_handlers": ["x"]}, TypeError, "KwargsHandler"),
    ({"kwargs_handlers": [GradScalerKwargs(), GradScalerKwargs()]}, ValueError, "twice|two"),
    ({"rng_types": ["dice"]}, ValueError, "rng type"),
    ({"dynamo_backend": "eager", "dynamo_plugin": object()}, ValueError, "not both"),
])
def test_bad_constructor_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        Accelerator(**kwargs)


def test_launcher_environment_and_conflicts(monkeypatch):
    monkeypatch.setenv("HASTEN_MIXED_PRECISION", "bf16")
    monkeypatch.setenv("HASTEN_GRADIENT_ACCUMULATION_STEPS", "3")
    accelerator = Accelerator()
    assert accelerator.mixed_precision == "bf16" and accelerator.gradient_accumulation_steps == 3
    from hasten.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    with pytest.raises(ConfigConflictError, match="HASTEN_MIXED_PRECISION"):
        Accelerator(mixed_precision="fp16")
    with pytest.raises(ConfigConflictError, match="HASTEN_GRADIENT_ACCUMULATION_STEPS"):
        Accelerator(gradient_accumulation_steps=2)


def test_config_file_named_by_launcher(monkeypatch, tmp_path):
    path = tmp_path / "cfg.yaml"
    path.write_text("compute_environment: LOCAL_MACHINE\ndistributed_type: NO\nmixed_precision: bf16\n"
                    "num_processes: 1\ngradient_accumulation_steps: 2\n")
    monkeypatch.setenv("HASTEN_CONFIG_FILE", str(path))
    accelerator = Accelerator()
    assert accelerator.mixed_precision == "bf16" and accelerator.gradient_accumulation_steps == 2


def test_backward_rejects_non_scalar_loss_and_accepts_gradient():
    accelerator = Accelerator()
    model = accelerator.prepare(make_model())
    out = model(torch.randn(3, 4))
    with pytest.raises(ValueError, match="scalar loss"):
        accelerator.backward(out)
    accelerator.backward(out, gradient=torch.ones_like(out))
    assert model[0].weight.grad is not None
    with pytest.raises(TypeError, match="loss tensor"):
        accelerator.backward(1.0)


def test_bf16_autocast_forward_outputs_fp32_and_unwrap():
    accelerator = Accelerator(mixed_precision="bf16")
    model = make_model()
    seen = []
    model[0].register_forward_hook(lambda module, inputs, output: seen.append(output.dtype))
    prepared = accelerator.prepare(model)
    out = prepared(torch.randn(2, 4))
    assert seen == [torch.bfloat16] and out.dtype == torch.float32
    with accelerator.autocast():
        assert model[0](torch.randn(1, 4)).dtype == torch.bfloat16
    plain = accelerator.unwrap_model(prepared, keep_fp32_wrapper=False)
    assert "forward" not in plain.__dict__
    assert plain(torch.randn(2, 4)).dtype == torch.float32 and seen[-1] == torch.float32
    wrapped = accelerator.prepare(make_model(1))  # a prepared model with its autocast forward pickles
    restored = pickle.loads(pickle.dumps(wrapped))
    x = torch.randn(2, 4)
    torch.testing.assert_close(restored(x), wrapped(x))


def test_fp16_on_cpu_warns_scales_and_skips_overflow_steps():
    from hasten.precision import autocast as precision

    precision._WARNED.clear()
    with pytest.warns(UserWarning, match="fp16 mixed precision on the CPU"):
        accelerator = Accelerator(mixed_precision="fp16", kwargs_handlers=[GradScalerKwargs(init_scale=1024.0)])
    assert accelerator.scaler is not None and accelerator.scaler.get_scale() == 1024.0
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    before = [p.detach().clone() for p in model.parameters()]
    loss = model(torch.randn(2, 4)).float().sum() * float("inf")
    accelerator.backward(loss)
    optimizer.step()
    assert optimizer.step_was_skipped and accelerator.optimizer_step_was_skipped
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    optimizer.zero_grad()
    accelerator.backward(model(torch.randn(2, 4)).float().mean())
    norm = accelerator.clip_grad_norm_(model.parameters(), 1.0)
    assert torch.isfinite(norm)
    optimizer.step()
    assert not optimizer.step_was_skipped


def test_scheduler_does_not_step_when_optimizer_skipped_or_accumulating():
    accelerator = Accelerator(gradient_accumulation_steps=2)
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    lrs = []
    for x, y in batches(4):
        with accelerator.accumulate(model):
            accelerator.backward(nn.functional.mse_loss(model(x), y))
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            lrs.append(scheduler.get_last_lr()[0])
    assert lrs == [1.0, 0.5, 0.5, 0.25]


def test_clip_during_accumulation_is_skipped():
    accelerator = Accelerator(gradient_accumulation_steps=2)
    model = accelerator.prepare(make_model())
    with accelerator.accumulate(model):
        accelerator.backward(model(torch.randn(2, 4)).sum())
        assert not accelerator.sync_gradients
        grads = [p.grad.clone() for p in model.parameters()]
        assert accelerator.clip_grad_norm_(model.parameters(), 1e-6) is None
        assert all(torch.equal(g, p.grad) for g, p in zip(grads, model.parameters()))


def test_token_level_loss_equals_one_big_batch():
    """Padded sequences of different lengths: summed loss / tokens of the whole cycle == one big batch."""
    torch.manual_seed(0)
    vocab, steps = 7, 3
    sequences = [torch.randint(0, vocab, (length,)) for length in (5, 2, 7, 3, 6, 1)]

    def padded(group):
        width = max(len(s) for s in group)
        return torch.stack([nn.functional.pad(s, (0, width - len(s)), value=-100) for s in group])

    micro = [padded(sequences[i:i + 2]) for i in range(0, len(sequences), 2)]  # 3 micro-batches
    embedding = nn.Embedding(vocab, vocab)

    def loss_sum(model, labels):
        logits = model(labels.clamp(min=0))
        return nn.functional.cross_entropy(logits.reshape(-1, vocab), labels.reshape(-1), ignore_index=-100,
                                           reduction="sum")

    big = copy.deepcopy(embedding)
    flat = torch.cat([m.reshape(-1) for m in micro])
    nn.functional.cross_entropy(big(flat.clamp(min=0)), flat, ignore_index=-100).backward()

    accelerator = Accelerator(gradient_accumulation_steps=steps)
    model = accelerator.prepare(copy.deepcopy(embedding))
    total_tokens = sum(int((m != -100).sum()) for m in micro)
    for labels in micro:
        with accelerator.accumulate(model):
            accelerator.backward(loss_sum(model, labels), num_items_in_batch=total_tokens)
    torch.testing.assert_close(model.weight.grad, big.weight.grad)
    # the naive way (mean per micro-batch / steps) is what this feature fixes: it differs here
    naive = copy.deepcopy(embedding)
    for labels in micro:
        (nn.functional.cross_entropy(naive(labels.clamp(min=0)).reshape(-1, vocab), labels.reshape(-1),
                                     ignore_index=-100) / steps).backward()
    assert not torch.allclose(naive.weight.grad, big.weight.grad)
    with pytest.raises(ValueError, match="num_items_in_batch"):
        accelerator.backward(loss_sum(model, micro[0]), num_items_in_batch=0)


def test_gather_reduce_trigger_single_process():
    accelerator = Accelerator()
    t = torch.arange(3.0)
    assert torch.equal(accelerator.gather(t), t)
    assert torch.equal(accelerator.gather_for_metrics(t), t)
    assert accelerator.gather_for_metrics(["a", "b"]) == ["a", "b"]
    assert torch.equal(accelerator.reduce(t), t)
    assert not accelerator.check_trigger()
    accelerator.set_trigger()
    assert accelerator.check_trigger() and not accelerator.check_trigger()


def test_optimizer_wrapper_is_picklable_and_delegates():
    accelerator = Accelerator()
    model = make_model()
    model, optimizer = accelerator.prepare(model, torch.optim.Adam(model.parameters(), lr=0.01))
    accelerator.backward(model(torch.randn(2, 4)).sum())
    optimizer.step()
    state = optimizer.state_dict()
    assert state["param_groups"][0]["lr"] == 0.01 and len(state["state"]) == 4
    restored = pickle.loads(pickle.dumps(optimizer))
    assert isinstance(restored, AcceleratedOptimizer) and restored.param_groups[0]["lr"] == 0.01


def test_dynamo_plugin_whole_and_regional():
    from hasten import TorchDynamoPlugin

    accelerator = Accelerator(dynamo_plugin=TorchDynamoPlugin(backend="eager"))
    model = make_model()
    x = torch.randn(2, 4)
    expected = model(x)
    compiled = accelerator.prepare(model)
    assert type(compiled).__name__ == "OptimizedModule"
    torch.testing.assert_close(compiled(x), expected)
    assert accelerator.unwrap_model(compiled, keep_torch_compile=False) is model


def test_regional_compilation_compiles_each_block_and_can_be_removed():
    import torch._dynamo
    from torch._dynamo.utils import counters

    from hasten import TorchDynamoPlugin

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Linear(4, 8)
            self.blocks = nn.ModuleList([nn.Sequential(nn.Linear(8, 8), nn.ReLU()) for _ in range(4)])

        def forward(self, x):
            x = self.embed(x)
            for block in self.blocks:
                x = block(x)
            return x

    torch._dynamo.reset()
    counters.clear()
    accelerator = Accelerator(dynamo_plugin=TorchDynamoPlugin(backend="eager", use_regional_compilation=True))
    model = Net()
    x = torch.randn(2, 4)
    expected = model(x)
    prepared = accelerator.prepare(model)
    assert prepared is model  # compiled in place: parameters and optimizers untouched
    torch.testing.assert_close(prepared(x), expected)
    assert all(block._compiled_call_impl is not None for block in model.blocks)
    assert counters["stats"]["unique_graphs"] <= 2  # one graph for the 4 identical blocks, one for the embedding
    plain = accelerator.unwrap_model(prepared, keep_torch_compile=False)
    assert all(block._compiled_call_impl is None for block in plain.blocks)


def test_find_executable_batch_size_frees_prepared_objects():
    accelerator = Accelerator()
    tried = []

    @accelerator.find_executable_batch_size(starting_batch_size=16)
    def train(batch_size):
        accelerator.prepare(make_model())
        tried.append((batch_size, len(accelerator._models)))
        if batch_size > 12:
            raise RuntimeError("CUDA out of memory.")
        return batch_size

    assert train() == 12
    assert tried == [(16, 1), (14, 1), (12, 1)]


def test_profile_records_operations(tmp_path):
    from hasten.config.kwargs import ProfileKwargs

    accelerator = Accelerator()
    with accelerator.profile(ProfileKwargs(activities=["cpu"], output_trace_dir=str(tmp_path))) as prof:
        torch.ones(8).sum()
    assert any("aten::sum" in event.name for event in prof.events())
    assert (tmp_path / "trace_rank0.json").exists()


def test_ddp_kwargs_are_kept_for_the_strategy():
    handler = DistributedDataParallelKwargs(find_unused_parameters=True)
    accelerator = Accelerator(kwargs_handlers=[handler])
    assert accelerator.strategy.handlers[DistributedDataParallelKwargs] is handler


def test_local_sgd_single_process_and_validation():
    from hasten import LocalSGD

    accelerator = Accelerator()
    model = accelerator.prepare(make_model())
    with LocalSGD(accelerator, model, local_sgd_steps=2) as local:
        local.step()
        local.step()
    assert local.num_steps == 2
    with pytest.raises(ValueError, match="local_sgd_steps"):
        LocalSGD(accelerator, model, local_sgd_steps=0)


def test_end_of_loader_forces_a_sync_and_restarts_the_cycle():
    accelerator = Accelerator(gradient_accumulation_steps=2)
    model = make_model()
    loader = torch.utils.data.DataLoader(torch.randn(5, 4), batch_size=1)
    model, loader = accelerator.prepare(model, loader)
    for _ in range(2):  # two epochs: the second starts a fresh cycle
        syncs = []
        for x in loader:
            with accelerator.accumulate(model):
                accelerator.backward(model(x).sum())
                syncs.append(accelerator.sync_gradients)
        assert syncs == [False, True, False, True, True]


def test_tqdm_is_disabled_off_the_main_process(monkeypatch):
    from hasten.state import PartialState
    from hasten.utils import tqdm

    PartialState()
    assert not tqdm(range(3)).disable
    monkeypatch.setitem(PartialState._shared_state, "local_process_index", 1)
    assert tqdm(range(3)).disable and not tqdm(range(3), main_process_only=False).disable


def test_default_config_values_do_not_contradict_code(monkeypatch, tmp_path):
    """A config written by `hasten config default` says mixed_precision: no; choosing bf16 in code is fine."""
    from hasten.utils import write_basic_config

    path = tmp_path / "default_config.yaml"
    write_basic_config(save_location=str(path))
    monkeypatch.setenv("HASTEN_CONFIG_FILE", str(path))
    assert Accelerator(mixed_precision="bf16").mixed_precision == "bf16"


def test_launcher_flag_over_config_file_is_not_a_conflict(monkeypatch, tmp_path):
    """`hasten launch --config_file cfg --mixed_precision bf16` with cfg saying fp16: the flag already won."""
    path = tmp_path / "cfg.yaml"
    path.write_text("distributed_type: NO\nmixed_precision: fp16\nnum_processes: 1\n")
    monkeypatch.setenv("HASTEN_CONFIG_FILE", str(path))
    monkeypatch.setenv("HASTEN_MIXED_PRECISION", "bf16")
    assert Accelerator().mixed_precision == "bf16"


def test_step_counter_is_the_accumulation_position():
    accelerator = Accelerator(gradient_accumulation_steps=3)
    model = accelerator.prepare(make_model())
    for _ in range(2):
        with accelerator.accumulate(model):
            pass
    assert accelerator.step == 2
    accelerator.step = 0
    with accelerator.accumulate(model):
        assert not accelerator.sync_gradients and accelerator.step == 1


def test_a_skipped_optimizer_step_leaves_the_scheduler_where_it_is():
    """An overflowed (skipped) step must not advance the schedule; the flag is the reference's ``_is_overflow``,
    which scripts and tests set themselves."""
    accelerator = Accelerator()
    model = nn.Linear(2, 4)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda=lambda n: 1 - n / 10)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    optimizer._is_overflow = False
    scheduler.step()
    assert scheduler.get_last_lr()[0] == 0.9
    optimizer._is_overflow = True
    assert optimizer.step_was_skipped and accelerator.optimizer_step_was_skipped
    scheduler.step()
    assert scheduler.get_last_lr()[0] == 0.9
