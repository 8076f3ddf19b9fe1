"""Launched with the config file ``hasten plan --write_config`` wrote, with the planned model's folder: the job
trains that model as the plan's layout says (FSDP2 over the model's decoder blocks)."""
import sys

import torch
from transformers import AutoConfig, AutoModelForCausalLM

from hasten import Accelerator

accelerator = Accelerator()
model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(sys.argv[1], local_files_only=True))
optimizer = torch.optim.AdamW(model.parameters())
model, optimizer = accelerator.prepare(model, optimizer)
ids = torch.randint(0, 256, (2, 32), device=accelerator.device)
accelerator.backward(model(input_ids=ids, labels=ids).loss)
optimizer.step()
units = sum(type(module).__name__.startswith("FSDPLlamaDecoderLayer") for module in model.modules())
version = accelerator.state.fsdp_plugin.fsdp_version if accelerator.state.fsdp_plugin is not None else None
if accelerator.is_main_process:
    print(f"check_plan_config OK {accelerator.distributed_type.value} {accelerator.num_processes} processes "
          f"fsdp_version {version} units {units}", flush=True)
accelerator.end_training()
