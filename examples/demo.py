"""A small data-parallel job that runs unchanged on 1 or N processes.

    hasten launch -n 2 examples/demo.py      # or: python examples/demo.py

Every process takes its share of a generated regression data set, computes gradients on it, and the
processes average them with `reduce`; the result is checked against the exact least-squares solution.
(The training-core issue grows this into a full `Accelerator` training script.)
"""
import torch

from hasten import PartialState
from hasten.utils import gather, gather_object, reduce, set_seed


def make_data(num_samples: int = 4096, num_features: int = 8):
    generator = torch.Generator().manual_seed(0)  # the same data on every process
    x = torch.randn(num_samples, num_features, generator=generator)
    true_w = torch.linspace(-1.0, 1.0, num_features)
    y = x @ true_w + 0.01 * torch.randn(num_samples, generator=generator)
    return x, y


def main():
    state = PartialState()
    set_seed(0)
    x, y = make_data()
    with state.split_between_processes({"x": x, "y": y}) as share:
        x_local, y_local = share["x"], share["y"]
    state.print(f"{state.num_processes} process(es) on {state.device}; {len(x_local)} samples on process 0")

    w = torch.zeros(x.shape[1])
    for step in range(200):
        residual = x_local @ w - y_local
        grad = 2 * x_local.T @ residual / len(x_local)
        grad = reduce(grad, reduction="mean")  # same shares everywhere, so the mean is the full-data gradient
        w -= 0.1 * grad

    local_loss = ((x_local @ w - y_local) ** 2).mean()
    losses = gather(local_loss)
    sizes = gather_object(len(x_local))
    exact = torch.linalg.lstsq(x, y.unsqueeze(1)).solution.squeeze(1)
    error = (w - exact).abs().max().item()
    state.print(f"per-process loss: {[round(v, 6) for v in losses.tolist()]}  samples: {sizes}")
    state.print(f"max |w - least squares| = {error:.2e}")
    if error > 1e-3:
        raise SystemExit(f"demo failed: the data-parallel fit is {error:.2e} away from the exact solution")
    state.print("demo OK")


if __name__ == "__main__":
    main()
