"""Data-parallel least squares with nothing but process state and collectives (no Accelerator).

    hasten launch -n 2 examples/by_feature/collectives.py

Every process takes its share of a generated regression data set, computes gradients on it, and the
processes average them with `reduce`; the result is checked against the exact least-squares solution.
"""
import torch

from hasten import PartialState
from hasten.utils import gather, gather_object, reduce


def main():
    state = PartialState()
    g = torch.Generator().manual_seed(0)  # the same data on every process
    x = torch.randn(4096, 8, generator=g)
    y = x @ torch.linspace(-1.0, 1.0, 8) + 0.01 * torch.randn(4096, generator=g)
    with state.split_between_processes({"x": x, "y": y}) as share:
        x_local, y_local = share["x"], share["y"]
    w = torch.zeros(8)
    for _ in range(200):
        grad = 2 * x_local.T @ (x_local @ w - y_local) / len(x_local)
        w -= 0.1 * reduce(grad, reduction="mean")
    losses = gather(((x_local @ w - y_local) ** 2).mean())
    sizes = gather_object(len(x_local))
    error = (w - torch.linalg.lstsq(x, y.unsqueeze(1)).solution.squeeze(1)).abs().max().item()
    state.print(f"per-process loss {losses.tolist()}, samples {sizes}, max |w - exact| = {error:.2e}")
    if error > 1e-3:
        raise SystemExit("collectives example failed")


if __name__ == "__main__":
    main()
