"""Accelerate's ``accelerate.utils.megatron_lm`` names. Megatron-LM training is planned, not built yet.

The placeholders a script builds before ``prepare`` (``MegatronLMDummyDataLoader``, ``MegatronLMDummyScheduler``)
and the ``AbstractTrainStep`` base class work; the T5 mask helpers are plain tensor code and work too. Everything
that needs Megatron raises ``NotYetSupportedError``. megatron is never imported.
"""
from __future__ import annotations

from abc import ABC

import torch

from ..optimizer import AcceleratedOptimizer
from ..scheduler import AcceleratedScheduler
from .planned import not_yet_supported

__all__ = [
    "model_provider_func", "prepare_model_optimizer_scheduler", "MegatronLMDummyDataLoader", "prepare_data_loader",
    "MegatronLMOptimizerWrapper", "prepare_optimizer", "MegatronLMDummyScheduler", "MegatronLMSchedulerWrapper",
    "prepare_scheduler", "AbstractTrainStep", "BertTrainStep", "GPTTrainStep", "T5TrainStep", "finish_mpu_init",
    "initialize", "MegatronEngine", "avg_losses_across_data_parallel_group", "gather_across_data_parallel_groups",
]

_MEANWHILE = "train with DDP (several processes) or on a single device"


def _megatron(what: str):
    return not_yet_supported(f"Megatron-LM ({what})", _MEANWHILE)


def model_provider_func(pre_process=True, post_process=True, add_encoder=True, add_decoder=True):
    raise _megatron("model_provider_func")


def prepare_model_optimizer_scheduler(accelerator):
    raise _megatron("prepare_model_optimizer_scheduler")


class MegatronLMDummyDataLoader:
    """Stands for a Megatron indexed dataset given to ``prepare``; ``dataset_kwargs`` are Megatron data arguments."""

    def __init__(self, **dataset_kwargs):
        self.dataset_args = dict(dataset_kwargs, megatron_dataset_flag=True)

    def set_megatron_data_args(self):
        raise _megatron("MegatronLMDummyDataLoader.set_megatron_data_args")

    def get_train_valid_test_datasets_provider(self, accelerator):
        raise _megatron("MegatronLMDummyDataLoader.get_train_valid_test_datasets_provider")

    def build_train_valid_test_data_iterators(self, accelerator):
        raise _megatron("MegatronLMDummyDataLoader.build_train_valid_test_data_iterators")


def prepare_data_loader(accelerator, dataloader):
    raise _megatron("prepare_data_loader")


class MegatronLMOptimizerWrapper(AcceleratedOptimizer):
    """An optimizer Megatron steps inside the model's forward (planned)."""

    def __init__(self, optimizer):
        raise _megatron("MegatronLMOptimizerWrapper")

    def zero_grad(self, set_to_none=None):
        pass  # Megatron zeroes the gradients itself

    def step(self):
        pass  # Megatron steps inside the model's forward

    @property
    def step_was_skipped(self):
        return self.optimizer.skipped_iter


def prepare_optimizer(accelerator, model):
    raise _megatron("prepare_optimizer")


class MegatronLMDummyScheduler:
    """Stands for Megatron's learning-rate scheduler: the optimizer and the schedule's length."""

    def __init__(self, optimizer, total_num_steps=None, warmup_num_steps=0, **kwargs):
        self.optimizer = optimizer
        self.total_num_steps = total_num_steps
        self.warmup_num_steps = warmup_num_steps
        self.kwargs = kwargs


class MegatronLMSchedulerWrapper(AcceleratedScheduler):
    """A scheduler Megatron steps itself (planned)."""

    def __init__(self, scheduler, optimizers):
        raise _megatron("MegatronLMSchedulerWrapper")

    def step(self, *args, **kwargs):
        return  # Megatron steps the scheduler inside the model's forward


def prepare_scheduler(accelerator, optimizer, scheduler):
    raise _megatron("prepare_scheduler")


class AbstractTrainStep(ABC):
    """Base of a Megatron train step: how to get a batch, run the forward step and compute the loss."""

    def __init__(self, name):
        super().__init__()
        self.name = name

    def get_batch_func(self, accelerator, megatron_dataset_flag):
        pass

    def get_forward_step_func(self):
        pass

    def get_loss_func(self, accelerator):
        pass


class BertTrainStep(AbstractTrainStep):
    """The BERT train step (planned)."""

    def __init__(self, accelerator, args):
        raise _megatron("BertTrainStep")

    def get_batch_func(self, accelerator, megatron_dataset_flag):
        raise _megatron("BertTrainStep.get_batch_func")

    def get_loss_func(self, accelerator, pretraining_flag, num_labels):
        raise _megatron("BertTrainStep.get_loss_func")

    def get_forward_step_func(self, pretraining_flag, bert_binary_head):
        raise _megatron("BertTrainStep.get_forward_step_func")


class GPTTrainStep(AbstractTrainStep):
    """The GPT train step (planned)."""

    def __init__(self, accelerator, args):
        raise _megatron("GPTTrainStep")

    def get_batch_func(self, accelerator, megatron_dataset_flag):
        raise _megatron("GPTTrainStep.get_batch_func")

    def get_loss_func(self, accelerator):
        raise _megatron("GPTTrainStep.get_loss_func")

    def get_forward_step_func(self):
        raise _megatron("GPTTrainStep.get_forward_step_func")


class T5TrainStep(AbstractTrainStep):
    """The T5 train step (planned); its attention-mask helpers work."""

    def __init__(self, accelerator, args):
        raise _megatron("T5TrainStep")

    @staticmethod
    def attn_mask_postprocess(attention_mask):
        """A 2D padding mask ``[b, s]`` as the 3D mask ``[b, s, s]`` Megatron takes (True = masked out)."""
        return (attention_mask.unsqueeze(1) * attention_mask.unsqueeze(2)) < 0.5

    @staticmethod
    def get_decoder_mask(seq_length, device):
        """The causal mask ``[1, s, s]`` (True = masked out)."""
        return torch.tril(torch.ones((1, seq_length, seq_length), device=device)) < 0.5

    @staticmethod
    def get_enc_dec_mask(attention_mask, dec_seq_length, device):
        """The encoder-decoder mask ``[b, dec_seq_length, s]`` from the encoder's padding mask (True = masked out)."""
        batch_size = attention_mask.shape[0]
        return (torch.ones((batch_size, dec_seq_length, 1), device=device) * attention_mask.unsqueeze(1)) < 0.5

    def get_batch_func(self, accelerator, megatron_dataset_flag):
        raise _megatron("T5TrainStep.get_batch_func")

    def get_loss_func(self, accelerator):
        raise _megatron("T5TrainStep.get_loss_func")

    def get_forward_step_func(self):
        raise _megatron("T5TrainStep.get_forward_step_func")


def finish_mpu_init():
    raise _megatron("finish_mpu_init")


def initialize(accelerator, extra_args_provider=None, args_defaults=None):
    raise _megatron("initialize")


class MegatronEngine(torch.nn.Module):
    """The Megatron model, optimizer and scheduler behind one module (planned)."""

    def __init__(self, accelerator, model, optimizer, scheduler):
        raise _megatron("MegatronEngine")

    def get_module_config(self):
        raise _megatron("MegatronEngine.get_module_config")

    def train(self):
        raise _megatron("MegatronEngine.train")

    def eval(self):
        raise _megatron("MegatronEngine.eval")

    def get_batch_data_iterator(self, batch_data):
        raise _megatron("MegatronEngine.get_batch_data_iterator")

    def train_step(self, **batch_data):
        raise _megatron("MegatronEngine.train_step")

    def eval_step(self, **batch_data):
        raise _megatron("MegatronEngine.eval_step")

    def forward(self, **batch_data):
        raise _megatron("MegatronEngine.forward")

    def log_eval_results(self):
        raise _megatron("MegatronEngine.log_eval_results")

    def save_checkpoint(self, output_dir):
        raise _megatron("MegatronEngine.save_checkpoint")

    def load_checkpoint(self, input_dir):
        raise _megatron("MegatronEngine.load_checkpoint")


def avg_losses_across_data_parallel_group(losses):
    raise _megatron("avg_losses_across_data_parallel_group")


def gather_across_data_parallel_groups(tensor):
    raise _megatron("gather_across_data_parallel_groups")
