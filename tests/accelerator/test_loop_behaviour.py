"""What real Accelerate training loops rely on: loader lengths after a resume, sampler epochs, prepare()
passing other objects through, pickled loaders, any callable for the launchers, torchdata-format loader
states, saving offloaded models, clear errors after a state reset, and the core classes' public surface."""
import functools
import pickle
import sys
import types

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from hasten import Accelerator
from hasten.config.data import DataLoaderConfiguration
from hasten.data_loader import (DataLoaderAdapter, DataLoaderDispatcher, DataLoaderShard, SeedableRandomSampler,
                                prepare_data_loader, skip_first_batches)
from hasten.state import AcceleratorState, GradientState, PartialState


def values(loader):
    return [batch.tolist() for batch in loader]


def fresh():
    AcceleratorState._reset_state(True)
    GradientState._reset_state()


def training_setup(accelerator, samples=24, batch_size=4):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.Dropout(0.2), nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(5)
    data = TensorDataset(torch.randn(samples, 3, generator=g), torch.randn(samples, 1, generator=g))
    loader = DataLoader(data, batch_size=batch_size, shuffle=True)
    return accelerator.prepare(model, optimizer, loader)


# ------------------------------------------------------------------ 1. len() after a resume
def test_len_of_a_prepared_loader_stays_the_epoch_length_after_load_state(tmp_path):
    accelerator = Accelerator(cpu=True)
    model, optimizer, loader = training_setup(accelerator)
    assert len(loader) == 6
    for step, (x, y) in enumerate(loader):
        if step == 3:
            accelerator.save_state(tmp_path / "ckpt")
            break
    fresh()
    accelerator = Accelerator(cpu=True)
    model, optimizer, loader = training_setup(accelerator)
    accelerator.load_state(tmp_path / "ckpt")
    assert len(loader) == 6  # the documented loop: divmod(completed_steps, len(loader))
    starting_epoch, resume_step = divmod(4, len(loader))
    assert (starting_epoch, resume_step) == (0, 4)
    skipped = accelerator.skip_first_batches(loader, resume_step)
    assert len(skipped) == 2 and len(loader) == 6
    assert len(list(skipped)) == 2
    assert len(skipped) == 6  # its first pass is over: later passes are whole
    assert len(loader) == 6


@pytest.mark.parametrize("config", [{}, {"dispatch_batches": True}, {"use_seedable_sampler": True}])
def test_len_after_loader_load_state_dict_in_every_loader_kind(config):
    loader = prepare_data_loader(DataLoader(list(range(20)), batch_size=2, shuffle=True), **config)
    iterator = iter(loader)
    for _ in range(3):
        next(iterator)
    state = loader.state_dict()
    del iterator
    resumed = prepare_data_loader(DataLoader(list(range(20)), batch_size=2, shuffle=True), **config)
    resumed.load_state_dict(state)
    assert len(resumed) == 10
    assert [len(resumed) for _ in resumed] == [10] * 7


# ------------------------------------------------------------------ 2. skip_first_batches keeps the epoch
def test_skip_first_batches_keeps_the_epoch_of_a_plain_loaders_sampler():
    data = list(range(20))
    sampler = DistributedSampler(data, num_replicas=1, rank=0, shuffle=True, seed=0)
    sampler.set_epoch(3)
    expected = values(DataLoader(data, batch_size=2, sampler=sampler))
    skipped = skip_first_batches(DataLoader(data, batch_size=2, sampler=sampler), 2)
    assert values(skipped) == expected[2:]
    assert sampler.epoch == 3

    seedable = SeedableRandomSampler(data, data_seed=5)
    seedable.set_epoch(4)
    expected = values(DataLoader(data, batch_size=2, sampler=seedable))  # moves the sampler to epoch 5
    seedable.set_epoch(4)
    assert values(skip_first_batches(DataLoader(data, batch_size=2, sampler=seedable), 1)) == expected[1:]
    assert seedable.epoch == 5  # a completed pass moves on, as without skipping


def test_skip_first_batches_of_a_prepared_loader_keeps_its_epoch():
    loader = prepare_data_loader(DataLoader(list(range(20)), batch_size=2, shuffle=True), use_seedable_sampler=True)
    loader.set_epoch(2)
    expected = values(loader)
    loader.set_epoch(2)
    skipped = skip_first_batches(loader, 3)
    assert loader.get_sampler().epoch == 2
    assert values(skipped) == expected[3:]
    assert loader.iteration == 3


@pytest.mark.parametrize("loader_class", [DataLoaderShard, DataLoaderDispatcher])
def test_set_epoch_reaches_the_sampler_under_a_plain_batch_sampler_and_skipping_keeps_it(loader_class):
    """A user's batch sampler with set_epoch does not forward it to its index sampler: the loader reaches both,
    and skip_first_batches does not move the sampler back to epoch 0."""
    from torch.utils.data import BatchSampler

    class EpochBatches(BatchSampler):
        epoch = 0

        def set_epoch(self, epoch):
            self.epoch = epoch

    data = list(range(16))
    sampler = SeedableRandomSampler(data)
    batches = EpochBatches(sampler, batch_size=4, drop_last=False)
    loader = loader_class(data, batch_sampler=batches)
    loader.set_epoch(1)
    assert sampler.epoch == 1 and batches.epoch == 1
    next(iter(skip_first_batches(loader, num_batches=2)))
    assert sampler.epoch == 1


@pytest.mark.parametrize("dispatch", [False, True])
def test_a_skipping_loader_given_to_prepare_keeps_its_skip_also_when_pickled(dispatch):
    """skip_first_batches(raw loader) then prepare(): the prepared loader starts after the skipped batches, its
    len() says so, and a pickled Accelerator's copy (taken before any pass) does the same."""
    fresh()
    plain = DataLoader(TensorDataset(torch.arange(10)))
    accelerator = Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(dispatch_batches=dispatch))
    whole, skipping = accelerator.prepare(plain, skip_first_batches(plain, 2))
    copy = pickle.loads(pickle.dumps(accelerator))._dataloaders[1]
    expected = [batch[0].tolist() for batch in whole][2:]
    for loader in (skipping, copy):
        assert len(loader) == 8
        assert [batch[0].tolist() for batch in loader] == expected


# ------------------------------------------------------------------ 3. prepare() and other objects
def test_prepare_returns_objects_it_does_not_know_unchanged():
    accelerator = Accelerator(cpu=True)
    config, names, custom = {"lr": 0.1}, ["a", "b"], object()
    model = nn.Linear(2, 2)
    out = accelerator.prepare(None, config, model, names, custom, 3)
    assert out[0] is None and out[1] is config and out[3] is names and out[4] is custom and out[5] == 3
    assert isinstance(out[2], nn.Module)
    assert accelerator.prepare(config) is config


def test_a_gan_prepared_in_two_calls_trains_both_models(caplog):
    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)
    generator, discriminator = nn.Linear(4, 6), nn.Sequential(nn.Linear(6, 1), nn.Sigmoid())
    opt_g = torch.optim.Adam(generator.parameters(), lr=0.01)
    opt_d = torch.optim.Adam(discriminator.parameters(), lr=0.01)
    with caplog.at_level("WARNING", logger="hasten.accelerator"):
        generator, opt_g = accelerator.prepare(generator, opt_g)
        discriminator, opt_d = accelerator.prepare(discriminator, opt_d)
    assert "none of the parameters" not in caplog.text
    before = [p.detach().clone() for p in [*generator.parameters(), *discriminator.parameters()]]
    bce = nn.BCELoss()
    for _ in range(3):
        real, noise = torch.randn(8, 6), torch.randn(8, 4)
        fake = generator(noise)
        loss_d = bce(discriminator(real), torch.ones(8, 1)) + bce(discriminator(fake.detach()), torch.zeros(8, 1))
        accelerator.backward(loss_d)
        opt_d.step()
        opt_d.zero_grad()
        loss_g = bce(discriminator(generator(noise)), torch.ones(8, 1))
        accelerator.backward(loss_g)
        opt_g.step()
        opt_g.zero_grad()
    after = [*generator.parameters(), *discriminator.parameters()]
    assert all(not torch.equal(a, b) for a, b in zip(before, after))


def test_an_optimizer_prepared_before_its_model_is_a_warning_not_an_error(caplog):
    accelerator = Accelerator(cpu=True)
    first, second = nn.Linear(2, 2), nn.Linear(2, 2)
    accelerator.prepare(first)
    with caplog.at_level("WARNING", logger="hasten.accelerator"):
        optimizer = accelerator.prepare(torch.optim.SGD(second.parameters(), lr=0.1))
    assert "trains none of the parameters" in caplog.text
    second = accelerator.prepare(second)
    before = second.weight.detach().clone()
    accelerator.backward(second(torch.ones(1, 2)).sum())
    optimizer.step()
    assert not torch.equal(before, second.weight)


# ------------------------------------------------------------------ 4. pickling prepared loaders
@pytest.mark.parametrize("config", [
    {}, {"use_seedable_sampler": True}, {"dispatch_batches": True}, {"use_stateful_dataloader": True},
])
@pytest.mark.parametrize("workers", [0, 2])
def test_prepared_loaders_pickle_before_during_and_after_a_pass(config, workers):
    if config.get("use_stateful_dataloader"):
        pytest.importorskip("torchdata.stateful_dataloader")
    accelerator = Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(**config))
    loader = accelerator.prepare(DataLoader(list(range(12)), batch_size=2, shuffle=True, num_workers=workers,
                                            persistent_workers=workers > 0))
    copy = pickle.loads(pickle.dumps(loader))
    assert values(copy) == values(loader)
    iterator = iter(loader)
    next(iterator)  # a live pass (and, with workers, live worker processes)
    copy = pickle.loads(pickle.dumps(loader))
    del iterator
    assert values(copy) == values(loader)
    skipped = accelerator.skip_first_batches(loader, 2)
    copy = pickle.loads(pickle.dumps(skipped))
    assert values(copy) == values(skipped)


# ------------------------------------------------------------------ 5. launchers take any callable
def _rank_plus(offset, extra):
    return PartialState().process_index + offset + extra


class _Callable:
    def __call__(self, extra):
        return PartialState().num_processes + extra


def test_launchers_run_a_functools_partial_and_a_callable_object():
    from helpers import one_multiprocess_job_at_a_time
    from hasten.launchers import debug_launcher, notebook_launcher

    assert notebook_launcher(functools.partial(max, 10), args=(11,), num_processes=1) == 11
    with one_multiprocess_job_at_a_time():
        assert sorted(debug_launcher(functools.partial(_rank_plus, 10), args=(1,)).values()) == [11, 12]
        assert sorted(debug_launcher(_Callable(), args=(5,)).values()) == [7, 7]
    with pytest.raises(TypeError, match="callable"):
        notebook_launcher("train.py", num_processes=2)


# ------------------------------------------------------------------ 6. torchdata-format loader states
@pytest.fixture
def torchdata():
    return pytest.importorskip("torchdata.stateful_dataloader")


def stateful(workers=0, **kwargs):
    return prepare_data_loader(DataLoader(list(range(20)), batch_size=2, num_workers=workers, **kwargs),
                               use_stateful_dataloader=True)


def plain_torchdata(workers=0, **kwargs):
    from torchdata.stateful_dataloader import StatefulDataLoader

    return StatefulDataLoader(list(range(20)), batch_size=2, num_workers=workers, **kwargs)


def after(loader, batches):
    """``(state after ``batches`` batches, the batches that follow)``."""
    iterator = iter(loader)
    for _ in range(batches):
        next(iterator)
    state = loader.state_dict()
    return state, [batch.tolist() for batch in iterator]


@pytest.mark.parametrize("workers", [0, 2])
def test_a_stateful_loaders_state_is_torchdatas_key_for_key(workers, torchdata):
    torchdata_state, rest = after(plain_torchdata(workers, generator=torch.Generator().manual_seed(7)), 3)
    ours, our_rest = after(stateful(workers, generator=torch.Generator().manual_seed(7)), 3)
    assert our_rest == rest
    assert ours == torchdata_state  # what torchdata's own loader says (the same worker seed), nothing beside it
    assert stateful(workers).state_dict().keys() == plain_torchdata(workers).state_dict().keys()  # before a pass

    # both ways between hasten and torchdata, and back into hasten
    resumed = stateful(workers)
    resumed.load_state_dict(torchdata_state)
    assert len(resumed) == 10 and values(resumed) == rest
    assert values(resumed) == [[2 * i, 2 * i + 1] for i in range(10)]  # the next epoch is whole
    plain = plain_torchdata(workers)
    plain.load_state_dict(ours)
    assert values(plain) == rest


@pytest.mark.parametrize("workers", [0, 2])
def test_a_stateful_loaders_full_state_has_hastens_keys_beside_torchdatas(workers, torchdata):
    """``resume_state_dict()`` (what save_state stores) adds the epoch counter and the generators; it still
    loads into torchdata's loader."""
    loader = stateful(workers)
    iterator = iter(loader)
    for _ in range(3):
        next(iterator)
    full, public = loader.resume_state_dict(), loader.state_dict()
    rest = [batch.tolist() for batch in iterator]
    assert set(full) - set(public) == {"epoch", "batches_yielded", "generators"}
    assert (full["epoch"], full["batches_yielded"]) == (0, 3)
    resumed = stateful(workers)
    resumed.load_state_dict(full)
    assert values(resumed) == rest
    plain = plain_torchdata(workers)
    plain.load_state_dict(full)
    assert values(plain) == rest


def test_the_full_state_brings_back_a_later_epoch_s_shuffle(torchdata):
    """torchdata's keys say where the epoch is, not which epoch nor the generator at its start: a shuffled loader
    resumed from ``resume_state_dict()`` in its second epoch draws what the uninterrupted one drew."""
    def loader():
        return stateful(shuffle=True, generator=torch.Generator().manual_seed(5))

    uninterrupted = loader()
    values(uninterrupted)  # epoch 0
    iterator = iter(uninterrupted)
    for _ in range(2):
        next(iterator)
    full = uninterrupted.resume_state_dict()
    rest = [batch.tolist() for batch in iterator]
    resumed = loader()
    resumed.load_state_dict(full)
    assert resumed.iteration == 1 and values(resumed) == rest


def test_a_stateful_loaders_state_before_a_pass_changes_nothing(torchdata):
    generator = torch.Generator().manual_seed(3)
    expected = values(stateful(shuffle=True, generator=generator))
    generator.manual_seed(3)
    loader = stateful(shuffle=True, generator=generator)
    loader.state_dict()
    assert values(loader) == expected


def test_the_older_hasten_format_still_loads(torchdata):
    loader = stateful(shuffle=True, generator=torch.Generator().manual_seed(1))
    iterator = iter(loader)
    for _ in range(4):
        next(iterator)
    ours, rest = loader.resume_state_dict(), [batch.tolist() for batch in iterator]
    own = {key: ours[key] for key in ("epoch", "batches_yielded", "generators")}
    older = {**own, "base": {key: value for key, value in ours.items() if key not in own}}
    resumed = stateful(shuffle=True, generator=torch.Generator().manual_seed(1))
    resumed.load_state_dict(older)
    assert values(resumed) == rest


def test_a_torchdata_state_needs_a_stateful_loader(torchdata):
    torchdata_state, _ = after(plain_torchdata(), 2)
    with pytest.raises(ValueError, match="use_stateful_dataloader=True"):
        prepare_data_loader(DataLoader(list(range(20)), batch_size=2)).load_state_dict(torchdata_state)


def test_data_loader_adapter_is_the_base_of_the_prepared_loaders(torchdata):
    assert issubclass(DataLoaderShard, DataLoaderAdapter) and issubclass(DataLoaderDispatcher, DataLoaderAdapter)
    adapter = DataLoaderAdapter(list(range(4)), True, batch_size=2)  # the reference's positional order
    assert isinstance(adapter, torchdata.StatefulDataLoader)
    loader = stateful()
    state = loader.state_dict()
    assert loader.adjust_state_dict_for_prefetch() is None and loader.state_dict() == state


# ------------------------------------------------------------------ 7. offloaded models
def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 2))


@pytest.mark.parametrize("offload", ["cpu_offload", "disk_offload", "dispatch_model"])
def test_save_model_and_get_state_dict_of_an_offloaded_model_write_the_real_weights(offload, tmp_path):
    from hasten.big_modeling import cpu_offload, disk_offload, dispatch_model, load_checkpoint_in_model
    from hasten.utils import has_offloaded_params

    expected = _model().state_dict()
    model = _model()
    if offload == "cpu_offload":
        cpu_offload(model, execution_device="cpu")
    elif offload == "disk_offload":
        disk_offload(model, tmp_path / "offload", execution_device="cpu")
    else:
        dispatch_model(model, {"0": "cpu", "1": "cpu", "2": "disk"}, offload_dir=tmp_path / "offload")
    assert model[2].weight.device.type == "meta" and has_offloaded_params(model[2])
    accelerator = Accelerator(cpu=True)
    state = accelerator.get_state_dict(model)
    assert list(state) == list(expected) and all(torch.equal(state[k], expected[k]) for k in expected)
    accelerator.save_model(model, tmp_path / "saved")
    loaded = _model()
    for parameter in loaded.parameters():
        parameter.data.zero_()
    load_checkpoint_in_model(loaded, tmp_path / "saved")
    assert all(torch.equal(loaded.state_dict()[k], expected[k]) for k in expected)
    assert model[2].weight.device.type == "meta"  # offloaded again
    assert model(torch.randn(3, 4)).shape == (3, 2)


def test_align_module_device_and_the_offload_helpers():
    from hasten.big_modeling import cpu_offload
    from hasten.utils import align_module_device, get_state_dict_offloaded_model, has_offloaded_params
    from hasten.utils.modeling import get_state_dict_from_offload

    expected = _model().state_dict()
    model = cpu_offload(_model(), execution_device="cpu")
    with align_module_device(model[0]):
        assert torch.equal(model[0].weight, expected["0.weight"])
    assert model[0].weight.device.type == "meta"
    assert list(get_state_dict_offloaded_model(model)) == list(expected)
    partial = get_state_dict_from_offload(model[2], "2.weight", {"2.weight": None, "2.bias": None})
    assert torch.equal(partial["2.weight"], expected["2.weight"]) and torch.equal(partial["2.bias"], expected["2.bias"])
    plain = nn.Linear(2, 2)
    assert not has_offloaded_params(plain)
    with align_module_device(plain, "cpu"):
        assert plain.weight.device.type == "cpu"
    assert plain.weight.device.type == "cpu"


# ------------------------------------------------------------------ 8. a reset state, join_uneven_inputs
def test_an_old_accelerator_after_a_state_reset_says_what_happened():
    accelerator = Accelerator(cpu=True)
    AcceleratorState._reset_state()
    for name in ("device", "num_processes", "is_main_process"):
        with pytest.raises(AttributeError, match=r"reset.*create a new Accelerator"):
            getattr(accelerator, name)
    assert accelerator.mixed_precision == "no"  # its own precision's, which the reset did not change
    with pytest.raises(AttributeError, match="reset"):
        accelerator.prepare(nn.Linear(2, 2))
    GradientState._reset_state()
    with pytest.raises(AttributeError, match="GradientState.*reset"):
        accelerator.sync_gradients
    partial = PartialState()
    fresh()
    with pytest.raises(AttributeError, match="PartialState.*reset"):
        partial.is_main_process
    Accelerator(cpu=True)  # a new one: the old objects share its state again
    assert accelerator.device.type == "cpu" and partial.is_main_process


def test_join_uneven_inputs_warns_when_it_has_no_effect():
    accelerator = Accelerator(cpu=True)
    model = accelerator.prepare(nn.Linear(2, 2))
    with pytest.warns(UserWarning, match="join_uneven_inputs has no effect"):
        with accelerator.join_uneven_inputs([model]):
            model(torch.ones(1, 2))


# ------------------------------------------------------------------ 9. public methods and properties
def test_accelerator_answers_parallelism_and_backend_questions():
    accelerator = Accelerator(cpu=True)
    assert accelerator.multi_device is False and accelerator.should_save_model is True
    assert accelerator.torch_device_mesh is None and accelerator.parallelism_config is None
    assert (accelerator.tensor_parallel_rank, accelerator.pipeline_parallel_rank, accelerator.context_parallel_rank,
            accelerator.data_parallel_shard_rank, accelerator.data_parallel_rank) == (0, 0, 0, 0, 0)
    assert accelerator.is_fsdp2 is False and accelerator.is_composable_parallelism_enabled is False
    assert accelerator.deepspeed_plugin is None
    assert accelerator.fp8_backend.value == "NO"
    model = nn.Linear(2, 2)
    assert accelerator.verify_device_map(model) is False
    model.hf_device_map = {"a": 0, "b": "cpu"}
    assert accelerator.verify_device_map(model) is True
    loader = DataLoader(list(range(4)))
    assert accelerator.deepspeed_ulysses_dl_adapter(loader, model) is loader
    batch = torch.arange(6).view(1, 6)
    with accelerator.maybe_context_parallel(buffers=[batch], buffer_seq_dims=[1]):
        assert batch.shape == (1, 6)


def test_lomo_backward(monkeypatch):
    accelerator = Accelerator(cpu=True)
    model = nn.Linear(2, 1)
    with pytest.raises(ValueError, match="learning rate"):
        accelerator.lomo_backward(torch.ones(()), None)
    with pytest.raises(ValueError, match="LOMO"):
        accelerator.lomo_backward(torch.ones(()), 0.1)
    calls = []

    class Lomo(torch.optim.SGD):
        def fused_backward(self, loss, lr):
            calls.append(lr)

    monkeypatch.setitem(sys.modules, "lomo_optim", types.SimpleNamespace(Lomo=Lomo))
    model, optimizer = accelerator.prepare(model, Lomo(model.parameters(), lr=0.1))
    accelerator.lomo_backward(model(torch.ones(1, 2)).sum(), 0.05)
    assert calls == [0.05]


def test_tracker_methods_take_the_references_arguments_and_do_nothing_without_trackers():
    accelerator = Accelerator(cpu=True)
    accelerator.init_trackers("project", config={"lr": 0.1}, init_kwargs={"wandb": {}})
    accelerator.init_trackers("project", {"lr": 0.1})
    accelerator.log({"loss": 1.0}, step=3, log_kwargs={"wandb": {}})
    accelerator.log({"loss": 1.0}, 4)
    blank = accelerator.get_tracker("tensorboard")
    blank.log({"loss": 1.0})
    accelerator.end_training()


def test_accelerator_state_answers_explicitly():
    import hasten.state as state_module

    state = Accelerator(cpu=True).state
    for name in ("is_main_process", "is_local_main_process", "is_last_process", "use_distributed", "fork_launched",
                 "mixed_precision", "is_fsdp2", "deepspeed_plugin"):
        assert isinstance(vars(AcceleratorState).get(name), property), name
    assert state.is_main_process and state.mixed_precision == "no" and state.deepspeed_plugin is None
    with state.split_between_processes([1, 2, 3]) as share, state.main_process_first():
        assert share == [1, 2, 3]
    state.wait_for_everyone()
    with pytest.raises(ValueError, match="No DeepSpeedPlugin is registered under 'a'"):
        state.get_deepspeed_plugin("a")
    with pytest.raises(ValueError, match="several named plugins"):
        state.select_deepspeed_plugin("a")
    assert state_module.do_nothing(1, key=2) is None
    assert state_module.SharedDict is dict

    class Holder:
        _shared_state = state_module.ThreadLocalSharedDict()

    Holder._shared_state["a"] = 1
    assert Holder()._shared_state == {"a": 1}


def test_gradient_state_properties():
    accelerator = Accelerator(cpu=True)
    state = GradientState()
    assert state.active_dataloader is None and state.dataloader_references == [None]
    assert state.is_xla_gradients_synced is False
    loader = accelerator.prepare(DataLoader(list(range(4)), batch_size=2))
    for _ in loader:
        assert state.active_dataloader is loader and state.dataloader_references == [None, loader]
    assert state.active_dataloader is None


def test_seedable_random_sampler_takes_random_samplers_arguments_positionally():
    sampler = SeedableRandomSampler(list(range(6)), True, 4, data_seed=3)
    assert sampler.replacement and sampler.num_samples == 4 and sampler.initial_seed == 3


def test_a_one_cycle_schedule_runs_to_its_end_under_gradient_accumulation():
    """The reference stops OneCycleLR early when accumulating (its guard counts the accumulation steps too)."""
    from hasten import Accelerator

    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.1, total_steps=6)
    expected = torch.optim.lr_scheduler.OneCycleLR(torch.optim.SGD(torch.nn.Linear(2, 1).parameters(), lr=0.1),
                                                   max_lr=0.1, total_steps=6)
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=3)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    lrs, wanted = [], []
    for _ in range(18):  # 6 optimizer steps of 3 micro-batches
        with accelerator.accumulate(model):
            accelerator.backward(model(torch.ones(1, 2)).sum())
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
        if accelerator.sync_gradients:
            lrs.append(scheduler.get_last_lr()[0])
            expected.optimizer.step()
            expected.step()
            wanted.append(expected.get_last_lr()[0])
    assert lrs == wanted and scheduler.last_epoch == 6
