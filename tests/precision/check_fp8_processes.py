"""fp8 (torchao) on two launched processes, run by tests/precision/test_fp8_training.py as
``hasten launch -n 2 check_fp8_processes.py <work>``:

1. DDP: three steps end at the parameters of the same fp8 training done by hand on one process (torchao's
   conversion, bf16 autocast, both processes seeing the same batch), and ``save_state`` / ``load_state`` bring the
   weights back after they were zeroed (torchao keeps the fp8 layers' weights in a wrapper tensor);
2. FSDP2 (fp8 all-gather of the sharded weights): it trains, and the checkpoint brings the weights back;
3. DeepSpeed ZeRO-2 and ZeRO-3: the fp8 layers are converted before the engine (with plain weights, which the
   engine flattens), the run ends at the parameters of a bf16 DeepSpeed run on a model converted by hand, and
   the checkpoint brings the weights back.
"""
import sys
from pathlib import Path

import torch
from torch import nn

from fp8_by_hand import train_by_hand
from hasten import Accelerator
from hasten.state import AcceleratorState
from hasten.utils import DeepSpeedPlugin, FullyShardedDataParallelPlugin


def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.Linear(32, 32), nn.Linear(32, 16))


def batch():
    generator = torch.Generator().manual_seed(1)
    return torch.randn(8, 16, generator=generator), torch.randn(8, 16, generator=generator)


def by_hand(steps: int) -> dict:
    model = train_by_hand(mlp(), ("1",), steps, *batch())
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def train(accelerator, steps: int, model=None):
    model = mlp() if model is None else model
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    assert type(accelerator.unwrap_model(model)[1]).__name__ == "Float8Linear"
    x, y = batch()
    if accelerator.state.deepspeed_plugin is not None:  # each process its half of the batch, as a loader gives
        x, y = x[accelerator.process_index::2], y[accelerator.process_index::2]
    losses = []
    for _ in range(steps):
        loss = nn.functional.mse_loss(model(x), y)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return model, losses


def check_restore(accelerator, model, folder: Path) -> None:
    before = {k: v.clone() for k, v in accelerator.get_state_dict(model).items()}
    accelerator.save_state(folder)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.zero_()
    accelerator.load_state(folder)
    after = accelerator.get_state_dict(model)
    if accelerator.is_main_process:
        assert before and all(torch.equal(before[k], after[k]) for k in before), "the checkpoint did not restore"


def main(work: Path) -> None:
    accelerator = Accelerator(mixed_precision="fp8")
    model, ddp_losses = train(accelerator, 3)
    expected = by_hand(3)
    got = accelerator.get_state_dict(model)
    for key, value in expected.items():
        assert torch.allclose(got[key].float(), value.float(), atol=1e-6), (key, (got[key] - value).abs().max())
    check_restore(accelerator, model, work / "ddp")
    accelerator.print("ok: fp8 under DDP equals one process by hand, and resumes")

    AcceleratorState._reset_state(True)
    accelerator = Accelerator(mixed_precision="fp8", fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=2))
    model, losses = train(accelerator, 3)
    assert losses[-1] < losses[0] and all(abs(a - b) < 0.05 * b for a, b in zip(losses, ddp_losses)), (
        losses, ddp_losses)
    check_restore(accelerator, model, work / "fsdp2")
    accelerator.print("ok: fp8 under FSDP2 trains and resumes")

    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    for stage in (2, 3):
        results = {}
        for precision in ("bf16", "fp8"):
            AcceleratorState._reset_state(True)
            accelerator = Accelerator(mixed_precision=precision, deepspeed_plugin=DeepSpeedPlugin(
                zero_stage=stage, gradient_accumulation_steps=1))
            accelerator.state.deepspeed_plugin.deepspeed_config["train_micro_batch_size_per_gpu"] = 4
            model = mlp()
            if precision == "bf16":  # by hand: the middle layer converted with plain weights
                model = convert_to_float8_training(model, config=Float8LinearConfig(pad_inner_dim=True),
                                                   module_filter_fn=lambda module, fqn: fqn == "1")
            model, _ = train(accelerator, 3, model)
            results[precision] = {k: v.clone() for k, v in accelerator.get_state_dict(model).items()}
        assert accelerator.fp8_backend.value == "AO"
        if accelerator.is_main_process:
            for key, value in results["bf16"].items():
                assert torch.equal(results["fp8"][key], value), (stage, key)
        check_restore(accelerator, model, work / f"zero{stage}")
        accelerator.print(f"ok: fp8 under ZeRO-{stage} equals the layers converted by hand, and resumes")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
