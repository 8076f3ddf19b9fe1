"""TRL's SFT and DPO trainers and sentence-transformers' trainer on tiny models built from configs, as users run them.

    hasten launch -n 2 --as_accelerate client_scenarios.py SCENARIOS OUT_DIR   # hasten answering for accelerate
    torchrun --nproc_per_node 2 client_scenarios.py SCENARIOS OUT_DIR          # the reference

SCENARIOS: a comma-separated list of ``sft``, ``dpo``, ``sentence``. Writes OUT_DIR/clients.json on the main
process: each scenario's logged losses, which library ran and which backend trained. Nothing is downloaded: the
tokenizer is built from a word list, the models from configs, the data with ``datasets.Dataset.from_dict``.
"""
from __future__ import annotations

import json
import os
import sys
import time

import torch

WORDS = ["the", "a", "cat", "dog", "sat", "ran", "on", "mat", "rug", "fast", "slow", "red", "blue", "big", "small"]
STEPS = 4


def tokenizer(folder: str):
    """A word-level tokenizer over ``WORDS``, saved to ``folder`` (and loaded from there, as a user's would be)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {token: index for index, token in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "</s>"] + WORDS)}
    core = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="[PAD]", unk_token="[UNK]", cls_token="[CLS]",
                                   sep_token="[SEP]", mask_token="[MASK]", eos_token="</s>", bos_token="[CLS]")
    fast.chat_template = None
    return fast


def sentences(count: int, seed: int) -> list:
    generator = torch.Generator().manual_seed(seed)
    return [" ".join(WORDS[i] for i in torch.randint(0, len(WORDS), (6,), generator=generator).tolist())
            for _ in range(count)]


def tiny_llama(vocab_size: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=vocab_size, hidden_size=32, intermediate_size=64,
                                        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                        max_position_embeddings=64, attention_dropout=0.0, pad_token_id=0,
                                        eos_token_id=5, bos_token_id=2))


def common(out: str, name: str) -> dict:
    return dict(output_dir=os.path.join(out, f"run-{name}"), per_device_train_batch_size=2, max_steps=STEPS,
                learning_rate=1e-3, logging_steps=1, report_to=[], seed=0, data_seed=0, use_cpu=True,
                disable_tqdm=True, save_strategy="no", dataloader_num_workers=0)


def sft(out: str) -> tuple:
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    tok = tokenizer(out)
    trainer = SFTTrainer(model=tiny_llama(len(tok)), processing_class=tok,
                         train_dataset=Dataset.from_dict({"text": sentences(32, 1)}),
                         args=SFTConfig(max_length=16, packing=False, **common(out, "sft")))
    trainer.train()
    return trainer


def dpo(out: str) -> tuple:
    from datasets import Dataset
    from trl import DPOConfig, DPOTrainer

    tok = tokenizer(out)
    data = Dataset.from_dict({"prompt": sentences(32, 2), "chosen": sentences(32, 3), "rejected": sentences(32, 4)})
    trainer = DPOTrainer(model=tiny_llama(len(tok)), ref_model=tiny_llama(len(tok)), processing_class=tok,
                         train_dataset=data, args=DPOConfig(max_length=24, beta=0.1, **common(out, "dpo")))
    trainer.train()
    return trainer


def sentence(out: str) -> tuple:
    from datasets import Dataset
    from sentence_transformers import SentenceTransformer, SentenceTransformerTrainer, SentenceTransformerTrainingArguments
    from sentence_transformers import losses, models
    from transformers import BertConfig, BertModel

    folder = os.path.join(out, "tiny-bert")  # a model folder, as a user's would be, written by the main process
    tok = tokenizer(folder)
    if os.environ.get("RANK", "0") == "0":
        torch.manual_seed(0)
        BertModel(BertConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                             intermediate_size=64, max_position_embeddings=32, hidden_dropout_prob=0.0,
                             attention_probs_dropout_prob=0.0)).save_pretrained(folder, is_main_process=True)
        tok.save_pretrained(folder)
        open(os.path.join(folder, "ready"), "w").close()
    while not os.path.exists(os.path.join(folder, "ready")):
        time.sleep(0.05)
    transformer = models.Transformer(folder, max_seq_length=16)
    model = SentenceTransformer(modules=[transformer, models.Pooling(transformer.get_word_embedding_dimension())])
    data = Dataset.from_dict({"anchor": sentences(32, 5), "positive": sentences(32, 6)})
    arguments = SentenceTransformerTrainingArguments(**common(out, "sentence"))
    trainer = SentenceTransformerTrainer(model=model, args=arguments, train_dataset=data,
                                         loss=losses.MultipleNegativesRankingLoss(model))
    trainer.train()
    return trainer


def fresh_state() -> None:
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(True)
    GradientState._reset_state()


def main(scenarios: list, out: str) -> None:
    import accelerate

    results = []
    for scenario in scenarios:
        trainer = {"sft": sft, "dpo": dpo, "sentence": sentence}[scenario](out)
        history = [entry for entry in trainer.state.log_history if "loss" in entry]
        results.append({"scenario": scenario, "library": accelerate.__file__,
                        "distributed_type": str(trainer.accelerator.distributed_type),
                        "num_processes": trainer.accelerator.num_processes,
                        "losses": [entry["loss"] for entry in history]})
        main_process = trainer.accelerator.is_main_process
        fresh_state()
    if main_process:
        with open(os.path.join(out, "clients.json"), "w") as handle:
            json.dump(results, handle)
        print("CLIENTS DONE", json.dumps(results))


if __name__ == "__main__":
    main(sys.argv[1].split(","), sys.argv[2])
