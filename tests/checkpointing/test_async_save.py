"""save_state(async_save=True): overlap with training, a snapshot detached from live tensors, atomic completion,
errors surfacing on the next call; and one 2-process run saving asynchronously while training with collectives."""
import threading

import pytest
import torch
from safetensors.torch import load_file
from torch import nn

from hasten import Accelerator, ProjectConfiguration
from hasten.checkpointing import CheckpointError, async_save, checkpoint_io
from hasten.checkpointing.atomic import is_complete, staging_folder
from hasten.checkpointing.rotation import newest_complete_checkpoint
from helpers import run_launch


def build(**kwargs):
    torch.manual_seed(0)
    accelerator = Accelerator(cpu=True, **kwargs)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    train(accelerator, model, optimizer)
    return accelerator, model, optimizer


def train(accelerator, model, optimizer, steps=2):
    for _ in range(steps):
        accelerator.backward(model(torch.randn(3, 4)).pow(2).mean())
        optimizer.step()
        optimizer.zero_grad()


def blocked_writer(monkeypatch, failure=None):
    """Make the background writing of the files wait for ``release``; ``started`` is set once it began. Once
    released, the writing raises ``failure[0]`` when the test put an error there."""
    started, release = threading.Event(), threading.Event()
    original = checkpoint_io.write_files

    def write(*args, **kwargs):
        started.set()
        assert release.wait(20), "the test never released the writer"
        if failure:
            raise failure[0]
        return original(*args, **kwargs)

    monkeypatch.setattr(checkpoint_io, "write_files", write)
    return started, release


def test_async_save_overlaps_detaches_and_loads_like_a_sync_save(tmp_path, monkeypatch):
    accelerator, model, optimizer = build()
    accelerator.save_state(tmp_path / "sync")
    expected = [p.detach().clone() for p in model.parameters()]

    started, release = blocked_writer(monkeypatch)
    folder = accelerator.save_state(tmp_path / "async", async_save=True)
    assert started.wait(10)
    assert async_save.pending() is not None  # returned while its files are still being written
    assert not (tmp_path / "async").exists() and staging_folder(tmp_path / "async").is_dir()
    train(accelerator, model, optimizer)  # training continues and changes parameters and moments in place
    assert not torch.equal(next(model.parameters()), expected[0])
    release.set()
    assert accelerator.wait_for_checkpoint() == folder
    assert is_complete(folder) and not staging_folder(tmp_path / "async").exists()
    assert accelerator.wait_for_checkpoint() is None

    sync, background = load_file(tmp_path / "sync" / "model.safetensors"), load_file(f"{folder}/model.safetensors")
    assert sync.keys() == background.keys() and all(torch.equal(sync[k], background[k]) for k in sync)
    sync_opt = torch.load(tmp_path / "sync" / "optimizer.bin", weights_only=True)
    async_opt = torch.load(f"{folder}/optimizer.bin", weights_only=True)
    for index, state in sync_opt["state"].items():
        for key, value in state.items():
            assert torch.equal(torch.as_tensor(value), torch.as_tensor(async_opt["state"][index][key]))

    accelerator.load_state(folder)
    assert all(torch.equal(p, e) for p, e in zip(model.parameters(), expected))


def test_detached_copy_keeps_tied_tensors_tied_and_shares_no_memory():
    weight = torch.randn(3, 3)
    state = {"a": weight, "b": weight.detach(), "nested": [{"x": torch.ones(2)}, 5, "s"]}
    copied = async_save.detached_copy(state)
    assert copied["a"].data_ptr() == copied["b"].data_ptr() != weight.data_ptr()
    weight.add_(1)
    assert not torch.equal(copied["a"], weight) and copied["nested"][1:] == [5, "s"]
    first = async_save.detached_copy({"w": weight}, reuse=True)["w"]
    weight.add_(1)
    second = async_save.detached_copy({"w": weight}, reuse=True)["w"]  # the next save's copy reuses the memory
    assert second.data_ptr() == first.data_ptr() and torch.equal(second, weight)
    async_save.release_snapshot_memory()


def test_staged_copy_records_no_autograd_history_and_keeps_plain_values():
    import random

    parameter = torch.nn.Parameter(torch.randn(4))
    moment = torch.nn.Parameter(torch.randn(4))  # a tensor left for later, copied by copy_now
    ints = [1, 2, 3]
    state = {"p": parameter, "m": moment, "ints": ints, "random": random.getstate(), "mixed": (1, torch.ones(1))}
    copied, left = async_save.staged_copy(state, later=frozenset({moment.untyped_storage().data_ptr()}))
    assert [pair[1] is moment for pair in left] == [True]
    async_save.copy_now(left)
    for name in ("p", "m"):
        assert torch.equal(copied[name], state[name]) and not copied[name].requires_grad
        assert copied[name].grad_fn is None and copied[name].data_ptr() != state[name].data_ptr()
    assert copied["ints"] == ints and copied["ints"] is not ints  # a list of plain values: a new list
    assert copied["random"] == random.getstate()
    assert copied["mixed"][0] == 1 and copied["mixed"][1].data_ptr() != state["mixed"][1].data_ptr()


def test_failed_background_write_keeps_the_previous_checkpoint_and_raises_on_the_next_call(tmp_path, monkeypatch):
    project = ProjectConfiguration(project_dir=str(tmp_path), automatic_checkpoint_naming=True, total_limit=2)
    accelerator, model, optimizer = build(project_config=project)
    first = accelerator.save_state()
    failure = []
    started, release = blocked_writer(monkeypatch, failure)
    accelerator.save_state(async_save=True)
    assert started.wait(10)
    root = tmp_path / "checkpoints"
    assert newest_complete_checkpoint(root).name == "checkpoint_0"  # a crash now: the previous one stays newest
    failure.append(OSError(28, "No space left on device"))
    release.set()
    with pytest.raises(CheckpointError, match="asynchronous save_state.*checkpoint_1.*never completed"):
        accelerator.save_state(async_save=True)  # the next call surfaces the background error
    assert str(newest_complete_checkpoint(root)) == first
    assert not (root / "checkpoint_1").exists() and not staging_folder(root / "checkpoint_1").exists()
    assert accelerator.wait_for_checkpoint() is None  # reported once

    monkeypatch.undo()
    for _ in range(3):  # checkpoint_2..4 (1 was never completed); rotation after completion: total_limit=2
        accelerator.save_state(async_save=True)
        train(accelerator, model, optimizer, steps=1)
    accelerator.wait_for_everyone()  # waits for the pending save
    assert sorted(p.name for p in root.iterdir()) == ["checkpoint_3", "checkpoint_4"]
    assert accelerator.load_state().endswith("checkpoint_4")


def test_the_next_save_waits_for_an_unfinished_async_save_says_so_once_and_both_complete_in_order(
        tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(async_save, "_said_waiting", False)  # an earlier test of this process may have said it
    real_writer = checkpoint_io.write_files
    accelerator, model, optimizer = build()
    started, release = blocked_writer(monkeypatch)
    first = accelerator.save_state(tmp_path / "first", async_save=True)
    assert started.wait(10)
    threading.Timer(0.5, release.set).start()  # the first save finishes while the next one waits for it
    with caplog.at_level("WARNING", logger="hasten.checkpointing.async_save"):
        second = accelerator.save_state(tmp_path / "second")
        said = [r for r in caplog.records if "still being written" in r.getMessage()]
        assert len(said) == 1 and "first" in said[0].getMessage()
        assert is_complete(first) and is_complete(second)
        marker = "hasten_checkpoint.json"
        assert (tmp_path / "first" / marker).stat().st_mtime_ns <= (tmp_path / "second" / marker).stat().st_mtime_ns
        monkeypatch.setattr(checkpoint_io, "write_files", real_writer)  # "said once" stays said
        caplog.clear()
        started, release = blocked_writer(monkeypatch)
        accelerator.save_state(tmp_path / "third", async_save=True)
        assert started.wait(10)
        threading.Timer(0.2, release.set).start()
        accelerator.save_state(tmp_path / "fourth", async_save=True)  # waits again, silently this time
        assert accelerator.wait_for_checkpoint().endswith("fourth")
        assert not [r for r in caplog.records if "still being written" in r.getMessage()]
    assert is_complete(tmp_path / "third") and is_complete(tmp_path / "fourth")


def test_two_processes_save_asynchronously_while_training(tmp_path):
    result = run_launch("check_async_save.py", tmp_path, timeout=120)
    assert "ASYNC SAVE OK" in result.stdout


def test_parameters_and_moments_are_copied_after_save_returns_and_before_the_next_optimizer_step(tmp_path,
                                                                                               monkeypatch):
    accelerator, model, optimizer = build()
    expected = {name: p.detach().clone() for name, p in model.named_parameters()}
    copying, release = threading.Event(), threading.Event()
    original = async_save.copy_now

    def held_copy(pairs):
        copying.set()
        assert release.wait(20), "the test never released the copy"
        original(pairs)

    monkeypatch.setattr(async_save, "copy_now", held_copy)
    folder = accelerator.save_state(tmp_path / "async", async_save=True)  # returns with the copy still to do
    assert copying.wait(10)
    accelerator.backward(model(torch.randn(3, 4)).pow(2).mean())  # forward and backward do not wait
    stepped = threading.Event()
    stepper = threading.Thread(target=lambda: (optimizer.step(), stepped.set()))
    stepper.start()
    assert not stepped.wait(0.5)  # the step waits for the copy of what it is about to change
    release.set()
    stepper.join(10)
    assert stepped.is_set() and not torch.equal(model.get_parameter("0.weight"), expected["0.weight"])
    accelerator.wait_for_checkpoint()
    saved = load_file(f"{folder}/model.safetensors")  # the weights as they were when save_state was called
    assert saved.keys() == expected.keys() and all(torch.equal(saved[name], expected[name]) for name in saved)


def test_a_weight_the_forward_changes_is_copied_before_save_returns():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(10, 4, max_norm=0.5), nn.Linear(4, 2))  # the forward renormalises rows
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    assert async_save.changed_in_forward([model]) == {model[0].weight.untyped_storage().data_ptr()}
    writing = async_save.WriteInBackground(every_process=False)
    copied = writing.copy({"weights": dict(model.state_dict())}, [optimizer], models=[model])
    left = {tensor.untyped_storage().data_ptr() for _, tensor in writing._left}
    embedding, linear = (module.weight.untyped_storage().data_ptr() for module in (model[0], model[1]))
    assert embedding not in left and linear in left
    assert torch.equal(copied["weights"]["0.weight"], model[0].weight)  # copied already


def held_agreement(monkeypatch):
    """Hold the background thread at its first agreement (that every process took its snapshot) until ``release``;
    ``reached`` is set when it gets there."""
    reached, release = threading.Event(), threading.Event()
    original = async_save.together

    def together(during, *args, **kwargs):
        if threading.current_thread().name == "hasten-async-save" and not release.is_set():
            reached.set()
            assert release.wait(20), "the test never released the agreement"
        return original(during, *args, **kwargs)

    monkeypatch.setattr(async_save, "together", together)
    return reached, release


def test_a_step_before_the_background_copy_makes_the_copy_itself_and_a_failed_copy_fails_the_save(tmp_path,
                                                                                                monkeypatch):
    accelerator, model, optimizer = build()
    expected = {name: p.detach().clone() for name, p in model.named_parameters()}
    reached, release = held_agreement(monkeypatch)
    folder = accelerator.save_state(tmp_path / "stepped", async_save=True)
    assert reached.wait(10)
    stepper = threading.Thread(target=train, args=(accelerator, model, optimizer, 1))
    stepper.start()  # the background thread is held: the step makes the copy, then changes the weights
    stepper.join(10)
    stepped = not stepper.is_alive()
    release.set()
    stepper.join()
    assert stepped and not torch.equal(model.get_parameter("0.weight"), expected["0.weight"])
    assert accelerator.wait_for_checkpoint() == folder
    saved = load_file(f"{folder}/model.safetensors")  # the weights of the moment save_state was called
    assert saved.keys() == expected.keys() and all(torch.equal(saved[name], expected[name]) for name in saved)

    def failing_copy(pairs):
        raise RuntimeError("copy failed on purpose")

    reached, release = held_agreement(monkeypatch)
    monkeypatch.setattr(async_save, "copy_now", failing_copy)
    accelerator.save_state(tmp_path / "failed", async_save=True)
    assert reached.wait(10)
    train(accelerator, model, optimizer, steps=1)  # the step goes on; the save fails
    release.set()
    with pytest.raises(CheckpointError, match="copy failed on purpose"):
        accelerator.wait_for_checkpoint()
    assert not (tmp_path / "failed").exists() and is_complete(folder)


def test_one_background_thread_finishes_every_asynchronous_save(tmp_path, monkeypatch):
    accelerator, model, optimizer = build()
    writers = []
    original = checkpoint_io.write_files

    def recording(*args, **kwargs):
        writers.append(threading.current_thread())
        return original(*args, **kwargs)

    monkeypatch.setattr(checkpoint_io, "write_files", recording)
    for name in ("first", "second"):
        accelerator.save_state(tmp_path / name, async_save=True)
        train(accelerator, model, optimizer, steps=1)
        accelerator.wait_for_checkpoint()
    assert len(writers) == 2 and writers[0] is writers[1] is not threading.current_thread()
    assert writers[0].is_alive() and writers[0].daemon  # kept for the next save; never holds the interpreter
    assert is_complete(tmp_path / "first") and is_complete(tmp_path / "second")
