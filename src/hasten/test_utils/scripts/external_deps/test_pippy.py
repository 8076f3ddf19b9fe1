"""Pipeline-parallel inference of transformers models with ``prepare_pippy`` (Accelerate's multi-device suite launches
this file, ``test_utils/scripts/external_deps/test_pippy.py``), one stage per process, on two or more processes
(GPUs, or CPU processes over gloo).

A BERT masked-language model and a GPT-2 sequence classifier, built from their configs (no download), are traced
on one micro-batch of random token ids, split with ``split_points="auto"`` keeping each model's
``_no_split_modules`` whole, and called on one micro-batch per process. The output must come on the last process
only, and equal the whole model's own output there (within 1e-4); every other process gets ``None``.

The models have the configs' default sizes and sequence lengths (BERT-base, 512 tokens; GPT-2, 1024), as the
reference's script; ``--tiny`` checks two-layer versions (for CPUs). Run: ``hasten launch -n 2 <this file>``.
"""
from __future__ import annotations

import argparse
from copy import deepcopy

import torch

from hasten.collectives.random import set_seed
from hasten.state import PartialState
from hasten.strategies.model_parallel.pipeline_inference import prepare_pippy

TINY = {"num_hidden_layers": 2, "hidden_size": 32, "num_attention_heads": 2, "intermediate_size": 64,
        "vocab_size": 128, "max_position_embeddings": 64}
TINY_GPT2 = {"n_layer": 2, "n_embd": 32, "n_head": 2, "vocab_size": 128, "n_positions": 64}


def build(name: str, tiny: bool):
    """The model (in eval mode) and the sequence length it is checked at."""
    from transformers import (
        BertConfig,
        BertForMaskedLM,
        GPT2Config,
        GPT2ForSequenceClassification,
    )

    if name == "bert":
        config = BertConfig(**TINY) if tiny else BertConfig()
        return BertForMaskedLM(config).eval(), 32 if tiny else 512
    config = GPT2Config(**TINY_GPT2) if tiny else GPT2Config()
    return GPT2ForSequenceClassification(config).eval(), 32 if tiny else 1024


def output_tensor(output) -> torch.Tensor:
    """The logits: of a model output, or the pipeline's first (here only) output tensor."""
    if isinstance(output, torch.Tensor):
        return output
    if hasattr(output, "logits"):
        return output.logits
    return output_tensor(output[0])


def check(name: str, tiny: bool) -> None:
    state = PartialState()
    set_seed(42)
    model, length = build(name, tiny)
    vocab = model.config.vocab_size
    example = torch.randint(0, vocab, (1, length), generator=torch.Generator().manual_seed(0))
    inputs = torch.randint(0, vocab, (state.num_processes, length), generator=torch.Generator().manual_seed(1))
    whole = deepcopy(model) if state.is_last_process else None
    model = prepare_pippy(model, example_args=(example,), no_split_module_classes=model._no_split_modules)
    with torch.no_grad():
        output = model(inputs.to(state.device))
    if not state.is_last_process:
        assert output is None, f"{name}: process {state.process_index} (not the last) received an output"
        return
    assert output is not None, f"{name}: the last process received no output"
    with torch.no_grad():
        # one sample at a time, as the pipeline's micro-batches (GPT-2 without a pad token takes batches of one)
        expected = torch.cat([output_tensor(whole(sample[None])) for sample in inputs])
    torch.testing.assert_close(output_tensor(output).cpu(), expected, rtol=1e-4, atol=1e-4,
                               msg=lambda message: f"{name}: the pipeline's output differs from the model's: {message}")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description="prepare_pippy on BERT and GPT-2.")
    parser.add_argument("--tiny", action="store_true", help="Two-layer models (the default sizes are BERT-base's "
                                                            "and GPT-2's).")
    args = parser.parse_args(argv)
    state = PartialState()
    if state.num_processes < 2:
        raise SystemExit("test_pippy needs two or more processes (one pipeline stage each): "
                         "hasten launch -n 2 test_pippy.py")
    try:
        for name in ("gpt2", "bert"):
            state.print(f"Testing {name} ...")
            check(name, args.tiny)
            state.wait_for_everyone()
        state.print("PIPPY PASSED")
    finally:
        state.destroy_process_group()


if __name__ == "__main__":
    main()
