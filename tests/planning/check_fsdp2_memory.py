"""Launched on 2 processes by tests/planning/test_sharded_memory.py: the FSDP2 plan made on one process with a fake
process group (before the real group exists) against what each rank measures in the real 2-process run: every
category of the model's state equal, the peak within 10% (gloo's collectives allocate staging tensors that the fake
group does not: the measured peak is higher by about that)."""
import sys

import torch
import torch.distributed as dist
import transformers

from hasten.planning import fsdp2_step_memory

CONFIG = transformers.LlamaConfig(num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                                  num_key_value_heads=2, vocab_size=256, max_position_embeddings=64)


def build() -> torch.nn.Module:
    return transformers.LlamaForCausalLM(CONFIG)


def batch() -> dict:
    ids = torch.randint(0, 256, (2, 32))
    return {"input_ids": ids, "labels": ids}


def main() -> None:
    predicted = {precision: fsdp2_step_memory(build, batch, world_size=2, mixed_precision=precision)
                 for precision in ("no", "bf16")}
    dist.init_process_group("gloo")
    for precision, plan in predicted.items():
        measured = fsdp2_step_memory(build, batch, world_size=2, mixed_precision=precision, fake=False)
        state = ("parameters", "buffers", "optimizer_state", "gathered_parameters", "communication")
        error = (plan.peak - measured.peak) / measured.peak
        if any(getattr(plan, name) != getattr(measured, name) for name in state) or abs(error) > 0.10:
            print(f"MISMATCH rank {dist.get_rank()} {precision}: predicted {plan.as_dict()} measured "
                  f"{measured.as_dict()}", flush=True)
            sys.exit(1)
        print(f"ok: rank {dist.get_rank()} {precision} predicted within 10%: peak {plan.peak} predicted, "
              f"{measured.peak} measured ({error:+.1%}); state equal", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
