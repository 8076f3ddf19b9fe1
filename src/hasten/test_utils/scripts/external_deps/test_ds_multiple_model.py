"""Several DeepSpeed plugins in one run: Accelerate's DeepSpeed suite launches this file
(``test_ds_multiple_model.py``) on two processes, without DeepSpeed flags (the script names its plugins).

1. One Accelerator with a ZeRO-2 plugin ("training", optimizer offloaded to the CPU) and a ZeRO-3 plugin
   ("inference", parameters offloaded): a sequence classifier trains under the first; a one-parameter model that
   scales the loss is prepared under the second (``select_deepspeed_plugin("inference")``) and used without
   gradients inside the loop, after selecting "training" back.
2. After ``AcceleratorState._reset_state(True)``: two Accelerators, the second one joining the first's plugins,
   each preparing its own classifier (ZeRO-2 and ZeRO-3, after ``select_deepspeed_plugin("zero3")`` on the second),
   trained side by side on the same batches; each engine is the prepared model.

Each part checks the active plugin after each selection, and that every model's best validation accuracy beats its
first epoch's (so ``--num_epochs`` of at least 2).

Offline: ``--model_name_or_path <local dir> --dataset_dir <dir with train.jsonl, validation.jsonl>``.
"""
from __future__ import annotations

import argparse

import torch

from hasten.accelerator import Accelerator
from hasten.collectives.random import set_seed
from hasten.config.deepspeed import DeepSpeedPlugin
from hasten.state import AcceleratorState
from hasten.strategies.deepspeed.wrappers import get_active_deepspeed_plugin
from hasten.test_utils.scripts.external_deps.mrpc import (
    accuracy,
    add_model_and_data_arguments,
    mrpc_loaders,
)

EVAL_BATCH_SIZE = 16
PRECISION = {"fp16": {"enabled": "auto"}, "bf16": {"enabled": "auto"}}
ZERO2_OPTIMIZER_ON_CPU = {
    **PRECISION,
    "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "pin_memory": True},
                          "reduce_bucket_size": "auto", "contiguous_gradients": True},
    "gradient_accumulation_steps": 1, "gradient_clipping": "auto",
    "train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto",
}
ZERO3_PARAMETERS_ON_CPU = {
    **PRECISION,
    "zero_optimization": {"stage": 3, "offload_param": {"device": "cpu", "pin_memory": True},
                          "stage3_gather_16bit_weights_on_model_save": True},
    "train_micro_batch_size_per_gpu": 1,
}


class LossScale(torch.nn.Module):
    """A model of one parameter: the loss times a factor. The parameter has one dimension: DeepSpeed broadcasts
    the parameters of a ZeRO-3 model built outside ``zero.Init`` as bytes, which a 0-d bf16 tensor cannot be
    viewed as."""

    def __init__(self, factor: float = 0.1):
        super().__init__()
        self.factor = torch.nn.Parameter(torch.tensor([factor], dtype=torch.float32))

    def forward(self, loss):
        return (loss * self.factor).squeeze(0)


def plugins(first: str, second: str) -> dict:
    return {first: DeepSpeedPlugin(hf_ds_config=dict(ZERO2_OPTIMIZER_ON_CPU)),
            second: DeepSpeedPlugin(hf_ds_config=dict(ZERO3_PARAMETERS_ON_CPU))}


def classifier(args, total_steps):
    from transformers import (
        AutoModelForSequenceClassification,
        get_linear_schedule_with_warmup,
    )

    model = AutoModelForSequenceClassification.from_pretrained(args.model_name_or_path)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    return model, optimizer, get_linear_schedule_with_warmup(optimizer, num_warmup_steps=0,
                                                             num_training_steps=total_steps)


def check_learned(history: dict, name: str) -> None:
    best = max(history.values())
    assert best > history["epoch-0"], f"{name} did not improve on its first epoch: {history}"


def one_accelerator_two_plugins(args) -> None:
    named = plugins("training", "inference")
    accelerator = Accelerator(deepspeed_plugins=named, mixed_precision="bf16")
    assert get_active_deepspeed_plugin(accelerator.state) is named["training"]
    train_loader, eval_loader = mrpc_loaders(args.model_name_or_path, args.batch_size, EVAL_BATCH_SIZE,
                                             dataset_dir=args.dataset_dir)
    model, optimizer, schedule = classifier(args, len(train_loader) * args.num_epochs)
    train_loader, eval_loader, model, optimizer, schedule = accelerator.prepare(
        train_loader, eval_loader, model, optimizer, schedule)
    accelerator.state.select_deepspeed_plugin("inference")
    assert get_active_deepspeed_plugin(accelerator.state) is named["inference"]
    scale = accelerator.prepare(LossScale())
    scale.eval()
    accelerator.state.select_deepspeed_plugin("training")
    history = {}
    for epoch in range(args.num_epochs):
        model.train()
        for batch in train_loader:
            with accelerator.accumulate(model):
                outputs = model(**batch)
                with torch.no_grad():
                    extra = scale(outputs.loss)
                accelerator.backward(outputs.loss + extra)
                optimizer.step()
                schedule.step()
                optimizer.zero_grad()
        (history[f"epoch-{epoch}"],) = accuracy(accelerator, model, eval_loader)
        accelerator.print(f"epoch {epoch}:", history[f"epoch-{epoch}"])
    check_learned(history, "the model trained beside a ZeRO-3 inference model")


def two_accelerators(args) -> None:
    named = plugins("zero2", "zero3")
    zero2 = Accelerator(deepspeed_plugins=named, mixed_precision="bf16")
    zero3 = Accelerator()
    assert get_active_deepspeed_plugin(zero2.state) is named["zero2"]
    train_loader, eval_loader = mrpc_loaders(args.model_name_or_path, args.batch_size, EVAL_BATCH_SIZE,
                                             dataset_dir=args.dataset_dir)
    total_steps = len(train_loader) * args.num_epochs
    model2, optimizer2, schedule2 = classifier(args, total_steps)
    train_loader, eval_loader, model2, optimizer2, schedule2 = zero2.prepare(
        train_loader, eval_loader, model2, optimizer2, schedule2)
    assert zero2.deepspeed_engine_wrapped.engine is model2
    zero3.state.select_deepspeed_plugin("zero3")
    named["zero3"].deepspeed_config["train_micro_batch_size_per_gpu"] = (
        named["zero2"].deepspeed_config["train_micro_batch_size_per_gpu"])
    assert get_active_deepspeed_plugin(zero3.state) is named["zero3"]
    model3, optimizer3, schedule3 = classifier(args, total_steps)
    model3, optimizer3, schedule3 = zero3.prepare(model3, optimizer3, schedule3)
    assert zero3.deepspeed_engine_wrapped.engine is model3
    history2, history3 = {}, {}
    for epoch in range(args.num_epochs):
        model2.train()
        model3.train()
        for batch in train_loader:
            with zero2.accumulate(model2, model3):
                zero2.backward(model2(**batch).loss)
                optimizer2.step()
                schedule2.step()
                optimizer2.zero_grad()
                zero3.backward(model3(**batch).loss)
                optimizer3.step()
                schedule3.step()
                optimizer3.zero_grad()
        history2[f"epoch-{epoch}"], history3[f"epoch-{epoch}"] = accuracy(zero2, model2, eval_loader, model3)
        zero2.print(f"epoch {epoch}:", history2[f"epoch-{epoch}"], history3[f"epoch-{epoch}"])
    check_learned(history2, "the ZeRO-2 model")
    check_learned(history3, "the ZeRO-3 model")


def parse(argv=None):
    parser = argparse.ArgumentParser(description="Several DeepSpeed plugins and models in one run.")
    add_model_and_data_arguments(parser, batch_size=8)
    parser.add_argument("--performance_lower_bound", type=float, default=None,
                        help="Taken for the reference's command line; the check is that every model improves.")
    parser.add_argument("--num_epochs", type=int, default=3)
    return parser.parse_args(argv)


def main(argv=None) -> None:
    args = parse(argv)
    set_seed(args.seed)
    one_accelerator_two_plugins(args)
    AcceleratorState._reset_state(True)
    two_accelerators(args)
    if torch.distributed.get_rank() == 0:
        print("MULTIPLE MODELS PASSED")


if __name__ == "__main__":
    main()
