"""Pipeline-parallel inference (``prepare_pippy``): argument checks, one-process behaviour, tracing, and (launched
on 2 processes) outputs equal to one process's plain forward."""
from __future__ import annotations

import inspect

import pytest
import torch
import torch.distributed as dist
from helpers import run_launch
from torch import nn

import hasten
from hasten import inference
from hasten.state import PartialState
from hasten.strategies.model_parallel import pipeline_inference
from hasten.strategies.model_parallel.pipeline_inference import (
    PipelineInputError,
    _trace,
    _TracedInputs,
)


class Stack(nn.Module):
    def __init__(self, width: int = 8):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(width, width) for _ in range(4)])
        self.head = nn.Linear(width, 3)

    def forward(self, x, scale=None, flag=False):
        if scale is not None:
            x = x * scale
        for layer in self.layers:
            x = torch.relu(layer(x))
        return self.head(x) * (2 if flag else 1)


class LateInput(Stack):
    def forward(self, x, scale=None, flag=False):
        for layer in self.layers:
            x = torch.relu(layer(x))
        return self.head(x * scale)


class DataDependent(Stack):
    def forward(self, x, scale=None, flag=False):
        if x.sum() > 0:  # torch.export cannot capture a branch on a tensor's value
            x = -x
        return super().forward(x)


EXAMPLE = (torch.randn(2, 8),)


def _no_process_group() -> bool:
    return not dist.is_initialized() and not PartialState._shared_state


# ----------------------------------------------------------------------------- the face and the signatures
def test_inference_re_exports_the_implementation():
    for name in inference.__all__:
        assert getattr(inference, name) is getattr(pipeline_inference, name)
    assert hasten.prepare_pippy is pipeline_inference.prepare_pippy


@pytest.mark.parametrize("name", ["prepare_pippy", "build_pipeline", "pippy_forward"])
def test_signatures_match_the_reference(name):
    reference = pytest.importorskip("accelerate.inference")

    def described(function):
        return [(p.name, p.kind, p.default) for p in inspect.signature(function).parameters.values()]

    assert described(getattr(inference, name)) == described(getattr(reference, name))


# ----------------------------------------------------------------------------- one process
def test_one_process_runs_the_model_whole():
    torch.manual_seed(0)
    model = Stack().eval()
    batch = torch.randn(4, 8)
    expected = model(batch)
    prepared = pipeline_inference.prepare_pippy(model, example_args=EXAMPLE, gather_output=True)
    assert prepared is model and model.hf_split_points == [] and model.pippy_stage is None
    assert model._original_forward.__func__ is Stack.forward and model._original_call.__func__ is nn.Module.__call__
    assert model.forward.__wrapped__ is model._original_forward
    assert torch.equal(model(batch), expected)
    assert not dist.is_initialized()


def test_one_process_unwrapping_puts_the_forward_back():
    from hasten.utils import extract_model_from_parallel

    model = pipeline_inference.prepare_pippy(Stack(), example_args=EXAMPLE)
    extract_model_from_parallel(model, keep_fp32_wrapper=False)
    assert "forward" not in model.__dict__


def test_one_process_batch_must_divide_by_num_chunks():
    model = pipeline_inference.prepare_pippy(Stack(), example_args=EXAMPLE, num_chunks=2)
    assert model(torch.randn(4, 8)).shape == (4, 3)
    with pytest.raises(ValueError, match="batch size 3 does not divide by num_chunks=2"):
        model(torch.randn(3, 8))


def test_pippy_forward_and_build_pipeline_on_one_process():
    model = Stack()
    batch = torch.randn(3, 8)
    assert torch.equal(inference.pippy_forward(model, 1, False, batch), model(batch))
    with pytest.raises(ValueError, match="one pipeline stage per process"):
        inference.build_pipeline(model, [], EXAMPLE, None, 1)
    assert not dist.is_initialized()


# ----------------------------------------------------------------------------- refusals before any process group
@pytest.mark.parametrize("num_chunks", [0, -1, True, 2.5, "2"])
def test_num_chunks_must_be_a_whole_number_of_at_least_one(num_chunks):
    with pytest.raises(ValueError, match="num_chunks"):
        pipeline_inference.prepare_pippy(Stack(), example_args=EXAMPLE, num_chunks=num_chunks)
    with pytest.raises(ValueError, match="num_chunks"):
        inference.pippy_forward(Stack(), num_chunks, False, torch.randn(2, 8))


@pytest.mark.parametrize("kwargs, error, phrases", [
    ({"split_points": ["layers.1"]}, ValueError, ["has 1 name(s)", "1 process(es)", "needs exactly 0"]),
    ({"split_points": ["layer.1"]}, ValueError, ["name no module", "'layers.1'", "'head'"]),
    ({"split_points": [""]}, ValueError, ["name no module"]),
    ({"split_points": "layers.1"}, TypeError, ["'auto' or a list of module names"]),
    ({"split_points": [1]}, TypeError, ["'auto' or a list of module names"]),
    ({"example_args": ()}, ValueError, ["example_args", "example_kwargs"]),
    ({"example_args": torch.randn(2, 8)}, TypeError, ["tuple"]),
    ({"example_kwargs": [torch.randn(2, 8)]}, TypeError, ["dict"]),
])
def test_bad_arguments_are_refused_on_one_process(kwargs, error, phrases):
    kwargs = {"example_args": EXAMPLE, **kwargs}
    model = Stack()
    with pytest.raises(error) as raised:
        pipeline_inference.prepare_pippy(model, **kwargs)
    for phrase in phrases:
        assert phrase in str(raised.value)
    assert "forward" not in model.__dict__ and not hasattr(model, "hf_split_points")
    assert _no_process_group()


def test_a_module_that_is_not_a_model_and_a_model_prepared_twice_are_refused():
    with pytest.raises(TypeError, match="nn.Module"):
        pipeline_inference.prepare_pippy(lambda x: x, example_args=EXAMPLE)
    model = pipeline_inference.prepare_pippy(Stack(), example_args=EXAMPLE)
    with pytest.raises(ValueError, match="already prepared"):
        pipeline_inference.prepare_pippy(model, example_args=EXAMPLE)


def test_split_points_are_checked_against_the_world_size_before_the_process_group(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "3")  # launched-looking, but no process group may be created to refuse
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(ValueError, match=r"3 process\(es\).*needs exactly 2"):
        pipeline_inference.prepare_pippy(Stack(), split_points=["layers.1"], example_args=EXAMPLE)
    with pytest.raises(ValueError, match="more than once"):
        pipeline_inference.prepare_pippy(Stack(), split_points=["layers.1", "layers.1"], example_args=EXAMPLE)
    with pytest.raises(ValueError, match="no balanced split"):
        pipeline_inference.prepare_pippy(nn.Sequential(nn.Linear(4, 4)), example_args=(torch.randn(1, 4),))
    with pytest.raises(ValueError, match="num_chunks"):
        pipeline_inference.prepare_pippy(Stack(), split_points=["layers.1", "layers.2"], example_args=EXAMPLE,
                                         num_chunks=0)
    assert _no_process_group()


# ----------------------------------------------------------------------------- tracing (no process group needed)
def test_tracing_leaves_the_model_as_it_was_and_can_be_repeated():
    model = Stack()
    for _ in range(2):  # torch's split marks would otherwise wrap a module's forward twice and recurse
        pipe = _trace(model, ["layers.2"], EXAMPLE, {})
        assert pipe.num_stages == 2
        assert all("forward" not in module.__dict__ and "_orig_forward" not in module.__dict__
                   for module in model.modules())
    batch = torch.randn(2, 8)
    assert torch.equal(model(batch), Stack.forward(model, batch))


def test_a_model_torch_export_cannot_capture_is_refused_clearly():
    model = DataDependent()
    with pytest.raises(RuntimeError, match="could not trace DataDependent with torch.export"):
        _trace(model, ["layers.2"], EXAMPLE, {})
    assert all("forward" not in module.__dict__ for module in model.modules())


def test_traced_inputs_check_each_call():
    pipe = _trace(Stack(), ["layers.2"], EXAMPLE, {"scale": torch.rand(2, 1), "flag": True})
    traced = _TracedInputs(pipe, EXAMPLE, {"scale": torch.rand(2, 1), "flag": True}, num_chunks=2)
    batch, scale = torch.randn(4, 8), torch.rand(4, 1)
    assert set(traced.first_stage_inputs((batch,), {"scale": scale, "flag": True})) == {"x", "scale"}
    with pytest.raises(PipelineInputError, match="does not divide by num_chunks=2"):
        traced.first_stage_inputs((batch[:3],), {"scale": scale[:3], "flag": True})
    with pytest.raises(PipelineInputError, match=r"shape\(s\) \[\(6, 8\)\].*needs \[\(4, 8\)\]"):
        traced.first_stage_inputs((batch[:2].repeat(3, 1),), {"scale": scale[:2].repeat(3, 1), "flag": True})
    with pytest.raises(PipelineInputError, match="'flag' was True in the example and is False now"):
        traced.first_stage_inputs((batch,), {"scale": scale, "flag": False})
    with pytest.raises(PipelineInputError, match="does not match the inputs the pipeline was traced with"):
        traced.first_stage_inputs((batch,), {})


def test_an_input_whose_name_fx_renames_reaches_the_first_stage():
    """nn.Sequential's input is named ``input``, which fx renames ``input_1`` inside the traced graph; the first
    stage still receives the call's tensor (it was refused as "not among the traced model's inputs")."""
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 3))
    pipe = _trace(model, ["2"], EXAMPLE, {})
    traced = _TracedInputs(pipe, EXAMPLE, {}, num_chunks=2)
    batch = torch.randn(4, 8)
    first_stage = pipe.get_stage_module(0)
    for call in (((batch,), {}), ((), {"input": batch})):
        inputs = traced.first_stage_inputs(*call)
        assert torch.equal(first_stage(**inputs), model[1](model[0](batch)))


def test_an_input_used_after_a_split_point_is_refused():
    kwargs = {"scale": torch.rand(2, 1)}
    pipe = _trace(LateInput(), ["layers.2"], EXAMPLE, kwargs)
    with pytest.raises(ValueError, match=r"\['scale'\] are used by later pipeline stages"):
        _TracedInputs(pipe, EXAMPLE, kwargs, num_chunks=2)


# ----------------------------------------------------------------------------- two processes
def test_two_processes_match_one_process_forward():
    """An MLP, a tiny GPT-2 and a tiny Llama (built from configs) on a 2-stage pipeline give one process's outputs;
    refusals on every process. (The strategy conformance suite runs its MLP, on trained checkpoints' weights.)"""
    result = run_launch("check_pipeline_inference.py", num_processes=2)
    for process in (0, 1):
        assert f"PASSED pipeline inference on process {process}" in result.stdout, result.stdout[-3000:]
