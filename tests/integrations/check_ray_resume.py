"""The same training on two processes, two ways, ending with the same weights:

    hasten launch -n 2 check_ray_resume.py plain OUT   # uninterrupted, no Ray
    python check_ray_resume.py ray OUT                  # a local Ray cluster, TorchTrainer with 2 CPU workers

Under Ray every rank reports its state each epoch (hasten.integrations.ray.report; Ray copies the folders into one
checkpoint), rank 1 is SIGKILLed once at the start of epoch 3, Ray restarts the group (FailureConfig), and the new
workers resume from the last checkpoint Ray registered (hasten.integrations.ray.resume). Each rank draws its data
from the global random generator, so the weights match the uninterrupted run only if every rank's random states,
the momentum and the epoch counter came back. Rank 0 writes the final weights to OUT/<mode>.pt and, under Ray, the
epoch it resumed from to OUT/resumed_from.txt.

In the same Ray session, the training function Ray's guide for Hugging Face Accelerate shows (``from accelerate
import Accelerator``, ``prepare``, ``backward``, ``ray.train.report`` with a checkpoint folder of rank 0's saved
model) runs with ``HASTEN_AS_ACCELERATE=1`` in the workers' environment: ``accelerate`` is hasten there, the two
workers train as one job, and each writes what it saw to OUT/accelerate_<rank>.txt.
"""
import os
import signal
import sys
import time

import torch
from torch import nn

EPOCHS, KILLED_AT = 5, 3


class Progress:
    """The epochs done, saved with the state (register_for_checkpointing)."""

    def __init__(self):
        self.epoch = 0

    def state_dict(self):
        return {"epoch": self.epoch}

    def load_state_dict(self, state):
        self.epoch = state["epoch"]


def train(out, report=None, resume=None):
    from hasten import Accelerator

    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    model, optimizer = accelerator.prepare(model, optimizer)
    progress = Progress()
    accelerator.register_for_checkpointing(progress)
    torch.manual_seed(100 + accelerator.process_index)  # each rank its own data stream
    if resume is not None and resume(accelerator) is not None and accelerator.is_main_process:
        with open(os.path.join(out, "resumed_from.txt"), "w") as handle:
            handle.write(str(progress.epoch))
    marker = os.path.join(out, "killed_once")
    while progress.epoch < EPOCHS:
        if report is not None and progress.epoch == KILLED_AT and accelerator.process_index == 1 \
                and not os.path.exists(marker):
            open(marker, "w").close()
            time.sleep(3)  # Ray registers the reported checkpoints in the background: let it see the last one
            os.kill(os.getpid(), signal.SIGKILL)
        for _ in range(4):
            x = torch.randn(16, 8)
            loss = (model(x) - x.sum(dim=1, keepdim=True)).pow(2).mean()
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
        progress.epoch += 1
        if report is not None:
            report(accelerator, {"epoch": progress.epoch, "loss": loss.item()})
    if accelerator.is_main_process:
        weights = {name: value.detach().clone() for name, value in accelerator.unwrap_model(model).state_dict().items()}
        torch.save(weights, os.path.join(out, f"{'ray' if report else 'plain'}.pt"))
    accelerator.wait_for_everyone()


def accelerate_guide_train_func(config):
    """Ray's guide's shape for Accelerate, unchanged but for the sizes; run with HASTEN_AS_ACCELERATE=1."""
    import tempfile

    import accelerate
    import ray.train
    from accelerate import Accelerator
    from torch.utils.data import DataLoader, TensorDataset

    accelerator = Accelerator()
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = DataLoader(TensorDataset(torch.randn(32, 4), torch.randn(32, 1)), batch_size=4)
    model, optimizer, data = accelerator.prepare(model, optimizer, data)
    for epoch in range(2):
        for x, y in data:
            loss = nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            accelerator.backward(loss)
            optimizer.step()
        with tempfile.TemporaryDirectory() as folder:
            if accelerator.is_main_process:
                torch.save(accelerator.unwrap_model(model).state_dict(), os.path.join(folder, "model.pt"))
            checkpoint = ray.train.Checkpoint.from_directory(folder) if accelerator.is_main_process else None
            ray.train.report({"epoch": epoch, "loss": loss.item()}, checkpoint=checkpoint)
    weights = accelerator.gather(torch.cat([p.detach().flatten() for p in model.parameters()])[None])
    with open(os.path.join(config["out"], f"accelerate_{accelerator.process_index}.txt"), "w") as handle:
        handle.write(f"{accelerate.__name__} {'hasten' in accelerate.__doc__} {accelerator.num_processes} "
                     f"{len(data)} {torch.equal(weights[0], weights[1])}")


def run_ray(out):
    import ray
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    def train_func(config):
        from hasten.integrations.ray import report, resume

        train(config["out"], report=report, resume=resume)

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=True,
             runtime_env={"env_vars": {"HASTEN_AS_ACCELERATE": "1"}})
    try:
        trainer = TorchTrainer(train_func, train_loop_config={"out": out},
                               scaling_config=ScalingConfig(num_workers=2, use_gpu=False),
                               run_config=RunConfig(name="hasten-ray", storage_path=os.path.join(out, "storage"),
                                                    failure_config=FailureConfig(max_failures=1)))
        result = trainer.fit()
        print(f"RAY DONE error={result.error!r}", flush=True)
        trainer = TorchTrainer(accelerate_guide_train_func, train_loop_config={"out": out},
                               scaling_config=ScalingConfig(num_workers=2, use_gpu=False),
                               run_config=RunConfig(name="accelerate-guide", storage_path=os.path.join(out, "storage")))
        result = trainer.fit()
        print(f"RAY ACCELERATE DONE error={result.error!r} checkpoint={result.checkpoint is not None}", flush=True)
    finally:
        ray.shutdown()


if __name__ == "__main__":
    mode, out = sys.argv[1], sys.argv[2]
    if mode == "ray":
        run_ray(out)
    else:
        train(out)
