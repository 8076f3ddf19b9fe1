"""Context parallelism on real processes, run by tests/strategies/model_parallel/test_context_parallel.py as
``hasten launch -n 2 check_context_parallel.py <work>`` (cp=2), ``-n 4 ... <work> dp_shard`` (dp_shard=2 x cp=2) and
``-n 4 ... <work> tp`` (tp=2 x cp=2: attention heads split over tp, each head's sequence over cp).

A tiny causal transformer (SDPA attention, learned positions; shipped here) is trained 12 steps with every step
inside ``accelerator.maybe_context_parallel(buffers=[ids, labels, positions], buffer_seq_dims=[1, 1, 1])``: each rank
computes on half of every sequence. The losses (each rank's slice mean, averaged) and the final weights match the
same training on one process over whole sequences (with cp=2 alone, a transformers Llama too). Also: a prepared loader gives the ranks of one cp group the
same batches; the buffers are restored after the block unless listed in ``no_restore_buffers``; the model outside
the block sees whole sequences; a sequence cp does not divide, an attention mask and mismatched buffer lists are
refused with the reason; the checkpoint is saved for the test to load on one process. Prints
``CONTEXT PARALLEL CHECKS PASSED``.
"""
from __future__ import annotations

import copy
import os
import sys
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader

sys.path.insert(0, os.path.dirname(__file__))
from check_model_parallel import check, expect_error, say  # noqa: E402

from hasten import Accelerator, FullyShardedDataParallelPlugin, ParallelismConfig  # noqa: E402
from hasten.utils import TorchTensorParallelConfig, set_seed  # noqa: E402

VOCAB, WIDTH, HEADS, SEQUENCE, BATCH, STEPS = 32, 16, 2, 8, 4, 12
TOLERANCE = dict(rtol=1e-4, atol=2e-5)  # fp32: the attention's sums run over gathered keys in another order


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        # separate projections (tensor parallelism splits each by heads); no bias: a key bias has a zero gradient
        # (softmax ignores it), which Adam would turn from rounding noise into steps
        self.q, self.k, self.v = (nn.Linear(WIDTH, WIDTH, bias=False) for _ in range(3))
        self.out = nn.Linear(WIDTH, WIDTH)
        self.mask = None  # an attention mask, when a check asks for one

    def forward(self, x):
        batch, length, _ = x.shape
        q, k, v = (projection(x).view(batch, length, -1, WIDTH // HEADS).transpose(1, 2)
                   for projection in (self.q, self.k, self.v))
        if self.mask is not None:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=self.mask)
        else:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(batch, length, -1))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm1, self.attention = nn.LayerNorm(WIDTH), Attention()
        self.norm2, self.mlp = nn.LayerNorm(WIDTH), nn.Sequential(nn.Linear(WIDTH, 2 * WIDTH), nn.GELU(),
                                                                  nn.Linear(2 * WIDTH, WIDTH))

    def forward(self, x):
        x = x + self.attention(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class TinyCausalLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed, self.positions = nn.Embedding(VOCAB, WIDTH), nn.Embedding(SEQUENCE, WIDTH)
        self.layers = nn.ModuleList([Block(), Block()])
        self.norm, self.head = nn.LayerNorm(WIDTH), nn.Linear(WIDTH, VOCAB)

    def forward(self, ids, positions):
        x = self.embed(ids) + self.positions(positions)
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x))


def lm_loss(logits, labels):
    return F.cross_entropy(logits.reshape(-1, VOCAB), labels.reshape(-1))


def batches():
    generator = torch.Generator().manual_seed(4)
    return [torch.randint(0, VOCAB, (BATCH, SEQUENCE + 1), generator=generator) for _ in range(STEPS)]


def inputs(tokens):
    positions = torch.arange(SEQUENCE).expand(tokens.shape[0], SEQUENCE).clone()
    return tokens[:, :-1].clone(), tokens[:, 1:].clone(), positions


def reference(model):
    model = copy.deepcopy(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for tokens in batches():
        ids, labels, positions = inputs(tokens)
        loss = lm_loss(model(ids, positions), labels)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses, model.state_dict()


def check_llama() -> None:
    """A transformers Llama (tiny config, no download; SDPA attention, grouped-query heads, rotary positions from
    ``position_ids``) with cp=2 matches single-process training: no attention mask, the positions as a buffer."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from hasten.state import AcceleratorState

    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         attn_implementation="sdpa")
    set_seed(6)
    model = LlamaForCausalLM(config)
    reference = copy.deepcopy(model)
    reference_optimizer = torch.optim.AdamW(reference.parameters(), lr=1e-2)
    AcceleratorState._reset_state()
    # with activation checkpointing on the decoder layers: the recomputation in the backward pass must attend over
    # the whole sequence as the forward did
    plugin = FullyShardedDataParallelPlugin(fsdp_version=2, activation_checkpointing=True,
                                            auto_wrap_policy="transformer_based_wrap",
                                            transformer_cls_names_to_wrap=["LlamaDecoderLayer"])
    accelerator = Accelerator(cpu=True, parallelism_config=ParallelismConfig(cp_size=2), fsdp_plugin=plugin)
    model, optimizer = accelerator.prepare(model, torch.optim.AdamW(model.parameters(), lr=1e-2))
    generator = torch.Generator().manual_seed(8)
    for _ in range(6):
        tokens = torch.randint(0, 64, (2, 17), generator=generator)
        ids, labels = tokens[:, :-1].clone(), tokens[:, 1:].clone()
        positions = torch.arange(16).expand(2, 16).clone()
        expected = F.cross_entropy(reference(ids, position_ids=positions).logits.reshape(-1, 64), labels.reshape(-1))
        expected.backward()
        reference_optimizer.step()
        reference_optimizer.zero_grad()
        with accelerator.maybe_context_parallel(buffers=[ids, labels, positions], buffer_seq_dims=[1, 1, 1]):
            loss = F.cross_entropy(model(ids, position_ids=positions).logits.reshape(-1, 64), labels.reshape(-1))
            accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        got = accelerator.reduce(loss.detach(), reduction="mean").item()
        check(abs(got - expected.item()) <= TOLERANCE["atol"] + TOLERANCE["rtol"] * abs(expected.item()),
              f"Llama cp=2 loss {got} vs single-process {expected.item()}")
    weights = accelerator.get_state_dict(model)
    if accelerator.is_main_process:
        for key, value in reference.state_dict().items():
            check(torch.allclose(weights[key], value, **TOLERANCE), f"Llama {key} differs")
    say(accelerator, "ok: transformers Llama cp=2 with activation checkpointing matches single-process training "
                     "(6 steps)")


def main(work: Path, mode: str) -> None:
    set_seed(0)
    model = TinyCausalLM()
    expected_losses, expected_weights = reference(model)
    sizes = {"dp_shard": dict(dp_shard_size=2), "tp": dict(tp_size=2)}.get(mode, {})
    plan = {"layers.*.attention.q": "colwise", "layers.*.attention.k": "colwise", "layers.*.attention.v": "colwise",
            "layers.*.attention.out": "rowwise", "layers.*.mlp.0": "colwise", "layers.*.mlp.2": "rowwise"}
    handler = TorchTensorParallelConfig(tp_plan=plan) if mode == "tp" else None
    accelerator = Accelerator(cpu=True, parallelism_config=ParallelismConfig(cp_size=2, tp_handler=handler, **sizes))
    strategy = accelerator.strategy
    check(strategy.layout.cp == 2 and strategy.data_parallel_size == sizes.get("dp_shard_size", 1),
          f"layout {strategy.layout}")
    prepared = copy.deepcopy(model)
    prepared, optimizer = accelerator.prepare(prepared, torch.optim.AdamW(prepared.parameters(), lr=1e-2))

    # the ranks of one cp group read the same batches (data is split over the data-parallel ranks only)
    loader = accelerator.prepare(DataLoader(list(range(16)), batch_size=2))
    seen = [batch.tolist() for batch in loader]
    everyone = [None] * accelerator.num_processes
    torch.distributed.all_gather_object(everyone, (strategy.data_parallel_rank, seen))
    for rank_dp, rank_seen in everyone:
        check(rank_seen == next(s for d, s in everyone if d == rank_dp), f"a cp group read different data: {everyone}")

    losses = []
    dp_size, dp_rank = strategy.data_parallel_size, strategy.data_parallel_rank
    for step, tokens in enumerate(batches()):
        ids, labels, positions = inputs(tokens.chunk(dp_size)[dp_rank])
        whole = ids.clone()
        keep_sharded = {labels, positions} if step % 2 else set()
        with accelerator.maybe_context_parallel(buffers=[ids, labels, positions], buffer_seq_dims=[1, 1, 1],
                                                no_restore_buffers=keep_sharded):
            check(ids.shape[1] == SEQUENCE // 2, f"the block's ids have {ids.shape[1]} positions")
            loss = lm_loss(prepared(ids, positions), labels)
            accelerator.backward(loss)
        check(torch.equal(ids, whole), "ids restored after the block")
        check(labels.shape[1] == (SEQUENCE // 2 if step % 2 else SEQUENCE), "no_restore_buffers stay sharded")
        accelerator.clip_grad_norm_(prepared.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(accelerator.reduce(loss.detach(), reduction="mean").item())
    check(all(abs(a - b) <= TOLERANCE["atol"] + TOLERANCE["rtol"] * abs(b) for a, b in zip(losses, expected_losses)),
          f"losses {losses} vs single-process {expected_losses}")
    weights = accelerator.get_state_dict(prepared)
    if accelerator.is_main_process and os.environ.get("CP_DEBUG"):
        for key, value in expected_weights.items():
            print(key, float((weights[key] - value).abs().max()))
    if accelerator.is_main_process:
        for key, value in expected_weights.items():
            check(torch.allclose(weights[key], value, **TOLERANCE),
                  f"{key} differs by {(weights[key] - value).abs().max():.2e}")
    accelerator.save_state(work / "cp_checkpoint")  # DCP shards: the test loads them on one process
    if accelerator.is_main_process:
        torch.save(weights, work / "cp_weights.pt")
    name = {"dp_shard": "dp_shard=2 x cp=2", "tp": "tp=2 x cp=2"}.get(mode, "cp=2")
    say(accelerator, f"ok: {name} matches single-process training ({STEPS} steps)")

    # outside the block the model computes on whole sequences, as on one process
    ids, labels, positions = inputs(batches()[0])
    with torch.no_grad():
        logits = prepared(ids, positions)
    check(logits.shape[1] == SEQUENCE, "whole sequences outside the block")

    ids = torch.zeros(2, 7, dtype=torch.long)
    expect_error(lambda: accelerator.maybe_context_parallel(buffers=[ids], buffer_seq_dims=[1]).__enter__(),
                 "7 positions", "cp_size=2")
    expect_error(lambda: accelerator.maybe_context_parallel(buffers=[ids], buffer_seq_dims=[1, 1]).__enter__(),
                 "1 buffers and 2 buffer_seq_dims")
    unwrapped = accelerator.unwrap_model(prepared)
    ids, labels, positions = inputs(batches()[0])
    unwrapped.layers[0].attention.mask = torch.ones(SEQUENCE // 2, SEQUENCE // 2, dtype=torch.bool)

    def masked():
        with accelerator.maybe_context_parallel(buffers=[ids, positions], buffer_seq_dims=[1, 1]):
            prepared(ids, positions)

    expect_error(masked, "attention mask", "is_causal=True")
    unwrapped.layers[0].attention.mask = None
    with accelerator.maybe_context_parallel(buffers=[ids, ids, positions], buffer_seq_dims=[1, 1, 1]):
        check(ids.shape[1] == SEQUENCE // 2, f"a buffer given twice (labels=ids) is cut once: {ids.shape[1]} kept")
    check(ids.shape[1] == SEQUENCE, "a buffer given twice restored whole")
    expect_error(lambda: accelerator.maybe_context_parallel(buffers=[positions, positions],
                                                            buffer_seq_dims=[1, 0]).__enter__(),
                 "the same tensor", "another sequence dimension")
    check(ids.shape[1] == SEQUENCE, "buffers restored after an error in the block")
    say(accelerator, "ok: bad buffers and attention masks refused")
    if mode == "cp":
        check_llama()
    say(accelerator, "CONTEXT PARALLEL CHECKS PASSED")


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else "cp")
