"""What a script reads from the state, for every way a backend can be chosen: run once with the reference library
and once with hasten behind ``HASTEN_AS_ACCELERATE=1`` (tests/accelerator/test_state_views.py compares the two).

    torchrun --nproc_per_node N state_views.py OUT DEEPSPEED_CONFIG.json

Each process runs one scenario after the other (the state is reset between them) and writes what it read to
``OUT.rank<R>.json``. Each scenario records the attributes of ``Accelerator``, ``AcceleratorState``,
``PartialState`` and ``GradientState`` that libraries and example scripts read.
"""
import json
import os
import sys

import torch

from accelerate import Accelerator
from accelerate.state import AcceleratorState, GradientState, PartialState
from accelerate.utils import DeepSpeedPlugin, FullyShardedDataParallelPlugin

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


def simple(value):
    """A value as JSON can hold it and both libraries can be compared on: plain values as they are, enums and devices
    as text, containers by their kind and length, any other object by its class name."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (torch.device, torch.dtype)) or type(value).__module__ == "enum" or hasattr(value, "_value_"):
        return str(value)
    if isinstance(value, (list, tuple, dict, set)):
        return f"{type(value).__name__} of {len(value)}"
    return f"<{type(value).__name__}>"


def sweep(prefix: str, obj) -> dict:
    """Every public attribute of ``obj`` that is not a method, as ``simple`` shows it, named ``prefix.name``; what
    raises, as the error's class (the test skips attributes the reference cannot answer)."""
    found = {}
    for name in dir(obj):
        if name.startswith("_"):
            continue
        try:
            value = getattr(obj, name)
        except Exception as error:  # noqa: BLE001 - recorded: an attribute that raises is part of what a script sees
            found[f"{prefix}.{name}"] = f"<raises {type(error).__name__}>"
            continue
        if callable(value) and not isinstance(value, torch.nn.Module):
            continue
        found[f"{prefix}.{name}"] = simple(value)
    return found


def views(accelerator: Accelerator) -> dict:
    """Every attribute of the four objects (``sweep``), and, deeper, what the plugins say and what ``repr`` prints."""
    state, partial, gradients = AcceleratorState(), PartialState(), GradientState()
    return {
        **sweep("accelerator", accelerator), **sweep("state", state), **sweep("partial", partial),
        **sweep("gradients", gradients),
        "state.repr.first_line": repr(state).splitlines()[0],
        "state.repr.has_ds_config": "ds_config:" in repr(state),
        "state.deepspeed_plugin.view": read(state, "deepspeed_plugin", plugin_view),
        "state.fsdp_plugin.view": read(state, "fsdp_plugin", plugin_view),
        "state.megatron_lm_plugin.view": read(state, "megatron_lm_plugin", plugin_view),
        "accelerator.deepspeed_plugin.view": read(accelerator, "deepspeed_plugin", plugin_view),
        "accelerator.deepspeed_plugin_is_the_state's": read(accelerator, "deepspeed_plugin")
        is read(state, "deepspeed_plugin"),
    }


def scenarios(ds_config: str):
    """(name, environment, Accelerator keyword arguments) — each way a backend reaches the Accelerator."""
    # Several CPU processes: what `accelerate launch --multi_cpu` sets, without which each of the reference's ranks runs
    # alone (hasten forms the group either way: docs/migration.md). The reference's DeepSpeed ignores it.
    cpu = {"ACCELERATE_USE_CPU": "true"} if int(os.environ["WORLD_SIZE"]) > 1 else {}
    fsdp = {**cpu, "ACCELERATE_USE_FSDP": "true"}
    return [
        ("plain", cpu, {}),
        ("bf16 from the launcher", {**cpu, "ACCELERATE_MIXED_PRECISION": "bf16"}, {}),
        ("bf16 argument", cpu, {"mixed_precision": lambda: "bf16"}),
        ("fsdp2 argument", cpu, {"fsdp_plugin": lambda: FullyShardedDataParallelPlugin(fsdp_version=2)}),
        ("fsdp2 from the launcher", {**fsdp, "FSDP_VERSION": "2"}, {}),
        ("fsdp1 from the launcher", {**fsdp, "FSDP_VERSION": "1"}, {}),
        ("fsdp1 argument", cpu, {"fsdp_plugin": lambda: FullyShardedDataParallelPlugin(fsdp_version=1)}),
        ("deepspeed argument", {}, {"deepspeed_plugin": lambda: DeepSpeedPlugin(zero_stage=2)}),
        ("deepspeed config file argument", {}, {"deepspeed_plugin": lambda: DeepSpeedPlugin(hf_ds_config=ds_config)}),
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
    with open(f"{out}.rank{os.environ['RANK']}.json", "w") as handle:
        json.dump(results, handle, indent=1, sort_keys=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
