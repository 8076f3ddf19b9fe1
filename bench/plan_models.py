"""The models of the planning accuracy benchmark (bench_plan.py, plan_measure.py): an MLP and tiny GPT-2, Llama and
BERT built from configs, with their batches and the class names of their repeated blocks."""
from __future__ import annotations

import torch
from torch import nn

VOCAB, WIDTH, LAYERS = 1024, 128, 4
MODELS = ("mlp", "gpt2", "llama", "bert")


class Block(nn.Module):
    """One residual MLP block of the benchmark's MLP."""

    def __init__(self, width: int):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, 4 * width)
        self.down = nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


class MLP(nn.Sequential):
    _no_split_modules = ["Block"]

    def __init__(self):
        super().__init__(*[Block(WIDTH) for _ in range(LAYERS)])


def config(name: str):
    import transformers

    if name == "gpt2":
        return transformers.GPT2Config(n_embd=WIDTH, n_layer=LAYERS, n_head=4, vocab_size=VOCAB, n_positions=512,
                                       bos_token_id=0, eos_token_id=0, architectures=["GPT2LMHeadModel"])
    if name == "llama":
        return transformers.LlamaConfig(hidden_size=WIDTH, intermediate_size=4 * WIDTH, num_attention_heads=4,
                                        num_key_value_heads=2, num_hidden_layers=LAYERS, vocab_size=VOCAB,
                                        max_position_embeddings=512, head_dim=WIDTH // 4,
                                        architectures=["LlamaForCausalLM"])
    if name == "bert":
        return transformers.BertConfig(hidden_size=WIDTH, intermediate_size=4 * WIDTH, num_attention_heads=4,
                                       num_hidden_layers=LAYERS, vocab_size=VOCAB, max_position_embeddings=512,
                                       architectures=["BertForMaskedLM"])
    raise ValueError(name)


def build_model(name: str) -> nn.Module:
    if name == "mlp":
        return MLP()
    import transformers

    classes = {"gpt2": transformers.GPT2LMHeadModel, "llama": transformers.LlamaForCausalLM,
               "bert": transformers.BertForMaskedLM}
    return classes[name](config(name))


def make_batch(name: str, micro_batch_size: int, seq_len: int):
    if name == "mlp":
        return torch.randn(micro_batch_size, seq_len, WIDTH)
    ids = torch.randint(0, VOCAB, (micro_batch_size, seq_len))
    return {"input_ids": ids, "labels": ids}


def blocks(name: str) -> list[str]:
    """FSDP's units, as the plan picks them (``Tracer.block_names``): the model's repeated no-split classes."""
    model = build_model(name)
    named = list(getattr(model, "_no_split_modules", None) or [])
    repeated = [block for block in named if sum(type(m).__name__ == block for m in model.modules()) > 1]
    return repeated or named
