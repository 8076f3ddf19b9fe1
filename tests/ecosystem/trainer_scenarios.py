"""transformers' Trainer on a tiny Llama built from a config, as a user runs it: one scenario per call.

    hasten launch -n 2 --as_accelerate trainer_scenarios.py SCENARIOS OUT_DIR [--resume-from DIR]   # hasten
    torchrun --nproc_per_node 2 trainer_scenarios.py SCENARIOS OUT_DIR [--resume-from DIR]           # the reference

SCENARIOS is a comma-separated list, run one after the other in this process: each trains (saving a checkpoint
half way) and then resumes from that checkpoint in a new Trainer; with ``--resume-from DIR`` each only resumes from
the checkpoint another run (the other library's) left in DIR. Writes OUT_DIR/results[-resumed].json on the main
process: the losses and grad norms Trainer logged, which library ran (``accelerate.__file__``) and which backend
trained. Nothing is downloaded: the model comes from a
config, the data from ``datasets.Dataset.from_dict``.
"""
from __future__ import annotations

import json
import os
import sys

import torch

SCENARIOS = ("ddp", "fsdp2", "fsdp1", "zero2", "zero3", "lora", "lora_fsdp2")
STEPS, BATCH, SEQUENCE = 8, 2, 16


def tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         attention_dropout=0.0, tie_word_embeddings=False)
    return LlamaForCausalLM(config)


def dataset():
    from datasets import Dataset

    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 128, (64, SEQUENCE), generator=generator).tolist()
    return Dataset.from_dict({"input_ids": ids, "labels": ids})


def deepspeed_config(stage: int) -> dict:
    return {"zero_optimization": {"stage": stage}, "train_micro_batch_size_per_gpu": "auto",
            "train_batch_size": "auto", "gradient_accumulation_steps": "auto", "gradient_clipping": "auto",
            "optimizer": {"type": "AdamW", "params": {"lr": "auto", "weight_decay": "auto"}},
            "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto",
                                                           "warmup_num_steps": "auto"}},
            "bf16": {"enabled": False}, "fp16": {"enabled": False}}


def arguments(scenario: str, out: str, resume: bool = False):
    from transformers import TrainingArguments

    options = dict(output_dir=os.path.join(out, f"run-{scenario}"), per_device_train_batch_size=BATCH,
                   gradient_accumulation_steps=2, max_steps=STEPS, learning_rate=1e-3, logging_steps=1,
                   save_steps=STEPS // 2, save_strategy="steps", report_to=[], seed=0, data_seed=0,
                   dataloader_num_workers=0, use_cpu=True, disable_tqdm=True, max_grad_norm=1.0,
                   lr_scheduler_type="linear", warmup_steps=2)
    if scenario in ("fsdp2", "fsdp1", "lora_fsdp2"):
        options["fsdp"] = "full_shard auto_wrap"
        options["fsdp_config"] = {"fsdp_version": 1 if scenario == "fsdp1" else 2,
                                  "transformer_layer_cls_to_wrap": ["LlamaDecoderLayer"],
                                  "reshard_after_forward": True if scenario != "fsdp1" else None}
        options["fsdp_config"] = {k: v for k, v in options["fsdp_config"].items() if v is not None}
    if scenario in ("zero2", "zero3"):
        options["deepspeed"] = deepspeed_config(int(scenario[-1]))
    return TrainingArguments(**options)


def model_for(scenario: str):
    model = tiny_llama()
    if scenario.startswith("lora"):
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0,
                                                 target_modules=["q_proj", "v_proj"]))
    return model


def run(scenario: str, out: str, resume_from=None) -> dict:
    """Train ``scenario`` (saving a checkpoint half way), or with ``resume_from`` (a folder holding the run's
    ``run-SCENARIO/``) continue from that checkpoint; returns what was logged."""
    import accelerate
    from transformers import Trainer

    args = arguments(scenario, out, resume_from is not None)
    trainer = Trainer(model=model_for(scenario), args=args, train_dataset=dataset())
    checkpoint = None
    if resume_from is not None:
        checkpoint = os.path.join(resume_from, f"run-{scenario}", f"checkpoint-{STEPS // 2}")
    trainer.train(resume_from_checkpoint=checkpoint)
    first = STEPS // 2 + 1 if checkpoint else 1  # a resumed run's history starts with the checkpoint's
    history = [entry for entry in trainer.state.log_history if "loss" in entry and entry["step"] >= first]
    return {"scenario": scenario, "library": accelerate.__file__, "resumed_from": checkpoint,
            "distributed_type": str(trainer.accelerator.distributed_type),
            "num_processes": trainer.accelerator.num_processes, "is_main_process": trainer.accelerator.is_main_process,
            "losses": [entry["loss"] for entry in history],
            "grad_norms": [entry.get("grad_norm") for entry in history],
            "steps": [entry["step"] for entry in history]}


def fresh_state() -> None:
    """Forget the process-wide state between two Trainers of one process (the process group stays)."""
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    try:
        from transformers.integrations.deepspeed import unset_hf_deepspeed_config

        unset_hf_deepspeed_config()
    except ImportError:
        pass


def main(scenarios: list, out: str, resume_from=None) -> None:
    """Each scenario in turn: trained and resumed from its own checkpoint, or only resumed from ``resume_from``'s."""
    results = []
    for scenario in scenarios:
        if resume_from is None:
            results.append(run(scenario, out))
            fresh_state()
        results.append(run(scenario, out, resume_from=resume_from or out))
        fresh_state()
    if results[-1]["is_main_process"]:
        name = "results-resumed.json" if resume_from else "results.json"
        with open(os.path.join(out, name), "w") as handle:
            json.dump(results, handle)
        print("SCENARIOS DONE", len(results))


if __name__ == "__main__":
    # trainer_scenarios.py SCENARIO[,SCENARIO...] OUT_DIR [--resume-from DIR]
    rest = sys.argv[3:]
    main(sys.argv[1].split(","), sys.argv[2], rest[rest.index("--resume-from") + 1] if "--resume-from" in rest else None)
