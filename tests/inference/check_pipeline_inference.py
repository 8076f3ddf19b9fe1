"""Launched on 2 processes by test_pipeline_inference.py: prepare_pippy's outputs equal one process's plain forward
(an MLP, a tiny GPT-2 and a tiny Llama built from configs), and its refusals are raised on every process."""
from __future__ import annotations

import copy

import torch
from torch import nn

from hasten import PartialState
from hasten.inference import prepare_pippy

state = PartialState()
LAST = state.num_processes - 1


class Stack(nn.Module):
    """Four linear layers and a head; ``scale`` (optional) multiplies the input, before the first split point."""

    def __init__(self, width: int = 8):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(width, width) for _ in range(4)])
        self.head = nn.Linear(width, 3)

    def forward(self, x, scale=None):
        if scale is not None:
            x = x * scale
        for layer in self.layers:
            x = torch.relu(layer(x))
        return self.head(x)


class LateInput(Stack):
    """``scale`` is used after the layers, so after any split point: torch gives inputs to the first stage only."""

    def forward(self, x, scale=None):
        for layer in self.layers:
            x = torch.relu(layer(x))
        return self.head(x * scale)


def close(a, b, what):
    assert a.shape == b.shape, (what, a.shape, b.shape)
    assert torch.allclose(a, b, atol=1e-5, rtol=1e-5), (what, (a - b).abs().max())


def only_on_last(output, expected, what):
    if state.process_index == LAST:
        assert output is not None, f"{what}: no output on the last process"
        close(output, expected, what)
    else:
        assert output is None, f"{what}: an output on process {state.process_index}"


def refused(call, *phrases):
    try:
        call()
    except (ValueError, TypeError) as error:
        for phrase in phrases:
            assert phrase in str(error), (phrase, str(error))
        return error
    raise AssertionError(f"not refused: expected {phrases}")


def check_stack_auto():
    torch.manual_seed(0)
    model = Stack().eval()
    plain = copy.deepcopy(model)
    batch = torch.randn(4, 8)
    expected = plain(batch)
    model = prepare_pippy(model, example_args=(batch[:2],))  # num_chunks defaults to 2: micro-batches of 2
    assert len(model.hf_split_points) == 1 and model.hf_split_points[0].startswith("layers."), model.hf_split_points
    assert model.pippy_stage is not None and model._original_forward is not None
    assert model.forward.__wrapped__ is model._original_forward
    # torch's split marks are taken off the model again
    assert all("forward" not in module.__dict__ and "_orig_forward" not in module.__dict__
               for module in list(model.modules())[1:])
    only_on_last(model(batch), expected, "Stack auto")
    second = torch.randn(4, 8)
    only_on_last(model(second), plain(second), "Stack, second call")
    print("check stack auto: ok", flush=True)


def check_list_split_points_chunks_and_gather():
    torch.manual_seed(1)
    model = Stack().eval()
    plain = copy.deepcopy(model)
    batch, scale = torch.randn(8, 8), torch.rand(8, 1)
    model = prepare_pippy(model, split_points=["layers.3"], example_args=(batch[:2],),
                          example_kwargs={"scale": scale[:2]}, num_chunks=4, gather_output=True)
    assert model.hf_split_points == ["layers.3"]
    output = model(batch, scale=scale)
    close(output, plain(batch, scale=scale), f"gather_output on process {state.process_index}")
    print("check list split points, 4 chunks, kwargs, gather_output: ok", flush=True)
    return model, plain, batch, scale


def check_call_refusals(model, plain, batch, scale):
    # every process raises (the first process refuses, the others are told): no process waits for a micro-batch
    refused(lambda: model(batch[:6], scale=scale[:6]), "batch size 6 does not divide by num_chunks=4")
    twelve, twelve_scales = torch.cat([batch, batch[:4]]), torch.cat([scale, scale[:4]])
    refused(lambda: model(twelve, scale=twelve_scales), "shape(s) [(12, 8)]", "needs [(8, 8)]")
    refused(lambda: model(batch), "does not match the inputs the pipeline was traced with")
    close(model(batch, scale=scale), plain(batch, scale=scale), "after refusals")
    print("check call refusals: ok", flush=True)


def check_prepare_refusals():
    torch.manual_seed(2)
    example = (torch.randn(2, 8),)
    refused(lambda: prepare_pippy(Stack(), split_points=["layers.1", "layers.2"], example_args=example),
            "needs exactly 1", "2 process")
    refused(lambda: prepare_pippy(Stack(), split_points=[], example_args=example), "needs exactly 1")
    refused(lambda: prepare_pippy(Stack(), split_points=["layer.1"], example_args=example),
            "name no module", "layers.1")
    refused(lambda: prepare_pippy(Stack(), num_chunks=0, example_args=example), "num_chunks")
    refused(lambda: prepare_pippy(Stack()), "example_args")
    refused(lambda: prepare_pippy(LateInput(), split_points=["layers.2"], example_args=example,
                                  example_kwargs={"scale": torch.rand(2, 1)}), "['scale']", "first stage only")
    model = prepare_pippy(Stack(), example_args=example)
    refused(lambda: prepare_pippy(model, example_args=example), "already prepared")
    print("check prepare refusals: ok", flush=True)


def check_transformers():
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(3)
    ids = torch.randint(0, 96, (4, 8), generator=torch.Generator().manual_seed(4))
    # use_cache left on (transformers' default): prepare_pippy turns it off, a cache cannot cross stages
    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=4, n_embd=32, n_head=2, vocab_size=96, n_positions=16,
                                      bos_token_id=0, eos_token_id=0)).eval()
    with torch.no_grad():
        expected = gpt2(ids).logits
    gpt2 = prepare_pippy(gpt2, example_args=(ids[:2],), no_split_module_classes=gpt2._no_split_modules)
    assert gpt2.hf_split_points[0].startswith("transformer.h."), gpt2.hf_split_points
    assert gpt2.config.use_cache is False
    only_on_last(gpt2(ids), expected, "tiny GPT-2 (tied embeddings, cache on), auto split")

    # BERT hands its expanded attention mask (a view, not contiguous) from stage to stage
    from transformers import BertConfig, BertForMaskedLM

    torch.manual_seed(6)
    bert = BertForMaskedLM(BertConfig(num_hidden_layers=4, hidden_size=32, intermediate_size=64,
                                      num_attention_heads=2, vocab_size=96, max_position_embeddings=16)).eval()
    with torch.no_grad():
        expected = bert(ids).logits
    bert = prepare_pippy(bert, example_args=(ids[:2],), no_split_module_classes=bert._no_split_modules)
    only_on_last(bert(ids), expected, "tiny BERT (a view between stages), auto split")

    torch.manual_seed(5)
    llama = LlamaForCausalLM(LlamaConfig(num_hidden_layers=4, hidden_size=32, intermediate_size=64,
                                         num_attention_heads=2, num_key_value_heads=2, vocab_size=96,
                                         max_position_embeddings=16, use_cache=False, bos_token_id=0,
                                         eos_token_id=0, pad_token_id=0)).eval()
    mask = torch.ones_like(ids)
    mask[1, :2] = 0
    with torch.no_grad():
        expected = llama(input_ids=ids, attention_mask=mask).logits
    llama = prepare_pippy(llama, split_points=["model.layers.2"],
                          example_kwargs={"input_ids": ids[:2], "attention_mask": mask[:2]}, gather_output=True)
    close(llama(input_ids=ids, attention_mask=mask), expected, "tiny Llama with a mask, gather_output")
    print("check transformers: ok", flush=True)


if __name__ == "__main__":
    assert state.num_processes == 2, state.num_processes
    check_stack_auto()
    check_call_refusals(*check_list_split_points_chunks_and_gather())
    check_prepare_refusals()
    check_transformers()
    state.wait_for_everyone()
    print(f"PASSED pipeline inference on process {state.process_index}", flush=True)
