"""GPU checks of loading for inference: bitsandbytes 8-bit and 4-bit quantized loading with generation, and
big-model dispatch over GPU + CPU + disk. The model is the Llama-style decoder of gpu_common, saved as
safetensors by the check itself (no download)."""
from __future__ import annotations

import time
from pathlib import Path

import torch
from gpu_common import LLAMA_TINY, Ctx, Llama, build_llama, greedy_generate, sized


def _config(ctx: Ctx, layers: int):
    if ctx.dry_run:
        return sized(LLAMA_TINY, layers=layers)
    return sized(LLAMA_TINY, vocab=4096, dim=512, layers=layers, heads=8, kv_heads=4, ffn=1408)


def _saved_model(ctx: Ctx, config) -> tuple:
    """A model with seeded weights, and the safetensors file that holds them."""
    from safetensors.torch import save_file

    model = build_llama(config, seed=0).eval()
    path = Path(ctx.work_dir) / "model.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
    return model, path


def _cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return torch.nn.functional.cosine_similarity(a.float().flatten(), b.float().flatten(), dim=0).item()


def _bytes(model: torch.nn.Module) -> int:
    return sum(t.numel() * t.element_size() for t in list(model.parameters()) + list(model.buffers()))


def _quantized(ctx: Ctx, bits: int) -> dict:
    """Load the saved model quantized, on the device, and compare its logits and greedy tokens with the float
    model's (float32 on the same device)."""
    from hasten import init_empty_weights
    from hasten.utils import BnbQuantizationConfig, load_and_quantize_model

    ctx.no_launcher()
    config = _config(ctx, layers=2 if ctx.dry_run else 4)
    model, path = _saved_model(ctx, config)
    model = model.to(ctx.device)
    prompt = torch.randint(0, config.vocab, (2, 16), generator=torch.Generator().manual_seed(3)).to(ctx.device)
    expected = model(prompt)
    expected_tokens = greedy_generate(model, prompt, 8)
    options = dict(load_in_8bit=True) if bits == 8 else dict(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                                              bnb_4bit_compute_dtype="bf16")
    started = time.perf_counter()
    with init_empty_weights():
        empty = Llama(config)
    quantized = load_and_quantize_model(empty, BnbQuantizationConfig(**options), weights_location=str(path),
                                        device_map={"": 0 if ctx.device == "cuda" else "cpu"})
    load_s = time.perf_counter() - started
    kind = "Linear8bitLt" if bits == 8 else "Linear4bit"
    layers = sum(type(m).__name__ == kind for m in quantized.modules())
    expected_layers = 7 * config.layers  # q, k, v, o and the three of the MLP; the output head stays unquantized
    assert layers == expected_layers, f"{layers} {kind} layers, expected {expected_layers}"
    with torch.no_grad():
        logits = quantized(prompt)
    cosine = _cosine(logits, expected)
    minimum = 0.99 if bits == 8 else 0.95
    assert torch.isfinite(logits).all() and cosine > minimum, \
        f"logits cosine {cosine:.4f} vs the float model (< {minimum})"
    started = time.perf_counter()
    tokens = greedy_generate(quantized, prompt, 8)
    generate_s = time.perf_counter() - started
    agree = (tokens[:, 16:] == expected_tokens[:, 16:]).float().mean().item()
    ratio = _bytes(quantized) / _bytes(model)
    return {"detail": f"{layers} {kind} layers, {100 * ratio:.0f}% of the float32 bytes, logits cosine {cosine:.4f}, "
                      f"8 greedy tokens x2 in {generate_s:.2f} s ({100 * agree:.0f}% equal to the float model's), "
                      f"loaded in {load_s:.2f} s",
            "metrics": {"layers": layers, "bytes_ratio": ratio, "cosine": cosine, "token_agreement": agree,
                        "load_s": load_s, "generate_s": generate_s}}


def bnb_8bit(ctx: Ctx) -> dict:
    """``load_and_quantize_model`` with ``load_in_8bit``: int8 linear layers, logits close to the float model's,
    generation works."""
    return _quantized(ctx, 8)


def bnb_4bit(ctx: Ctx) -> dict:
    """``load_and_quantize_model`` with ``load_in_4bit`` (nf4, bf16 compute): 4-bit linear layers, logits close to
    the float model's, generation works."""
    return _quantized(ctx, 4)


def big_model_dispatch(ctx: Ctx) -> dict:
    """``load_checkpoint_and_dispatch`` with a device map over the GPU, the CPU and the disk: offloaded weights stay
    off the GPU (disk ones on the meta device), and logits and greedy tokens equal the model loaded whole. Also
    ``infer_auto_device_map`` under a small memory budget plans all three places."""
    from hasten import infer_auto_device_map, init_empty_weights, load_checkpoint_and_dispatch

    ctx.no_launcher()
    torch.backends.cuda.matmul.allow_tf32 = False
    config = _config(ctx, layers=4)
    model, path = _saved_model(ctx, config)
    gpu = 0 if ctx.device == "cuda" else "cpu"
    device_map = {"tok_embeddings": gpu, "layers.0": gpu, "layers.1": "cpu", "layers.2": "disk", "layers.3": "disk",
                  "norm": "cpu", "output": gpu}
    with init_empty_weights():
        empty = Llama(config)
    dispatched = load_checkpoint_and_dispatch(empty, str(path), device_map=device_map,
                                              offload_folder=str(Path(ctx.work_dir) / "offload"))
    on_meta = {p.device.type for p in dispatched.layers[2].parameters()}
    assert on_meta == {"meta"}, f"disk-offloaded layer's parameters on {on_meta}"
    if ctx.device == "cuda":
        on_cpu = {p.device.type for p in dispatched.layers[1].parameters()}
        assert on_cpu <= {"cpu", "meta"}, f"CPU-offloaded layer's parameters on {on_cpu}"
    prompt = torch.randint(0, config.vocab, (2, 16), generator=torch.Generator().manual_seed(4)).to(ctx.device)
    whole = model.to(ctx.device)
    with torch.no_grad():
        expected = whole(prompt)
        started = time.perf_counter()
        logits = dispatched(prompt)
        dispatched_s = time.perf_counter() - started
        started = time.perf_counter()
        whole(prompt)
        whole_s = time.perf_counter() - started
    assert torch.allclose(logits.to(expected.device), expected, rtol=1e-4, atol=1e-5), \
        f"max |dispatched - whole| {(logits.to(expected.device) - expected).abs().max().item()}"
    tokens, expected_tokens = greedy_generate(dispatched, prompt, 4), greedy_generate(whole, prompt, 4)
    assert torch.equal(tokens.to(expected_tokens.device), expected_tokens), "greedy tokens differ"
    size = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    with init_empty_weights():
        planned = infer_auto_device_map(Llama(config), max_memory={gpu: size // 3, "cpu": size // 3},
                                        no_split_module_classes=["Block"])
    places = sorted({str(v) for v in planned.values()})
    return {"detail": f"map over {sorted({str(v) for v in device_map.values()})}: logits and 4 greedy tokens equal "
                      f"the whole model's; forward {1000 * dispatched_s:.1f} ms vs {1000 * whole_s:.1f} ms whole; "
                      f"auto map under a third of the size per device plans {places}",
            "metrics": {"dispatched_forward_s": dispatched_s, "whole_forward_s": whole_s, "auto_map": planned}}
