"""fp8 training through torchao (``mixed_precision="fp8"``), on the CPU as the reference accepts it: which layers
become ``Float8Linear``, the ``AORecipeKwargs`` the run is given, and the recipes hasten refuses before any state
exists."""
import pytest
import torch
from torch import nn

from hasten import Accelerator
from hasten.config.fp8 import AORecipeKwargs, FP8BackendType, MSAMPRecipeKwargs, TERecipeKwargs
from hasten.core.planned import NotYetSupportedError
from hasten.state import AcceleratorState, PartialState

from fp8_by_hand import train_by_hand
from helpers import run_launch

float8 = pytest.importorskip("torchao.float8")  # the fp8 extra, installed by make test


@pytest.fixture(autouse=True)
def fresh_state(monkeypatch):
    for name in ("HASTEN_FP8_BACKEND", "ACCELERATE_FP8_BACKEND", "HASTEN_MIXED_PRECISION",
                 "ACCELERATE_MIXED_PRECISION"):
        monkeypatch.delenv(name, raising=False)
    AcceleratorState._reset_state(True)
    yield
    AcceleratorState._reset_state(True)


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 48),
                         nn.ReLU(), nn.Linear(48, 16))


def _kinds(model):
    return [type(m).__name__ for m in model if not isinstance(m, nn.ReLU)]


def test_fp8_trains_on_the_cpu_with_the_middle_layers_in_fp8():
    accelerator = Accelerator(mixed_precision="fp8")
    assert accelerator.fp8_backend == FP8BackendType.AO and accelerator.mixed_precision == "fp8"
    model = _mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)  # built before prepare, on the plain layers
    model, optimizer = accelerator.prepare(model, optimizer)
    # the first and last linear layers stay in higher precision, the ones between are torchao's
    assert _kinds(model) == ["Linear", "Float8Linear", "Float8Linear", "Linear"]
    # the optimizer steps the parameters the model now holds (torchao wrapped the fp8 weights in new ones)
    trained = {id(p) for group in optimizer.param_groups for p in group["params"]}
    assert trained == {id(p) for p in model.parameters()}
    x, y = torch.randn(64, 16), torch.randn(64, 16)
    assert model(x).dtype == torch.float32  # outputs come back in fp32, as with bf16
    for _ in range(5):
        loss = nn.functional.mse_loss(model(x), y)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
    # the same numbers as torchao and torch by hand, exactly
    expected = train_by_hand(_mlp(), ("2", "4"), 5, x, y).state_dict()
    got = accelerator.get_state_dict(model)
    assert set(got) == set(expected)
    for key in expected:
        assert type(got[key]) in (torch.Tensor, nn.Parameter), type(got[key])  # plain tensors for the files
        assert torch.equal(got[key], expected[key]), key


@pytest.mark.deepspeed
def test_fp8_runs_on_two_processes_under_ddp_fsdp2_and_deepspeed(tmp_path):
    """DDP equals one process by hand; FSDP2 (fp8 all-gather) trains; DeepSpeed ZeRO-2 / ZeRO-3 equal a bf16 engine
    on the layers converted by hand; each resumes from its checkpoint."""
    result = run_launch("check_fp8_processes.py", tmp_path, num_processes=2, timeout=500,
                        preload=("torchao.float8", "deepspeed"))  # what the script imports as it goes
    assert "fp8 under DDP equals one process by hand" in result.stdout
    assert "fp8 under FSDP2 trains and resumes" in result.stdout
    for stage in (2, 3):
        assert f"fp8 under ZeRO-{stage} equals the layers converted by hand, and resumes" in result.stdout


def test_the_recipes_filter_and_config_are_the_ones_used():
    config = float8.Float8LinearConfig(pad_inner_dim=True)
    recipe = AORecipeKwargs(config=config, module_filter_func=lambda module, fqn: fqn == "4")
    accelerator = Accelerator(mixed_precision="fp8", kwargs_handlers=[recipe])
    model = accelerator.prepare(_mlp())
    assert _kinds(model) == ["Linear", "Linear", "Float8Linear", "Linear"]
    assert model[4].config is config


def test_a_recipe_without_a_config_gets_one_built_from_its_options():
    recipe = AORecipeKwargs(pad_inner_dim=False, enable_fsdp_float8_all_gather=False)
    Accelerator(mixed_precision="fp8", kwargs_handlers=[recipe])
    assert isinstance(recipe.config, float8.Float8LinearConfig)
    assert recipe.config.pad_inner_dim is False and recipe.config.enable_fsdp_float8_all_gather is False


def test_a_model_already_in_fp8_is_not_converted_again():
    model = float8.convert_to_float8_training(_mlp())  # every layer, the first and last too
    accelerator = Accelerator(mixed_precision="fp8", kwargs_handlers=[AORecipeKwargs(module_filter_func=None)])
    model = accelerator.prepare(model)
    assert _kinds(model) == ["Float8Linear"] * 4


@pytest.mark.parametrize("recipe", [AORecipeKwargs, TERecipeKwargs, MSAMPRecipeKwargs])
def test_a_recipe_without_fp8_is_refused_before_any_state(recipe):
    with pytest.raises(ValueError, match=r"requires setting `mixed_precision='fp8'`.*" + recipe.__name__):
        Accelerator(mixed_precision="bf16", kwargs_handlers=[recipe()])
    assert not AcceleratorState._shared_state and not PartialState._shared_state


@pytest.mark.parametrize("recipe, library", [(TERecipeKwargs, "TransformerEngine"), (MSAMPRecipeKwargs, "MS-AMP")])
def test_recipes_of_libraries_not_run_yet_say_so(recipe, library):
    with pytest.raises(NotYetSupportedError, match=f"fp8 training with {library}.*torchao"):
        Accelerator(mixed_precision="fp8", kwargs_handlers=[recipe()])
    assert not AcceleratorState._shared_state


def test_the_fp8_backend_variable(monkeypatch):
    monkeypatch.setenv("ACCELERATE_FP8_BACKEND", "TE")
    with pytest.raises(NotYetSupportedError, match="TransformerEngine"):
        Accelerator(mixed_precision="fp8")
    monkeypatch.setenv("ACCELERATE_FP8_BACKEND", "fp4")
    with pytest.raises(ValueError, match="ACCELERATE_FP8_BACKEND='FP4'.*'AO'"):
        Accelerator(mixed_precision="fp8")
    monkeypatch.setenv("ACCELERATE_FP8_BACKEND", "ao")
    assert Accelerator(mixed_precision="fp8").fp8_backend == FP8BackendType.AO
    AcceleratorState._reset_state(True)
    monkeypatch.setenv("ACCELERATE_FP8_BACKEND", "TE")  # read only when fp8 trains
    assert Accelerator(mixed_precision="bf16").fp8_backend == FP8BackendType.NO


def test_two_recipes_are_refused():
    with pytest.raises(ValueError, match="more than one fp8 recipe"):
        Accelerator(mixed_precision="fp8", kwargs_handlers=[AORecipeKwargs(), TERecipeKwargs()])
