"""Training-step memory by category: the prediction on fake tensors equals the measurement on real ones."""
import dataclasses

import pytest
import torch
from torch import nn

from hasten.planning import MemoryBreakdown, training_step_memory
from hasten.planning.torch_tools import MEMORY_CATEGORIES


def mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 64))


def mlp_batch() -> torch.Tensor:
    return torch.randn(32, 64)


def parameter_bytes(model: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


@pytest.mark.parametrize("mixed_precision", ["no", "bf16"])
def test_the_prediction_is_the_measurement_and_adds_up(mixed_precision):
    predicted = training_step_memory(mlp, mlp_batch, mixed_precision=mixed_precision)
    measured = training_step_memory(mlp, mlp_batch, mixed_precision=mixed_precision, fake=False)
    assert predicted == measured
    weights = parameter_bytes(mlp())
    assert predicted.parameters == weights and predicted.gradients == weights  # fp32 weights and gradients
    assert predicted.optimizer_state >= 2 * weights  # AdamW's two moments (and its step's temporaries)
    assert predicted.peak == sum(getattr(predicted, field.name) for field in dataclasses.fields(MemoryBreakdown))
    assert set(MEMORY_CATEGORIES.values()) == {field.name for field in dataclasses.fields(MemoryBreakdown)}
    assert predicted.as_dict()["peak"] == predicted.peak


def test_the_optimizer_decides_the_optimizer_state():
    weights = parameter_bytes(mlp())
    plain_sgd = training_step_memory(mlp, mlp_batch, optimizer=torch.optim.SGD, optimizer_kwargs={"lr": 0.1})
    momentum = training_step_memory(mlp, mlp_batch, optimizer=torch.optim.SGD,
                                    optimizer_kwargs={"lr": 0.1, "momentum": 0.9})
    adamw = training_step_memory(mlp, mlp_batch)
    assert plain_sgd.optimizer_state < weights <= momentum.optimizer_state < adamw.optimizer_state
    assert plain_sgd.peak < momentum.peak < adamw.peak


def test_a_bigger_batch_takes_more_activation_memory():
    small = training_step_memory(mlp, lambda: torch.randn(8, 64))
    large = training_step_memory(mlp, lambda: torch.randn(512, 64))
    assert large.activations > small.activations and large.peak > small.peak
    assert large.parameters == small.parameters  # the breakdown is the one at the peak, which may come earlier


def test_a_model_too_large_for_this_machine_plans_on_fake_tensors():
    huge = training_step_memory(lambda: nn.Linear(65536, 65536), lambda: torch.randn(2, 65536),
                                optimizer=torch.optim.SGD, optimizer_kwargs={"lr": 0.1}, steps=1)
    assert huge.parameters == (65536 * 65536 + 65536) * 4  # 16 GiB of weights, never allocated
    assert isinstance(huge, MemoryBreakdown)


def test_bad_arguments_are_refused_before_anything_runs():
    with pytest.raises(ValueError, match="mixed_precision"):
        training_step_memory(mlp, mlp_batch, mixed_precision="fp8")
    with pytest.raises(ValueError, match="steps"):
        training_step_memory(mlp, mlp_batch, steps=0)


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_tiny_transformers_models_predicted_exactly(family):
    transformers = pytest.importorskip("transformers")
    if family == "gpt2":
        config = transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=128, n_positions=64,
                                         bos_token_id=0, eos_token_id=0)
        build = lambda: transformers.GPT2LMHeadModel(config)  # noqa: E731
    else:
        config = transformers.LlamaConfig(num_hidden_layers=1, hidden_size=32, intermediate_size=64,
                                          num_attention_heads=2, num_key_value_heads=1, vocab_size=128,
                                          max_position_embeddings=64)
        build = lambda: transformers.LlamaForCausalLM(config)  # noqa: E731

    def batch() -> dict:
        ids = torch.randint(0, 128, (2, 32))
        return {"input_ids": ids, "labels": ids}

    for mixed_precision in ("no", "bf16"):
        predicted = training_step_memory(build, batch, mixed_precision=mixed_precision)
        measured = training_step_memory(build, batch, mixed_precision=mixed_precision, fake=False)
        assert predicted == measured, mixed_precision
        assert predicted.activations > 0 and predicted.parameters == parameter_bytes(build())


def test_the_last_output_is_alive_through_the_optimizer_step_as_in_a_training_loop():
    batch, width = 64, 4096  # the output (1 MiB in fp32) outweighs the model's state
    phases = training_step_memory(lambda: nn.Linear(8, width), lambda: torch.randn(batch, 8), by_phase=True)
    weights = 8 * width * 4 + width * 4
    output = batch * width * 4
    step = phases["optimizer"]
    assert step.parameters == weights and step.optimizer_state >= 2 * weights
    assert step.activations + step.temporaries >= output  # the loop's `outputs` has not been released yet
