"""A diffusers training script's loop, as diffusers' examples write it (``train_unconditional.py``'s pattern):

- an EMA copy of the UNet (``diffusers.training_utils.EMAModel``), saved and loaded by save / load-state pre-hooks
  that call ``save_pretrained`` / ``from_pretrained`` on what the hooks receive;
- ``accelerator.save_state(...)`` inside ``if accelerator.is_main_process:``;
- resuming with ``load_state`` and ``skip_first_batches``, the step counted from the checkpoint's name.

    hasten launch -n 2 --as_accelerate diffusers_loop.py OUT_DIR [--resume FROM_DIR]
    torchrun --nproc_per_node 2 diffusers_loop.py OUT_DIR [--resume FROM_DIR]        # the reference

Writes OUT_DIR/diffusers[-resumed].json on the main process: the loss of every step, the EMA weights' checksum
and which library ran. Nothing is downloaded: the UNet comes from a config.
"""
from __future__ import annotations

import json
import os
import sys

import torch
import torch.nn.functional as F

STEPS, CHECKPOINT_AT, BATCH = 8, 4, 2


def main(out: str, resume_from=None) -> None:
    from accelerate import Accelerator
    from accelerate.utils import ProjectConfiguration, set_seed
    from diffusers import DDPMScheduler, UNet2DModel
    from diffusers.training_utils import EMAModel

    accelerator = Accelerator(gradient_accumulation_steps=1, cpu=True,
                              project_config=ProjectConfiguration(project_dir=out, logging_dir=out))
    set_seed(0)
    model = UNet2DModel(sample_size=8, in_channels=1, out_channels=1, layers_per_block=1,
                        block_out_channels=(8, 16), norm_num_groups=4,
                        down_block_types=("DownBlock2D", "DownBlock2D"), up_block_types=("UpBlock2D", "UpBlock2D"))
    ema_model = EMAModel(model.parameters(), decay=0.9, model_cls=UNet2DModel, model_config=model.config)

    def save_model_hook(models, weights, output_dir):
        if accelerator.is_main_process:
            ema_model.save_pretrained(os.path.join(output_dir, "unet_ema"))
            for _ in range(len(models)):
                models[0].save_pretrained(os.path.join(output_dir, "unet"))
                weights.pop()  # saved by save_pretrained: not saved again

    def load_model_hook(models, input_dir):
        loaded = EMAModel.from_pretrained(os.path.join(input_dir, "unet_ema"), UNet2DModel)
        ema_model.load_state_dict(loaded.state_dict())
        for _ in range(len(models)):
            model_ = models.pop()
            loaded_model = UNet2DModel.from_pretrained(input_dir, subfolder="unet")
            model_.register_to_config(**loaded_model.config)
            model_.load_state_dict(loaded_model.state_dict())

    accelerator.register_save_state_pre_hook(save_model_hook)
    accelerator.register_load_state_pre_hook(load_model_hook)

    images = torch.randn(32, 1, 8, 8, generator=torch.Generator().manual_seed(1))
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(images), batch_size=BATCH, shuffle=True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scheduler = DDPMScheduler(num_train_timesteps=100)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)

    global_step, first_epoch, resume_step = 0, 0, 0
    if resume_from is not None:
        path = os.path.join(resume_from, f"checkpoint-{CHECKPOINT_AT}")
        accelerator.load_state(path)
        global_step = CHECKPOINT_AT
        first_epoch, resume_step = divmod(global_step, len(loader))

    losses = {}
    for epoch in range(first_epoch, 1):
        epoch_loader = accelerator.skip_first_batches(loader, resume_step) if epoch == first_epoch else loader
        for (clean,) in epoch_loader:
            noise = torch.randn(clean.shape, device=clean.device)
            timesteps = torch.randint(0, scheduler.config.num_train_timesteps, (clean.shape[0],),
                                      device=clean.device).long()
            noisy = scheduler.add_noise(clean, noise, timesteps)
            with accelerator.accumulate(model):
                loss = F.mse_loss(model(noisy, timesteps).sample, noise)
                accelerator.backward(loss)
                optimizer.step()
                optimizer.zero_grad()
            if accelerator.sync_gradients:
                ema_model.step(accelerator.unwrap_model(model).parameters())
                global_step += 1
                losses[global_step] = accelerator.gather(loss.detach()).mean().item()
                if global_step == CHECKPOINT_AT and resume_from is None:
                    if accelerator.is_main_process:  # as diffusers' scripts do
                        accelerator.save_state(os.path.join(out, f"checkpoint-{global_step}"))
            if global_step >= STEPS:
                break
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        import accelerate

        ema = sum(float(p.double().sum()) for p in ema_model.shadow_params)
        result = {"library": accelerate.__file__, "num_processes": accelerator.num_processes,
                  "distributed_type": str(accelerator.distributed_type), "losses": losses, "ema_sum": ema}
        name = "diffusers-resumed.json" if resume_from else "diffusers.json"
        with open(os.path.join(out, name), "w") as handle:
            json.dump(result, handle)
        print("DIFFUSERS LOOP DONE", json.dumps(result))
    accelerator.end_training()


if __name__ == "__main__":
    rest = sys.argv[2:]
    main(sys.argv[1], rest[rest.index("--resume") + 1] if "--resume" in rest else None)
