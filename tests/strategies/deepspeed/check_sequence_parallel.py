"""DeepSpeed sequence parallelism (ALST / Ulysses) on real processes, run by test_sequence_parallel.py as
``hasten launch --config_file <sp2.yaml> check_sequence_parallel.py <work>`` (2 processes, sp_size=2).

One Accelerator after another (the state is reset between them), on a tiny Llama built from its config (sdpa):

0. plain PyTorch on one process, first (Ulysses wraps transformers' sdpa for the whole process once registered):
   one sample per step, in order, SGD, the loss transformers computes from the labels;
1. the config file's settings (distributed_type DEEPSPEED, zero_stage 2, the parallelism_config_sp_* keys) reach
   the strategy; a model without a transformers config is refused before DeepSpeed makes any group;
2. for ZeRO stages 1, 2 and 3 (and 2 with 3 accumulation steps, whose last cycle the loader's end closes):
   prepare(model, optimizer, loader) registers Ulysses, hands the engine the mpu and wraps the loader in
   DeepSpeed's adapter; the loop aggregates the loss as the reference documents (each rank's shard loss weighted
   by its counted tokens over the group); every step's loss, gradient norm and the final weights equal step 0's
   within the conformance suite's TOLERANCE;
3. deepspeed_ulysses_dl_adapter(dl, model) for a loader prepared apart: each rank gets its half of each sequence,
   the labels as shift_labels;
4. save_state / load_state resume exactly (ZeRO-2, momentum).

Prints ``SEQUENCE PARALLEL CHECKS PASSED`` and one ``MAX DIFF`` line per stage.
"""
from __future__ import annotations

import copy
import os
import sys

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader
from transformers import LlamaConfig, LlamaForCausalLM

from hasten import Accelerator, DeepSpeedPlugin, ParallelismConfig
from hasten.state import AcceleratorState, GradientState
from hasten.strategies.deepspeed.sequence_parallel import sequence_parallel_loss
from hasten.utils import DeepSpeedSequenceParallelConfig, set_seed

TOLERANCE = dict(rtol=1e-5, atol=1e-6)  # tests/strategies/check_strategy_conformance.py's
SAMPLES, SEQ, VOCAB, LR, MAX_NORM = 8, 16, 64, 0.1, 100.0  # MAX_NORM: the norm is returned, never reached


def say(line: str) -> None:
    if dist.get_rank() == 0:
        os.write(1, (line + "\n").encode())


def fresh_model() -> LlamaForCausalLM:
    set_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         attn_implementation="sdpa")
    return LlamaForCausalLM(config)


def samples() -> list:
    """Token ids, positions and labels; the first tokens of each sample (a "prompt" of 1-5 tokens) are not
    counted (-100), so the two halves of a sequence count different numbers of tokens."""
    generator = torch.Generator().manual_seed(5)
    ids = torch.randint(0, VOCAB, (SAMPLES, SEQ), generator=generator)
    rows = []
    for i in range(SAMPLES):
        labels = ids[i].clone()
        labels[: i % 5 + 1] = -100
        rows.append({"input_ids": ids[i], "position_ids": torch.arange(SEQ), "labels": labels})
    return rows


def collate(rows: list) -> dict:
    return {key: torch.stack([row[key] for row in rows]) for key in rows[0]}


def reference_run(accumulation: int = 1):
    """Plain PyTorch, one process: one sample per micro-step, in order, ``accumulation`` micro-steps per step
    (the last step takes what is left, each loss divided by ``accumulation`` as hasten does)."""
    model = fresh_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    losses, norms, rows = [], [], samples()
    for start in range(0, SAMPLES, accumulation):
        for row in rows[start:start + accumulation]:
            loss = model(**collate([row])).loss
            (loss / accumulation).backward()
            losses.append(loss.item())
        norms.append(torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM).item())
        optimizer.step()
        optimizer.zero_grad()
    return losses, norms, {name: value.detach().clone() for name, value in model.state_dict().items()}


def fresh_accelerator(**kwargs) -> Accelerator:
    AcceleratorState._reset_state()
    GradientState._reset_state() if hasattr(GradientState, "_reset_state") else None
    return Accelerator(cpu=True, **kwargs)


def expect_error(function, *fragments) -> None:
    try:
        function()
    except (ValueError, TypeError) as error:
        missing = [fragment for fragment in fragments if fragment not in str(error)]
        assert not missing, f"the error {str(error)!r} does not say {missing}"
        return
    raise AssertionError(f"no error; expected one saying {fragments}")


def close(a, b) -> bool:
    return torch.allclose(torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64),
                          **TOLERANCE)


def train(accelerator, reference, stage: str, accumulation: int = 1) -> float:
    from deepspeed.runtime.sequence_parallel.ulysses_sp import UlyssesSPDataLoaderAdapter

    model = fresh_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    loader = DataLoader(samples(), batch_size=1, collate_fn=collate)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    assert isinstance(loader, UlyssesSPDataLoaderAdapter), type(loader)
    assert len(loader) == SAMPLES, len(loader)  # half the samples on each rank, each one trained by both ranks
    assert model.mpu is not None and model.sequence_parallel_size == 2, "the engine did not get the mpu"
    # micro batch 1 x accumulation x DeepSpeed's data-parallel size (2 processes / sp_size 2)
    assert model.train_batch_size() == accumulation, model.train_batch_size()
    group = accelerator.strategy.sequence_parallel.group
    unwrapped = accelerator.unwrap_model(model)
    losses, norms = [], []
    for batch in loader:
        assert set(batch) == {"input_ids", "position_ids", "shift_labels"} and batch["input_ids"].shape == (1, SEQ // 2)
        outputs = model(**batch)
        shift_labels = batch["shift_labels"]
        loss = unwrapped.loss_function(logits=outputs.logits, labels=None, shift_labels=shift_labels,
                                       vocab_size=unwrapped.config.vocab_size)
        # the reference's documented aggregation: differentiable, weighted by the counted tokens of each rank
        losses_per_rank = torch.distributed.nn.functional.all_gather(loss, group=group)
        good_tokens = (shift_labels != -100).view(-1).sum()
        good_tokens_per_rank = torch.distributed.nn.functional.all_gather(good_tokens, group=group)
        total_loss = sum(losses_per_rank[rank] * good_tokens_per_rank[rank] for rank in range(2)
                         if good_tokens_per_rank[rank] > 0)
        aggregated = total_loss / max(sum(good_tokens_per_rank), 1)
        helper = sequence_parallel_loss(loss, shift_labels, group)  # hasten's helper: the same number
        assert torch.equal(helper.detach(), aggregated.detach()), (helper, aggregated)
        with accelerator.accumulate(model):
            accelerator.backward(aggregated)
            if accelerator.sync_gradients:  # every `accumulation` micro-batches, and on the loader's last one
                norms.append(float(accelerator.clip_grad_norm_(model.parameters(), MAX_NORM)))
            optimizer.step()
            optimizer.zero_grad()
        losses.append(aggregated.item())
    ref_losses, ref_norms, ref_weights = reference
    assert len(losses) == len(ref_losses) and len(norms) == len(ref_norms), (len(norms), len(ref_norms))
    for step, (got, want) in enumerate(zip(losses, ref_losses)):
        assert close(got, want), f"{stage}: step {step} loss {got} vs one process's {want}"
    for step, (got, want) in enumerate(zip(norms, ref_norms)):
        assert close(got, want), f"{stage}: step {step} gradient norm {got} vs one process's {want}"
    weights = accelerator.strategy.master_model_state_dict(model)
    differences = {name: (weights[name].float() - want).abs().max().item() for name, want in ref_weights.items()}
    loss_difference = max(abs(a - b) for a, b in zip(losses, ref_losses))
    say(f"MAX DIFF {stage}: losses {loss_difference:.3g}, gradient norms "
        f"{max(abs(a - b) for a, b in zip(norms, ref_norms)):.3g}, weights {max(differences.values()):.3g}")
    for name, want in ref_weights.items():
        assert torch.allclose(weights[name].float(), want, **TOLERANCE), f"{stage}: {name} differs by " \
            f"{differences[name]} (largest weight {want.abs().max().item():.3g})"
    return max(loss_difference, *differences.values())


def check_adapter_for_a_loader_prepared_apart(accelerator, model) -> None:
    loader = accelerator.prepare(DataLoader(samples(), batch_size=1, collate_fn=collate))
    adapted = accelerator.deepspeed_ulysses_dl_adapter(loader, model)
    rank, rows, half = dist.get_rank(), samples(), SEQ // 2
    for index, batch in zip(range(2), adapted):  # the first two samples, each cut in halves over the group
        row = rows[index]
        shifted = torch.cat([row["labels"][1:], torch.tensor([-100])])
        part = slice(rank * half, (rank + 1) * half)
        assert torch.equal(batch["input_ids"][0], row["input_ids"][part]), "not this rank's half of the sequence"
        assert torch.equal(batch["position_ids"][0], row["position_ids"][part]), "positions are not the global ones"
        assert torch.equal(batch["shift_labels"][0], shifted[part]), "shift_labels are not the labels shifted"


def check_exact_resume(accelerator, folder) -> None:
    """save_state after 3 steps, 5 more, load_state, the same 5 again: the same losses, bit for bit (the engine's
    own checkpoint: its partitions span the whole group, processes x sp_size / sp_size ranks of DeepSpeed's)."""
    model = fresh_model()
    model, optimizer, loader = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9),
                                                   DataLoader(samples(), batch_size=1, collate_fn=collate))
    group, unwrapped, batches = accelerator.strategy.sequence_parallel.group, accelerator.unwrap_model(model), list(loader)

    def step(batch) -> float:
        outputs = model(**batch)
        loss = unwrapped.loss_function(logits=outputs.logits, labels=None, shift_labels=batch["shift_labels"],
                                       vocab_size=VOCAB)
        loss = sequence_parallel_loss(loss, batch["shift_labels"], group)
        accelerator.backward(loss)
        accelerator.clip_grad_norm_(model.parameters(), MAX_NORM)
        optimizer.step()
        optimizer.zero_grad()
        return loss.item()

    for batch in batches[:3]:
        step(batch)
    accelerator.save_state(folder)
    after = [step(batch) for batch in batches[3:]]
    accelerator.load_state(folder)
    assert [step(batch) for batch in batches[3:]] == after, "the resumed run differs"


def main() -> None:
    # before Ulysses wraps transformers' attention for this process
    reference, accumulated = reference_run(), reference_run(accumulation=3)

    # 1. the config file: DeepSpeed (zero_stage 2) and the parallelism_config_sp_* keys, nothing in code
    accelerator = Accelerator(cpu=True)
    sp = accelerator.strategy.sequence_parallel
    assert type(accelerator.strategy).__name__ == "DeepSpeedStrategy", accelerator.strategy
    assert (sp.size, sp.seq_length_is_variable, sp.attn_implementation) == (2, True, "sdpa"), sp
    assert accelerator.parallelism_config.sp_handler.sp_attn_implementation == "sdpa"
    from deepspeed.runtime.sequence_parallel import parallel_state_sp

    no_config = torch.nn.Sequential(torch.nn.Linear(4, 4))
    expect_error(lambda: accelerator.prepare(no_config, torch.optim.SGD(no_config.parameters(), lr=0.1)),
                 "expects the model object to have a config attribute", "Sequential")
    assert parallel_state_sp._SEQUENCE_PARALLEL_GROUP is None, "a group was made before the model was refused"
    worst = {"zero2 (config file)": train(accelerator, reference, "zero2 (config file)")}
    check_adapter_for_a_loader_prepared_apart(accelerator, accelerator._models[0])

    # 2. the other stages, with the settings in code (the launcher's variables removed so they do not conflict)
    for key in [k for k in os.environ if k.startswith(("HASTEN_DEEPSPEED_", "HASTEN_PARALLELISM_CONFIG_"))
                or k in ("HASTEN_USE_DEEPSPEED", "HASTEN_USE_PARALLELISM_CONFIG")]:
        del os.environ[key]
    def in_code(stage: int, accumulation: int = 1) -> Accelerator:
        return fresh_accelerator(
            gradient_accumulation_steps=accumulation, deepspeed_plugin=DeepSpeedPlugin(zero_stage=stage),
            parallelism_config=ParallelismConfig(sp_backend="deepspeed", sp_size=2,
                                                 sp_handler=DeepSpeedSequenceParallelConfig(
                                                     sp_seq_length_is_variable=True, sp_attn_implementation="sdpa")))

    for stage, accumulation in ((1, 1), (3, 1), (2, 3)):  # 3: cycles of 3, 3 and 2 micro-batches (the loader's end)
        name = f"zero{stage}" + (f" accumulation {accumulation}" if accumulation > 1 else "")
        expected = copy.deepcopy(reference) if accumulation == 1 else accumulated
        worst[name] = train(in_code(stage, accumulation), expected, name, accumulation)
    check_exact_resume(in_code(2), os.path.join(sys.argv[1], "resume"))
    say(f"SEQUENCE PARALLEL CHECKS PASSED {worst}")


if __name__ == "__main__":
    main()
    sys.stdout.flush()
