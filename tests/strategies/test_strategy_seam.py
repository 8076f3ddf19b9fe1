"""The backend seam: the Accelerator hands precision, preparation order, backward, clipping, state dicts and
checkpoint IO to its strategy, hands checkpointing one explicit CheckpointTargets, and lets no backend that does
not exist yet be selected silently (plugin argument, launcher environment, config file or ParallelismConfig)."""
import json
import subprocess
import sys
import warnings

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

from hasten import Accelerator, DistributedType, ParallelismConfig
from hasten.checkpointing.checkpoint_io import FullStateCheckpointIO
from hasten.checkpointing.targets import CheckpointTargets
from hasten.precision.autocast import get_mixed_precision_context_manager
from hasten.strategies import SingleDeviceStrategy
from hasten.core.planned import NotYetSupportedError

from helpers import run_launch


class Recording(SingleDeviceStrategy):
    """A single-device strategy that records what the Accelerator hands it."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.calls = []

    def prepare_training(self, models, optimizers, device_placement, evaluation_mode=False, compile_model=None,
                         **context):
        self.calls.append(("prepare_training", len(models), len(optimizers), compile_model is not None))
        return super().prepare_training(models, optimizers, device_placement, evaluation_mode, compile_model)

    def backward(self, loss, model=None, **kwargs):
        self.calls.append(("backward", model, kwargs.get("accumulation_steps"), kwargs.get("num_items_in_batch")))
        super().backward(loss, model, **kwargs)

    def clip_grad_norm_(self, parameters, max_norm, norm_type=2, *, models=(), optimizers=()):
        self.calls.append(("clip", list(models), list(optimizers)))
        return super().clip_grad_norm_(parameters, max_norm, norm_type, models=models, optimizers=optimizers)

    def optimizer_state_dict(self, model, optimizer):
        self.calls.append(("optimizer_state_dict", model))
        return super().optimizer_state_dict(model, optimizer)


def recording_accelerator(**kwargs):
    accelerator = Accelerator(cpu=True, **kwargs)
    strategy = Recording(accelerator.state, accelerator.strategy.settings)
    accelerator.strategy = accelerator._accumulator.strategy = strategy
    accelerator.precision, accelerator.scaler = strategy.precision, strategy.precision.scaler
    return accelerator, strategy


def trained(accelerator):
    model = nn.Linear(3, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    return model, optimizer


# ------------------------------------------------------------------------------------------ precision
def test_the_precision_is_the_strategys_and_autocast_follows_the_runs_precision():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # fp16 on the CPU is slow: the warning is tested in test_precision.py
        accelerator = Accelerator(cpu=True, mixed_precision="fp16")
    assert accelerator.precision is accelerator.strategy.precision
    assert accelerator.strategy.precision.autocast_dtype == torch.float16
    with get_mixed_precision_context_manager(native_amp=accelerator.native_amp):
        assert torch.get_autocast_dtype("cpu") == torch.float16
    # a backend whose engine casts itself (DeepSpeed's EnginePrecision) has no autocast: native_amp is False, so
    # the context a script builds from it, as Accelerate's scripts do, is a plain one
    from hasten.precision import EnginePrecision

    engine = EnginePrecision("bf16")
    assert engine.native_amp is False and engine.autocast_dtype is None and engine.scaler is None
    with get_mixed_precision_context_manager(native_amp=engine.native_amp):
        assert not torch.is_autocast_enabled("cpu")


# ------------------------------------------------------------------------------------------ the training step
def test_preparation_backward_and_clipping_go_through_the_strategy_with_models_and_optimizers():
    accelerator, strategy = recording_accelerator(gradient_accumulation_steps=2)
    model, optimizer = trained(accelerator)
    assert strategy.calls[0] == ("prepare_training", 1, 1, True)
    loss = model(torch.ones(4, 3)).sum()
    with accelerator.accumulate(model):
        accelerator.backward(loss, num_items_in_batch=8)
    assert strategy.calls[-1] == ("backward", model, 2, 8)
    accelerator.sync_gradients = True
    accelerator.clip_grad_norm_(model.parameters(), 1.0)
    assert strategy.calls[-1] == ("clip", [model], [optimizer])


def test_the_loss_is_normalised_over_the_data_parallel_size():
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=4)
    weight = nn.Parameter(torch.ones(1))
    accelerator.backward((weight * 2.0).sum())
    assert weight.grad.item() == pytest.approx(0.5)  # divided by the accumulation steps
    weight.grad = None
    accelerator.backward((weight * 2.0).sum(), num_items_in_batch=4)
    assert weight.grad.item() == pytest.approx(0.5)  # summed loss / items (one data-parallel rank)


def test_compilation_comes_after_the_strategys_wrapper(monkeypatch):
    order = []
    accelerator = Accelerator(cpu=True)
    original = accelerator.strategy.prepare_model

    def prepare_model(model, *args, **kwargs):
        order.append("wrap")
        return original(model, *args, **kwargs)

    monkeypatch.setattr(accelerator.strategy, "prepare_model", prepare_model)
    monkeypatch.setattr("hasten.accelerator.apply_dynamo_plugin", lambda model, plugin: order.append("compile") or model)
    accelerator.prepare(nn.Linear(2, 2))
    assert order == ["wrap", "compile"]


def test_a_strategy_that_needs_model_and_optimizer_together_refuses_them_apart():
    accelerator = Accelerator(cpu=True)
    accelerator.strategy.prepares_models_with_optimizers = True
    prepared = accelerator.prepare(nn.Linear(2, 2))
    stranger = torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=0.1)  # trains no prepared model
    with pytest.raises(ValueError, match=r"model, optimizer = accelerator.prepare\(model, optimizer\)"):
        accelerator.prepare(stranger)
    assert accelerator.checkpoint_targets().optimizers == []  # nothing was registered
    # built on the prepared model's parameters, as transformers' Trainer does with FSDP: it may come alone
    on_prepared = accelerator.prepare(torch.optim.SGD(prepared.parameters(), lr=0.1))
    assert accelerator.checkpoint_targets().optimizers == [on_prepared]
    model = nn.Linear(2, 2)
    accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))  # together: fine


# ------------------------------------------------------------------------------------------ checkpointing
def test_checkpoint_targets_list_the_prepared_objects_and_pair_optimizers_with_models(tmp_path):
    accelerator = Accelerator(cpu=True)
    model, optimizer = trained(accelerator)
    other = accelerator.prepare(nn.Linear(1, 1))
    loader = accelerator.prepare(DataLoader(list(range(4)), batch_size=2))
    hook = accelerator.register_save_state_pre_hook(lambda *args: None)
    targets = accelerator.checkpoint_targets()
    assert isinstance(targets, CheckpointTargets)
    assert targets.models == [model, other] and targets.optimizers == [optimizer]
    assert targets.dataloaders == [loader] and len(targets.save_hooks) == 1
    assert targets.model_of(optimizer) is model
    assert targets.model_of(torch.optim.SGD(nn.Linear(1, 1).parameters(), lr=1)) is None
    targets.set_step(3)
    assert accelerator.step == 3
    hook.remove()


def test_save_state_asks_the_strategy_for_optimizer_states_with_their_model(tmp_path):
    accelerator, strategy = recording_accelerator()
    model, _ = trained(accelerator)
    accelerator.save_state(tmp_path / "state")
    assert ("optimizer_state_dict", model) in strategy.calls


def test_strategy_checkpoint_io_round_trip_outside_the_transaction(tmp_path):
    accelerator = Accelerator(cpu=True)
    model, optimizer = trained(accelerator)
    targets = accelerator.checkpoint_targets()
    accelerator.strategy.save_checkpoint(tmp_path, targets)
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        model.weight.add_(1.0)
    accelerator.strategy.load_checkpoint(tmp_path, targets)
    assert all(torch.equal(model.state_dict()[k], v) for k, v in saved.items())


class PerRankShardsIO(FullStateCheckpointIO):
    """A stand-in for a sharded backend's IO: one extra file per rank beside the default files."""

    def __init__(self):
        self.read_extra = None

    def write(self, staging, collected, *, writes_shared_files, process_index, safe_serialization=True,
              process_group=None):
        super().write(staging, collected, writes_shared_files=writes_shared_files,
                      process_index=process_index, safe_serialization=safe_serialization)
        (staging / "shards").mkdir(exist_ok=True)
        torch.save({"rank": process_index}, staging / "shards" / f"rank_{process_index}.pt")

    def read(self, strategy, folder, marker, targets, **kwargs):
        self.read_extra = torch.load(folder / "shards" / "rank_0.pt", weights_only=True)
        return super().read(strategy, folder, marker, targets, **kwargs)


def test_the_transaction_wraps_a_strategys_own_files(tmp_path):
    accelerator = Accelerator(cpu=True)
    trained(accelerator)
    io = accelerator.strategy.checkpoint_io = PerRankShardsIO()
    folder = accelerator.save_state(tmp_path / "ckpt")
    marker = json.loads((tmp_path / "ckpt" / "hasten_checkpoint.json").read_text())
    assert "shards/rank_0.pt" in marker["files"]  # the marker lists the strategy's files: checked on load
    accelerator.load_state(folder)
    assert io.read_extra == {"rank": 0}
    (tmp_path / "ckpt" / "shards" / "rank_0.pt").unlink()
    with pytest.raises(Exception, match="rank_0.pt"):
        accelerator.load_state(folder)


# ------------------------------------------------------------------------------------------ backend selection
@pytest.mark.parametrize("variable", ["HASTEN_USE_MEGATRON_LM", "ACCELERATE_USE_MEGATRON_LM"])
def test_the_launchers_megatron_switch_selects_the_megatron_engine(monkeypatch, variable):
    monkeypatch.setenv(variable, "true")
    monkeypatch.setenv("HASTEN_MEGATRON_LM_GRADIENT_CLIPPING", "0.5")
    accelerator = Accelerator(cpu=True)
    assert accelerator.distributed_type == DistributedType.MEGATRON_LM
    assert accelerator.state.megatron_lm_plugin.gradient_clipping == 0.5


@pytest.mark.parametrize("variable", ["HASTEN_USE_FSDP", "ACCELERATE_USE_FSDP"])
def test_the_launchers_fsdp_switch_selects_fsdp(monkeypatch, variable):
    """FSDP chosen on one process: it would start a process group of one (tests/strategies/fsdp: it trains so);
    here that is recorded instead, to keep this test's process free of one."""
    from hasten.state import PartialState

    started = []
    monkeypatch.setattr(PartialState, "start_single_process_group", lambda self: started.append(True))
    monkeypatch.setenv(variable, "true")
    accelerator = Accelerator(cpu=True)
    assert accelerator.distributed_type == DistributedType.FSDP and started == [True]


def test_a_switch_set_to_false_selects_nothing(monkeypatch):
    monkeypatch.setenv("HASTEN_USE_FSDP", "false")
    assert type(Accelerator(cpu=True).strategy) is SingleDeviceStrategy


@pytest.mark.parametrize("config, names", [
    (dict(dp_shard_size=1, tp_size=1), None),
])
def test_a_trivial_parallelism_config_on_one_process_is_the_single_device_strategy(config, names):
    accelerator = Accelerator(cpu=True, parallelism_config=ParallelismConfig(**config))
    assert type(accelerator.strategy) is SingleDeviceStrategy and accelerator.torch_device_mesh is names


def test_a_parallelism_config_that_does_not_fit_the_processes_names_both():
    with pytest.raises(ValueError, match=r"tp_size=2|tp.*2") as caught:
        Accelerator(cpu=True, parallelism_config=ParallelismConfig(tp_size=2))
    assert "1" in str(caught.value)


def test_a_config_file_selecting_megatron_lm_reaches_the_plugin_of_the_launched_script(tmp_path):
    config = tmp_path / "megatron.yaml"
    config.write_text("compute_environment: LOCAL_MACHINE\ndistributed_type: MEGATRON_LM\nnum_processes: 1\n"
                      "use_cpu: true\nmegatron_lm_config:\n  megatron_lm_gradient_clipping: 0.25\n"
                      "  megatron_lm_recompute_activations: true\n")
    script = tmp_path / "train.py"
    script.write_text("from hasten import Accelerator\naccelerator = Accelerator()\n"
                      "plugin = accelerator.state.megatron_lm_plugin\n"
                      "print('TYPE', accelerator.distributed_type, plugin.gradient_clipping, plugin.recompute_activations)\n")
    result = run_launch(script, num_processes=None, launch_args=["--config_file", str(config)])
    assert "TYPE DistributedType.MEGATRON_LM 0.25 True" in result.stdout, result.stdout + result.stderr


def test_the_data_parallel_layout_and_per_rank_checkpoint_files_on_two_processes(tmp_path):
    result = run_launch("check_data_parallel_layout.py", tmp_path, num_processes=2)
    assert "LAYOUT CHECKS PASSED" in result.stdout, result.stdout


def test_the_launchers_parallelism_flags_reach_the_accelerator(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(
        "import os\nfrom hasten import Accelerator\n"
        "accelerator = Accelerator(cpu=True)\n"
        "config, mesh = accelerator.parallelism_config, accelerator.torch_device_mesh\n"
        "line = ' '.join(map(str, ['LAYOUT', accelerator.process_index, config.dp_replicate_size, "
        "mesh.mesh_dim_names, type(accelerator.strategy).__name__])) + '\\n'\n"
        "os.write(1, line.encode())  # one write: the two processes' lines never interleave\n")
    result = run_launch(script, num_processes=2, launch_args=["--parallelism_config_dp_replicate_size", "2"])
    assert "LAYOUT 0 2 ('dp_replicate',) DDPStrategy" in result.stdout, result.stdout
    assert "LAYOUT 1 2 ('dp_replicate',) DDPStrategy" in result.stdout


def test_importing_the_accelerator_leaves_dcp_and_dtensor_unimported():
    """Importing torch.distributed.checkpoint / DTensor changes torch's thread-local state that gloo's work items
    capture; a DDP model freed after destroy_process_group then deadlocked at exit (1 run in 4 of Accelerate's
    test_sync.py). Only sharded backends and DCP checkpoints import them, when used."""
    code = ("import sys\nfrom hasten import Accelerator\nimport hasten.checkpointing, hasten.strategies\n"
            "loaded = [m for m in sys.modules if m.startswith(('torch.distributed.checkpoint', "
            "'torch.distributed.tensor'))]\nprint(loaded)\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == "[]", result.stdout + result.stderr


def test_two_backend_plugins_are_refused_naming_both():
    from hasten.utils import DeepSpeedPlugin, FullyShardedDataParallelPlugin, MegatronLMPlugin

    with pytest.raises(ValueError, match="megatron_lm_plugin=... select different backends"):
        Accelerator(cpu=True, fsdp_plugin=FullyShardedDataParallelPlugin(), megatron_lm_plugin=MegatronLMPlugin())
    with pytest.raises(ValueError, match="fsdp_plugin=... and deepspeed_plugin=..."):
        Accelerator(cpu=True, fsdp_plugin=FullyShardedDataParallelPlugin(), deepspeed_plugin=DeepSpeedPlugin())
