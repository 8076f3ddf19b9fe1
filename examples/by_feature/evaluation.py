"""Evaluation that counts every sample exactly once, tensors and Python objects alike.

    hasten launch -n 2 examples/by_feature/evaluation.py

103 samples do not divide evenly over 2 processes and batches of 10: the prepared loader repeats a few
samples so every process gets full batches, and gather_for_metrics drops exactly those repeats.
"""
import torch
from torch.utils.data import DataLoader

from hasten import Accelerator
from hasten.utils import tqdm


def main():
    accelerator = Accelerator()
    loader = accelerator.prepare(DataLoader(torch.arange(103), batch_size=10))
    seen, names = [], []
    for batch in tqdm(loader, desc="evaluate", disable=None):  # a bar on the main process only
        seen.append(accelerator.gather_for_metrics(batch))
        names += accelerator.gather_for_metrics([f"sample-{int(i)}" for i in batch])
    seen = torch.cat(seen)
    accelerator.print(f"gathered {len(seen)} tensors and {len(names)} names for 103 samples")
    assert seen.tolist() == list(range(103)) and names == [f"sample-{i}" for i in range(103)]
    accelerator.print("evaluation example OK")


if __name__ == "__main__":
    main()
