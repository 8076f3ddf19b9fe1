"""What a script reads from the state, for every way a backend can be chosen: run once with the reference library
and once with hasten behind ``HASTEN_AS_ACCELERATE=1`` (tests/accelerator/test_state_views.py compares the two).

    python state_views.py OUT.json DEEPSPEED_CONFIG.json

One process, the launcher's environment of a one-process job set by hand, one scenario after the other (the state
is reset between them). Each scenario records the attributes of ``Accelerator``, ``AcceleratorState``,
``PartialState`` and ``GradientState`` that libraries and example scripts read.
"""
import json
import os
import sys

import torch

from accelerate import Accelerator
from accelerate.state import AcceleratorState, GradientState, PartialState
from accelerate.utils import DeepSpeedPlugin, FullyShardedDataParallelPlugin

JOB = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1"}


def plugin_view(plugin):
    if plugin is None:
        return None
    view = {"class": type(plugin).__name__}
    for name in ("fsdp_version", "zero_stage", "gradient_accumulation_steps"):
        if hasattr(plugin, name):
            view[name] = getattr(plugin, name)
    config = getattr(plugin, "deepspeed_config", None)
    if isinstance(config, dict):
        view["config_stage"] = config.get("zero_optimization", {}).get("stage")
    return view


ABSENT = "<absent>"  # the attribute raises AttributeError (the reference leaves some unset)


def read(obj, name: str, view=lambda value: value):
    try:
        return view(getattr(obj, name))
    except AttributeError:
        return ABSENT


def views(accelerator: Accelerator) -> dict:
    state, partial, gradients = AcceleratorState(), PartialState(), GradientState()
    return {
        "state.distributed_type": str(state.distributed_type),
        "state.repr.first_line": repr(state).splitlines()[0],
        "state.repr.has_ds_config": "ds_config:" in repr(state),
        "state.mixed_precision": state.mixed_precision,
        "state.deepspeed_plugin": read(state, "deepspeed_plugin", plugin_view),
        "state.fsdp_plugin": read(state, "fsdp_plugin", plugin_view),
        "state.is_fsdp2": read(state, "is_fsdp2"),
        "state.num_processes": state.num_processes,
        "state.use_distributed": state.use_distributed,
        "state.megatron_lm_plugin": read(state, "megatron_lm_plugin", plugin_view),
        "partial.distributed_type": str(partial.distributed_type),
        "partial.num_processes": partial.num_processes,
        "accelerator.distributed_type": str(accelerator.distributed_type),
        "accelerator.deepspeed_plugin": read(accelerator, "deepspeed_plugin", plugin_view),
        "accelerator.deepspeed_plugin_is_the_state's": read(accelerator, "deepspeed_plugin")
        is read(state, "deepspeed_plugin"),
        "accelerator.is_fsdp2": accelerator.is_fsdp2,
        "accelerator.mixed_precision": accelerator.mixed_precision,
        "accelerator.use_distributed": accelerator.use_distributed,
        "accelerator.num_processes": accelerator.num_processes,
        "accelerator.gradient_accumulation_steps": accelerator.gradient_accumulation_steps,
        "gradients.num_steps": gradients.num_steps,
        "gradients.sync_gradients": gradients.sync_gradients,
    }


def scenarios(ds_config: str):
    """(name, environment, Accelerator keyword arguments) — each way a backend reaches the Accelerator."""
    fsdp = {"ACCELERATE_USE_FSDP": "true"}
    return [
        ("plain", {}, {}),
        ("bf16 from the launcher", {"ACCELERATE_MIXED_PRECISION": "bf16"}, {}),
        ("fsdp2 argument", {}, {"fsdp_plugin": lambda: FullyShardedDataParallelPlugin(fsdp_version=2)}),
        ("fsdp2 from the launcher", {**fsdp, "FSDP_VERSION": "2"}, {}),
        ("fsdp1 from the launcher", {**fsdp, "FSDP_VERSION": "1"}, {}),
        ("deepspeed argument", {}, {"deepspeed_plugin": lambda: DeepSpeedPlugin(zero_stage=2)}),
        ("deepspeed from the launcher", {"ACCELERATE_USE_DEEPSPEED": "true", "ACCELERATE_DEEPSPEED_ZERO_STAGE": "2",
                                         "ACCELERATE_GRADIENT_ACCUMULATION_STEPS": "1"}, {}),
        ("deepspeed from a config file", {"ACCELERATE_USE_DEEPSPEED": "true",
                                          "ACCELERATE_DEEPSPEED_CONFIG_FILE": ds_config}, {}),
    ]


def reset() -> None:
    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    PartialState._reset_state()


def main(out: str, ds_config: str) -> None:
    os.environ.update(JOB)
    os.environ["MASTER_PORT"] = os.environ.get("STATE_VIEWS_PORT", "29533")
    results = {}
    for name, env, kwargs in scenarios(ds_config):
        before = dict(os.environ)
        os.environ.update(env)
        try:
            accelerator = Accelerator(**{key: make() for key, make in kwargs.items()})
            results[name] = views(accelerator)
            if "config file" in name:  # diffusers' DeepSpeed scripts set the micro batch before prepare
                accelerator.state.deepspeed_plugin.deepspeed_config["train_micro_batch_size_per_gpu"] = 4
                model = torch.nn.Linear(4, 2)
                engine, _ = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
                results[name]["engine.train_micro_batch_size_per_gpu"] = engine.train_micro_batch_size_per_gpu()
        except Exception as error:  # noqa: BLE001 - recorded: the test says which scenario failed and how
            results[name] = {"error": f"{type(error).__name__}: {error}"}
        finally:
            os.environ.clear()
            os.environ.update(before)
            reset()
    with open(out, "w") as handle:
        json.dump(results, handle, indent=1, sort_keys=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
