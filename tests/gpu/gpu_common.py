"""What the GPU checks share: the context a check runs in, and models, data and timing in plain PyTorch
(no hasten, no reference library, no download).

``Llama`` is a Llama-style decoder (RMSNorm, rotary embeddings, grouped-query attention through
``scaled_dot_product_attention``, SwiGLU) built from a ``LlamaConfig``: ``LLAMA_1B`` is the ~1.1B-parameter size
of the throughput check, ``LLAMA_TINY`` the size of the dry run and of the correctness checks.

A check is a function ``check(ctx: Ctx) -> dict`` that raises ``Skip(reason)`` when it cannot run here, and any
other exception (a failed assertion) when hasten got it wrong. The dict it returns holds:

- ``detail``: one line of what it showed; ``metrics``: any figures (JSON);
- ``timings``: ``{loop: [seconds of each timed window]}`` with a ``plain`` loop (``alternate`` makes it), and
  ``steps_per_window``; ``pairs`` (``{ratio name: [loop a, loop b]}``) when the ratios are not ``loop/plain``;
- ``tokens_per_step`` and ``params`` (the throughput check: tokens/s and MFU);
- ``for_reference``: handed to the reference variant as ``ctx.inputs``;
- ``failed``: a message; the check fails with it and keeps its figures.
"""
from __future__ import annotations

import math
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import torch
import torch.nn.functional as F
from torch import nn


class Skip(Exception):
    """Raised by a check that cannot run here; its message is the reason shown in the summary."""


@dataclass
class Ctx:
    """What a check is told: which variant it runs (``hasten``, or ``reference``: the same loop with the reference
    library, in a process of its own), on which device, whether this is the CPU dry run, a fresh folder for its
    files, and what the hasten variant handed to the reference one (``inputs``)."""

    name: str
    variant: str = "hasten"
    dry_run: bool = False
    device: str = "cuda"
    work_dir: str = "."
    inputs: dict = field(default_factory=dict)

    def say(self, *parts) -> None:
        print(f"[{self.name}/{self.variant}]", *parts, flush=True)

    def world_of_one(self) -> None:
        """The environment a launcher gives rank 0 of a world of one (a free port on this machine)."""
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
                          MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))

    def library(self):
        """The library this variant trains with: ``hasten``, or the reference ``accelerate``."""
        import importlib

        return importlib.import_module("accelerate" if self.variant == "reference" else "hasten")

    def no_launcher(self) -> None:
        """Forget any launcher environment (a plain `python script.py`)."""
        for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
            os.environ.pop(key, None)


@dataclass(frozen=True)
class LlamaConfig:
    vocab: int = 32000
    dim: int = 2048
    layers: int = 22
    heads: int = 32
    kv_heads: int = 4
    ffn: int = 5632
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5


LLAMA_1B = LlamaConfig()  # TinyLlama's shape: 1.10B parameters
LLAMA_TINY = LlamaConfig(vocab=256, dim=64, layers=2, heads=4, kv_heads=2, ffn=128)


def sized(config: LlamaConfig, **changes) -> LlamaConfig:
    return replace(config, **changes)


def rotary(seq: int, head_dim: int, theta: float, device) -> tuple:
    """cos and sin tables of shape (seq, head_dim / 2), in float32."""
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim))
    angles = torch.outer(torch.arange(seq, device=device, dtype=torch.float32), inv)
    return angles.cos(), angles.sin()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: (batch, heads, seq, head_dim); pairs (even, odd) rotated by the position's angle."""
    x1, x2 = x.float()[..., 0::2], x.float()[..., 1::2]
    out = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)
    return out.to(x.dtype)


class Attention(nn.Module):
    def __init__(self, c: LlamaConfig):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = c.heads, c.kv_heads, c.dim // c.heads
        self.wq = nn.Linear(c.dim, c.heads * self.head_dim, bias=False)
        self.wk = nn.Linear(c.dim, c.kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(c.dim, c.kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(c.heads * self.head_dim, c.dim, bias=False)

    def forward(self, x, cos, sin):
        b, t, _ = x.shape
        q = self.wq(x).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        repeat = self.heads // self.kv_heads  # grouped-query attention: each kv head serves `repeat` q heads
        k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(b, t, -1))


class FeedForward(nn.Module):
    def __init__(self, c: LlamaConfig):
        super().__init__()
        self.w1 = nn.Linear(c.dim, c.ffn, bias=False)
        self.w3 = nn.Linear(c.dim, c.ffn, bias=False)
        self.w2 = nn.Linear(c.ffn, c.dim, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, c: LlamaConfig):
        super().__init__()
        self.attention_norm = nn.RMSNorm(c.dim, eps=c.norm_eps)
        self.attention = Attention(c)
        self.ffn_norm = nn.RMSNorm(c.dim, eps=c.norm_eps)
        self.feed_forward = FeedForward(c)

    def forward(self, x, cos, sin):
        x = x + self.attention(self.attention_norm(x), cos, sin)
        return x + self.feed_forward(self.ffn_norm(x))


class Llama(nn.Module):
    """Token ids (batch, seq) -> logits (batch, seq, vocab)."""

    _no_split_modules = ["Block"]  # the unit FSDP wraps and big-model dispatch keeps whole

    def __init__(self, c: LlamaConfig):
        super().__init__()
        self.config = c
        self.tok_embeddings = nn.Embedding(c.vocab, c.dim)
        self.layers = nn.ModuleList(Block(c) for _ in range(c.layers))
        self.norm = nn.RMSNorm(c.dim, eps=c.norm_eps)
        self.output = nn.Linear(c.dim, c.vocab, bias=False)

    def forward(self, tokens):
        h = self.tok_embeddings(tokens)
        cos, sin = rotary(tokens.shape[1], self.config.dim // self.config.heads, self.config.rope_theta, h.device)
        for layer in self.layers:
            h = layer(h, cos, sin)
        return self.output(self.norm(h))


def build_llama(config: LlamaConfig, seed: int = 0, device="cpu") -> Llama:
    """The same weights for the same seed and device, on every variant of a check (built on ``device``)."""
    with torch.device(device):
        model = Llama(config)
    torch.manual_seed(seed)
    for name, p in model.named_parameters():
        if p.dim() == 2:
            nn.init.normal_(p, std=0.02 / (math.sqrt(2 * config.layers) if name.endswith(("wo.weight", "w2.weight"))
                                           else 1.0))
    return model


def count_parameters(model: nn.Module, exclude_embedding: bool = True) -> int:
    """Parameters that take part in matrix products (the embedding lookup is not one): the N of 6*N*tokens."""
    skip = {id(p) for n, p in model.named_parameters() if exclude_embedding and "tok_embeddings" in n}
    return sum(p.numel() for p in model.parameters() if id(p) not in skip)


def lm_loss(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy in float32; ``logits`` come from ``tokens[:, :-1]``."""
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))


def token_batches(count: int, batch: int, seq: int, vocab: int, device, seed: int = 1) -> list[torch.Tensor]:
    """``count`` batches of random token ids of length seq + 1 (inputs and shifted targets), made once."""
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (batch, seq + 1), generator=generator).to(device) for _ in range(count)]


@torch.no_grad()
def greedy_generate(model: nn.Module, prompt: torch.Tensor, new_tokens: int) -> torch.Tensor:
    """Greedy decoding without a cache (the models here are small): prompt (batch, seq) -> (batch, seq + new)."""
    tokens = prompt
    for _ in range(new_tokens):
        logits = model(tokens)[:, -1]
        tokens = torch.cat([tokens, logits.argmax(-1, keepdim=True).to(tokens.device)], dim=1)
    return tokens


class MLP(nn.Module):
    """A residual MLP regression model; widths are multiples of 16 (what fp8 matrix products need)."""

    def __init__(self, width: int = 256, depth: int = 4, out: int = 16):
        super().__init__()
        self.blocks = nn.ModuleList(nn.Sequential(nn.LayerNorm(width), nn.Linear(width, 4 * width), nn.GELU(),
                                                  nn.Linear(4 * width, width)) for _ in range(depth))
        self.head = nn.Linear(width, out)

    def forward(self, x):
        for block in self.blocks:
            x = x + block(x)
        return self.head(x)


def build_mlp(width: int, depth: int, seed: int = 0, device="cpu") -> MLP:
    torch.manual_seed(seed)
    return MLP(width, depth).to(device)


def regression_batches(count: int, batch: int, width: int, device, seed: int = 2) -> list[tuple]:
    """Inputs and targets from a fixed random linear teacher, so that the loss goes down."""
    generator = torch.Generator().manual_seed(seed)
    teacher = torch.randn(width, 16, generator=generator) / math.sqrt(width)
    xs = [torch.randn(batch, width, generator=generator) for _ in range(count)]
    return [(x.to(device), (x @ teacher).to(device)) for x in xs]


# ---------------------------------------------------------------------------------------------- timing
def synchronize(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def alternate(loops: dict[str, Callable[[int], None]], windows: int, steps: int, device) -> dict[str, list[float]]:
    """Time each loop for ``steps`` steps in turn, ``windows`` times, the order reversed every other window (ABBA)
    so that a drift of the machine falls on both; returns the seconds of each window per loop."""
    names = list(loops)
    seconds: dict[str, list[float]] = {name: [] for name in names}
    for window in range(windows):
        for name in (names if window % 2 == 0 else names[::-1]):
            synchronize(device)
            start = time.perf_counter()
            loops[name](steps)
            synchronize(device)
            seconds[name].append(time.perf_counter() - start)
    return seconds



# ---------------------------------------------------------------------------------------------- the probe
OPTIONAL_MODULES = {"accelerate": "accelerate", "deepspeed": "deepspeed", "bitsandbytes": "bitsandbytes",
                    "torchao": "torchao", "crc32c": "crc32c", "transformers": "transformers"}


def probe(ctx: Ctx) -> dict:
    """What this machine has: torch, CUDA, the GPU, the optional modules, and which hasten runs (the checkout's)."""
    import importlib.metadata
    import importlib.util
    import sys

    import hasten

    info = {"python": sys.version.split()[0], "torch": torch.__version__, "bad_fork": torch.cuda._is_in_bad_fork(),
            "cuda": torch.cuda.is_available(),
            "hasten": getattr(hasten, "__version__", "?"), "hasten_path": os.path.dirname(hasten.__file__),
            "modules": {}}
    for module, dist in OPTIONAL_MODULES.items():
        if importlib.util.find_spec(module) is not None:
            try:
                info["modules"][module] = importlib.metadata.version(dist)
            except importlib.metadata.PackageNotFoundError:
                info["modules"][module] = "unknown version"
        else:
            info["modules"][module] = None
    if info["cuda"]:
        props = torch.cuda.get_device_properties(0)
        info.update(device_name=props.name, capability=list(torch.cuda.get_device_capability(0)),
                    memory_gib=round(props.total_memory / 2 ** 30, 1), cuda_runtime=torch.version.cuda,
                    nccl=_nccl_version(), gpus=torch.cuda.device_count())
    where = (f"{info['device_name']} (sm_{''.join(map(str, info['capability']))}, {info['memory_gib']} GiB, "
             f"CUDA {info['cuda_runtime']}, NCCL {info['nccl']})" if info["cuda"] else "CPU only")
    present = ", ".join(f"{m} {v}" for m, v in info["modules"].items() if v)
    missing = ", ".join(m for m, v in info["modules"].items() if not v)
    info["line"] = (f"{where}; torch {info['torch']}; hasten {info['hasten']} from {info['hasten_path']}; "
                    f"present: {present or '-'}; missing: {missing or '-'}")
    return info


def _nccl_version() -> str:
    try:
        version = torch.cuda.nccl.version()
    except Exception as error:  # a torch built without NCCL
        return f"unavailable ({error})"
    return ".".join(map(str, version)) if isinstance(version, (tuple, list)) else str(version)
