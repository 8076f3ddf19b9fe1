"""Local stand-ins for what the external_deps scripts read from the Hub, built from configs (no downloads): a tiny
BERT sequence classifier with its tokenizer, a tiny Llama (and a Llama sequence classifier), a tiny GPT-2, each
saved by save_pretrained, and an MRPC-shaped data set whose label a small model learns in a few steps (the first
word of the second sentence says it: "alpha" for 1, "beta" for 0). Each model's weights come from a fixed seed, so
every run trains the same stand-ins (the random ones of an unseeded process sometimes left a classifier predicting
one class)."""
from __future__ import annotations

import json
import random
from pathlib import Path

import torch

WORDS = ["alpha", "beta", "gamma", "delta", "omega", "sigma", "kappa", "theta", "lambda", "zeta", "rho", "tau"]
SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def word_tokenizer(folder: Path, **options) -> None:
    """Saves into ``folder`` (made if missing) a lower-casing word-level tokenizer whose vocabulary is SPECIAL and
    WORDS; ``options`` go to ``BertTokenizerFast``."""
    from transformers import BertTokenizerFast

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "vocab.txt").write_text("\n".join(SPECIAL + WORDS) + "\n")
    BertTokenizerFast(vocab=str(folder / "vocab.txt"), do_lower_case=True, **options).save_pretrained(folder)


def tiny_bert(folder: Path) -> Path:
    """BertForSequenceClassification (2 layers of 32) and a word-level tokenizer over WORDS."""
    torch.manual_seed(0)
    from transformers import BertConfig, BertForSequenceClassification

    word_tokenizer(folder)
    config = BertConfig(vocab_size=len(SPECIAL) + len(WORDS), hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=2, intermediate_size=64, max_position_embeddings=64, num_labels=2)
    BertForSequenceClassification(config).save_pretrained(folder)
    return folder


def tiny_llama(folder: Path) -> Path:
    """LlamaForCausalLM (2 layers, 4 heads) with sdpa attention, and no tokenizer (the scripts build token ids)."""
    torch.manual_seed(0)
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
    LlamaForCausalLM(config).save_pretrained(folder)
    return folder


def tiny_llama_classifier(folder: Path) -> Path:
    """LlamaForSequenceClassification (2 layers, 4 heads, no pad token: ``--add_pad_token`` sets one) with the
    word-level tokenizer of ``tiny_bert`` (input ids and attention mask only), for the tensor-parallel run."""
    torch.manual_seed(0)
    from transformers import LlamaConfig, LlamaForSequenceClassification

    word_tokenizer(folder, model_input_names=["input_ids", "attention_mask"])
    config = LlamaConfig(vocab_size=len(SPECIAL) + len(WORDS), hidden_size=32, intermediate_size=64,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=64, num_labels=2, pad_token_id=None)
    LlamaForSequenceClassification(config).save_pretrained(folder)
    return folder


def tiny_gpt2(folder: Path) -> Path:
    """GPT2Model with 2 layers of 32."""
    torch.manual_seed(0)
    from transformers import GPT2Config, GPT2Model

    GPT2Model(GPT2Config(n_embd=32, n_layer=2, n_head=2, vocab_size=128, n_positions=64, bos_token_id=0, eos_token_id=0)).save_pretrained(folder)
    return folder


def mrpc_like(folder: Path, train: int = 192, validation: int = 40) -> Path:
    """train.jsonl and validation.jsonl with GLUE MRPC's columns."""
    folder.mkdir(parents=True, exist_ok=True)
    generator = random.Random(0)
    for split, count in (("train", train), ("validation", validation)):
        rows = []
        for index in range(count):
            first = [generator.choice(WORDS) for _ in range(4)]
            second = [generator.choice(WORDS) for _ in range(4)]
            label = index % 2
            second[0] = "alpha" if label else "beta"
            rows.append({"sentence1": " ".join(first), "sentence2": " ".join(second), "label": label, "idx": index})
        (folder / f"{split}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return folder
