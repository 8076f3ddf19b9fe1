"""``hasten config``'s questions for Megatron-LM; the answers become the ``megatron_lm_config`` section
(``megatron_lm_<field>`` keys, which ``hasten launch`` passes to ``MegatronLMPlugin``; see docs/megatron-lm.md).

Only the fields hasten's torch-native engine honours are asked: the tensor and pipeline degrees (their product
divides the number of processes; the rest are data parallel), micro-batches, sequence parallelism,
recomputation, the distributed optimizer and gradient clipping.
"""
from __future__ import annotations

from .questionnaire_parallelism import _divides
from .questions import ask_bool, ask_float, ask_int

__all__ = ["ask_megatron"]

PREFIX = "megatron_lm_"


def ask_megatron(num_processes: int) -> dict:
    """The ``megatron_lm_config`` section for a job of ``num_processes``."""
    tp = ask_int(f"Tensor-parallel degree (it must divide {num_processes})?", 1, minimum=1, maximum=num_processes,
                 check=_divides(num_processes, "the number of processes"))
    rest = num_processes // tp
    pp = ask_int(f"Pipeline-parallel degree (it must divide {rest})?", 1, minimum=1, maximum=rest,
                 check=_divides(rest, "the processes left after tensor parallelism"))
    config = {PREFIX + "tp_degree": tp, PREFIX + "pp_degree": pp}
    if pp > 1:
        config[PREFIX + "num_micro_batches"] = ask_int("Micro-batches per batch through the pipeline?", pp, minimum=1)
    if tp > 1:
        config[PREFIX + "sequence_parallelism"] = ask_bool(
            "Sequence parallelism (norms on a slice of the sequence; the model's plan must have such entries)?", False)
    config[PREFIX + "recompute_activations"] = ask_bool("Recompute the transformer blocks' activations in backward "
                                                        "(less memory, more compute)?", False)
    if rest // pp > 1:
        print(f"  {rest // pp} data-parallel ranks.")
        config[PREFIX + "use_distributed_optimizer"] = ask_bool(
            "Shard parameters, gradients and optimizer state over the data-parallel ranks (distributed optimizer)?",
            False)
    config[PREFIX + "gradient_clipping"] = ask_float("Clip the global gradient norm at (0: no clipping)?", 1.0,
                                                     minimum=0.0)
    return config
