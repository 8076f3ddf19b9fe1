"""Accelerate's ``utils`` names in hasten do what they say (not only exist): availability checks, environment
helpers, regional compilation re-exports, pipeline padding, layerwise casting, the low-level checkpoint
functions. The names' existence and signatures are checked by test_public_surface.py.
"""
from __future__ import annotations

import importlib
import logging
import os
import stat
import subprocess
import sys
import textwrap
import unittest
from collections import defaultdict, namedtuple

import pytest
import torch
from torch import nn

import hasten
import hasten.utils as utils
from helpers import clean_env, run_launch


# ----------------------------------------------------------------------------- imports
def test_package_checks_follow_what_is_installed():
    from hasten.core import imports

    assert utils.is_pytest_available() and utils.is_tqdm_available() and imports.is_numpy_available()
    for check, module in ((utils.is_torchvision_available, "torchvision"), (utils.is_pandas_available, "pandas"),
                          (utils.is_transformers_available, "transformers"), (utils.is_peft_available, "peft"),
                          (utils.is_boto3_available, "boto3"), (utils.is_datasets_available, "datasets")):
        assert check() is (importlib.util.find_spec(module) is not None), module
    assert utils.is_bnb_available(min_version="0.0.1") is utils.is_bnb_available()
    assert utils.is_weights_only_available() is True  # torch >= 2.4
    assert utils.is_pippy_available() is True


def test_a_folder_named_like_a_package_is_not_the_package(tmp_path, monkeypatch):
    from hasten.core import imports

    (tmp_path / "hasten_fake_pkg_7f3a").mkdir()
    (tmp_path / "hasten_fake_pkg_7f3a" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert importlib.util.find_spec("hasten_fake_pkg_7f3a") is not None
    assert imports._installed("hasten_fake_pkg_7f3a") is False  # no distribution metadata: not installed


def test_device_checks_ask_torch():
    assert utils.is_cuda_available() is torch.cuda.is_available()
    assert "PYTORCH_NVML_BASED_CUDA_CHECK" not in os.environ  # the check's variable is restored
    assert utils.is_mps_available() is (torch.backends.mps.is_available() and torch.backends.mps.is_built())
    assert utils.is_xpu_available() is (hasattr(torch, "xpu") and torch.xpu.is_available())
    assert utils.is_torch_xla_available() is (importlib.util.find_spec("torch_xla") is not None)
    for vendor in ("npu", "mlu", "musa", "sdaa", "neuron", "hpu"):
        assert getattr(utils, f"is_{vendor}_available")() is False  # no vendor plugin in the test environment
    assert utils.is_fp16_available() is True
    if not torch.cuda.is_available():
        assert utils.is_bf16_available() is True  # the CPU always can
    else:
        assert utils.is_bf16_available() is torch.cuda.is_bf16_supported()
    with pytest.raises(ValueError):
        utils.is_torch_xla_available.__wrapped__(check_is_tpu=True, check_is_gpu=True)


def test_rich_is_available_only_when_asked(monkeypatch):
    from hasten.core import imports

    monkeypatch.delenv("ACCELERATE_ENABLE_RICH", raising=False)
    monkeypatch.delenv("HASTEN_ENABLE_RICH", raising=False)
    assert hasten.is_rich_available() is False
    monkeypatch.setenv("ACCELERATE_ENABLE_RICH", "1")
    assert hasten.is_rich_available() is imports._installed("rich")


def test_required_decorators():
    from hasten.state import AcceleratorState

    @utils.deepspeed_required
    def needs_deepspeed():
        return "ran"

    assert needs_deepspeed() == "ran"  # no Accelerator yet: nothing to contradict
    AcceleratorState(cpu=True)
    with pytest.raises(ValueError, match="DeepSpeed"):
        needs_deepspeed()

    @utils.torchao_required
    def needs_torchao():
        return "ran"

    if utils.is_torchao_available():
        assert needs_torchao() == "ran"
    else:
        with pytest.raises(ImportError, match="torchao"):
            needs_torchao()


def test_importing_the_light_modules_does_not_import_torch():
    code = ("import sys; import hasten, hasten.utils.imports, hasten.utils.environment, hasten.utils.constants; "
            "import hasten.utils.versions; hasten.utils.is_deepspeed_available(); hasten.utils.MODEL_NAME; "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=clean_env(), check=True)
    assert out.stdout.strip() == "False", out.stderr


# ----------------------------------------------------------------------------- constants and versions
def test_constants_and_their_uses():
    from hasten.checkpointing.full_files import FullStateFormat
    from hasten.core import constants, versions

    assert (utils.SAFE_WEIGHTS_NAME, utils.WEIGHTS_NAME, utils.WEIGHTS_INDEX_NAME) == (
        "model.safetensors", "pytorch_model.bin", "pytorch_model.bin.index.json")
    assert FullStateFormat.model_file(1, False) == f"{constants.MODEL_NAME}_1.bin"
    assert FullStateFormat.model_file(1) == "model_1.safetensors"
    assert constants.STR_OPERATION_TO_FUNC is versions.OPERATIONS
    assert nn.Linear in constants.SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING
    assert "MULTI_CPU" in utils.TORCH_DISTRIBUTED_OPERATION_TYPES and "nproc_per_node" in utils.TORCH_LAUNCH_PARAMS
    assert str(versions.torch_version) == importlib.metadata.version("torch")
    from hasten.utils.torch_xla import install_xla
    from hasten.core.xla import install_xla as home

    assert install_xla is home


def test_memory_utils_is_an_old_path():
    sys.modules.pop("hasten.memory_utils", None)
    with pytest.warns(FutureWarning, match="hasten.utils.memory|find_executable_batch_size"):
        memory_utils = importlib.import_module("hasten.memory_utils")
    assert memory_utils.find_executable_batch_size is utils.find_executable_batch_size


# ----------------------------------------------------------------------------- environment
def test_str_to_bool_and_env_lines(caplog):
    assert utils.str_to_bool("YES") == 1 and utils.str_to_bool("off", to_bool=True) is False
    assert utils.str_to_bool("on", to_bool=True) is True
    with caplog.at_level(logging.WARNING):
        lines = utils.convert_dict_to_env_variables({"GOOD": "1", "BAD": "<x", "SPACE": "a b", "EMPTY": ""})
    assert lines == ["GOOD=1\n"] and "BAD" in caplog.text
    assert utils.are_libraries_initialized("torch", "surely_not_imported_lib") == ["torch"]


def test_cpu_distributed_information(monkeypatch):
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(key, raising=False)
    assert utils.get_cpu_distributed_information() == utils.CPUInformation(0, 1, 0, 1)
    monkeypatch.setenv("PMI_RANK", "3")
    monkeypatch.setenv("PMI_SIZE", "8")
    monkeypatch.setenv("MPI_LOCALRANKID", "1")
    monkeypatch.setenv("MPI_LOCALNRANKS", "4")
    assert utils.get_cpu_distributed_information() == utils.CPUInformation(3, 8, 1, 4)


def test_purge_restores_added_changed_and_removed_variables(monkeypatch):
    monkeypatch.setenv("ACCELERATE_KEEP", "before")
    monkeypatch.setenv("HASTEN_GONE", "was-here")
    monkeypatch.delenv("ACCELERATE_NEW", raising=False)

    @utils.purge_accelerate_environment
    def changes_everything():
        os.environ["ACCELERATE_NEW"] = "1"
        os.environ["ACCELERATE_KEEP"] = "after"
        del os.environ["HASTEN_GONE"]
        os.environ["UNRELATED_VARIABLE_X"] = "stays"
        return "result"

    try:
        assert changes_everything() == "result"
        assert "ACCELERATE_NEW" not in os.environ
        assert os.environ["ACCELERATE_KEEP"] == "before" and os.environ["HASTEN_GONE"] == "was-here"
        assert os.environ["UNRELATED_VARIABLE_X"] == "stays"
    finally:
        os.environ.pop("UNRELATED_VARIABLE_X", None)


def test_purge_on_a_test_class_and_its_subclasses(monkeypatch):
    monkeypatch.delenv("ACCELERATE_FROM_TEST", raising=False)

    @utils.purge_accelerate_environment
    class Base(unittest.TestCase):
        def test_sets(self):
            os.environ["ACCELERATE_FROM_TEST"] = "base"

        def helper(self):
            os.environ["ACCELERATE_FROM_TEST"] = "helper"

    class Child(Base):
        def test_child_sets(self):
            os.environ["ACCELERATE_FROM_TEST"] = "child"

    for case in (Base("test_sets"), Child("test_child_sets"), Child("test_sets")):
        assert case.run().wasSuccessful()
        assert "ACCELERATE_FROM_TEST" not in os.environ
    Base("test_sets").helper()  # not a test method: left alone
    assert os.environ.pop("ACCELERATE_FROM_TEST") == "helper"


@pytest.fixture
def fake_nvidia_smi(tmp_path, monkeypatch):
    """An ``nvidia-smi`` on PATH that reports the GPUs described by ``FAKE_GPUS`` (name;driver;capability)."""
    script = tmp_path / "nvidia-smi"
    script.write_text(textwrap.dedent("""\
        #!/bin/sh
        query="$1"
        IFS='|'
        for gpu in $FAKE_GPUS; do
          name=$(echo "$gpu" | cut -d';' -f1); driver=$(echo "$gpu" | cut -d';' -f2)
          capability=$(echo "$gpu" | cut -d';' -f3)
          case "$query" in
            --query-gpu=name) echo "$name" ;;
            --query-gpu=driver_version) echo "$driver" ;;
            --query-gpu=compute_capability) echo "$capability" ;;
            *) exit 2 ;;
          esac
        done
        """))
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    utils.check_cuda_fp8_capability.cache_clear()
    yield lambda *gpus: monkeypatch.setenv("FAKE_GPUS", "|".join(gpus))
    utils.check_cuda_fp8_capability.cache_clear()


def test_gpu_queries_read_nvidia_smi(fake_nvidia_smi):
    from hasten.utils.environment import get_driver_version

    fake_nvidia_smi("NVIDIA GeForce RTX 4090;535.10.01;8.9", "NVIDIA GeForce RTX 4090;535.10.01;8.9")
    assert utils.get_gpu_info() == (["NVIDIA GeForce RTX 4090"] * 2, 2)
    assert get_driver_version() == "535.10.01"
    assert utils.check_cuda_p2p_ib_support() is False  # RTX 40xx pair on a driver older than 550.40.07
    assert utils.check_cuda_fp8_capability() is True
    fake_nvidia_smi("NVIDIA GeForce RTX 4090;550.54.14;8.9", "NVIDIA GeForce RTX 4090;550.54.14;8.9")
    assert utils.check_cuda_p2p_ib_support() is True
    fake_nvidia_smi("NVIDIA A100-SXM4-80GB;535.10.01;8.0", "NVIDIA A100-SXM4-80GB;535.10.01;8.0")
    assert utils.check_cuda_p2p_ib_support() is True
    utils.check_cuda_fp8_capability.cache_clear()
    assert utils.check_cuda_fp8_capability() is False


def test_without_nvidia_smi(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # nothing to run
    with pytest.raises(FileNotFoundError):
        utils.get_gpu_info()
    assert utils.check_cuda_p2p_ib_support() is True
    assert utils.get_current_device_type() == ("cuda", "MULTI_GPU")


# ----------------------------------------------------------------------------- other
class Tower(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(4, 4)
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(4, 4), nn.ReLU()) for _ in range(3))
        self.head = nn.Linear(4, 2)

    def forward(self, x):
        x = self.embed(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def test_compile_regions_is_hastens_own_and_detected():
    from hasten import compile as hasten_compile
    from hasten.utils import other

    assert utils.compile_regions is hasten_compile.compile_regions is other.compile_regions
    model = Tower()
    parameters = list(model.parameters())
    assert other.has_repeated_blocks(model) and other.is_repeated_blocks(model.blocks)
    assert not other.is_repeated_blocks(model) and not other.is_repeated_blocks(nn.ModuleList([nn.Linear(1, 1)]))
    assert not utils.has_compiled_regions(model) and not utils.is_compiled_module(model)
    compiled = utils.compile_regions(model)
    assert compiled is model and list(model.parameters()) == parameters  # in place: optimizers keep working
    assert utils.has_compiled_regions(model) and not utils.is_compiled_module(model)
    assert utils.is_compiled_module(torch.compile(nn.Linear(2, 2)))
    fsdp2 = Tower()
    assert utils.compile_regions_fsdp2(fsdp2) is fsdp2 and utils.has_compiled_regions(fsdp2)
    assert utils.compile_regions_deepspeed(Tower()) is None


def test_small_helpers():
    assert utils.convert_bytes(512) == "512 bytes" and utils.convert_bytes(3 * 2**20) == "3.0 MB"
    assert utils.convert_bytes(2**60) == "1024.0 PB"
    assert utils.get_pretty_name(Tower) == "Tower" and utils.get_pretty_name(Tower()) == "Tower"
    assert utils.get_pretty_name(test_small_helpers) == "test_small_helpers"
    merged = utils.merge_dicts({"a": {"b": 2}, "c": 3}, {"a": {"x": 1, "b": 0}, "d": 4})
    assert merged == {"a": {"x": 1, "b": 2}, "c": 3, "d": 4}
    model = Tower()
    assert utils.recursive_getattr(model, "blocks.1.0") is model.blocks[1][0]
    assert utils.get_model_tp_size(model) is None
    model.config = namedtuple("Config", "distributed_config")({"tp_size": 4})
    assert utils.get_model_tp_size(model) == 4
    assert utils.model_has_dtensor(model) is False
    utils.wait_for_everyone()  # one process: returns


def test_ports():
    import socket

    from hasten.utils.other import get_free_port

    port = get_free_port()
    assert utils.is_port_in_use(port) is False
    with socket.socket() as server:
        server.bind(("localhost", port))
        server.listen()
        assert utils.is_port_in_use(port) is True


@pytest.mark.parametrize("release, warns", [("4.19.0-21-amd64", True), ("5.4", True), ("5.15.0-91-generic", False),
                                            ("6.8.0", False), ("weird", False)])
def test_check_os_kernel(monkeypatch, caplog, release, warns):
    import platform

    real = platform.uname()
    monkeypatch.setattr(platform, "uname", lambda: real._replace(system="Linux", release=release))
    with caplog.at_level(logging.WARNING):
        utils.check_os_kernel()
    assert ("below the recommended minimum of 5.5.0" in caplog.text) is warns
    caplog.clear()
    monkeypatch.setattr(platform, "uname", lambda: real._replace(system="Darwin", release="4.0.0"))
    utils.check_os_kernel()
    assert caplog.text == ""


def test_clean_state_dict_for_safetensors_keeps_every_value(tmp_path, caplog):
    from safetensors.torch import load_file, save_file

    fused = torch.arange(12.0).reshape(6, 2)
    shared = torch.ones(3)
    state = {"a": shared, "tied": shared, "q": fused[:3], "k": fused[3:], "meta": "bnb-string", "t": torch.eye(2).t()}
    with caplog.at_level(logging.WARNING):
        cleaned = utils.clean_state_dict_for_safetensors(state)
    assert "tied" not in state and "tied" not in cleaned and "tied" in caplog.text  # the alias, as the reference
    assert set(cleaned) == {"a", "q", "k", "meta", "t"} and cleaned["meta"] == "bnb-string"
    tensors = {key: value for key, value in cleaned.items() if isinstance(value, torch.Tensor)}
    save_file(tensors, tmp_path / "model.safetensors")  # would refuse shared or non-contiguous tensors
    back = load_file(tmp_path / "model.safetensors")
    assert torch.equal(back["q"], fused[:3]) and torch.equal(back["k"], fused[3:])  # views of one storage: kept
    assert torch.equal(back["t"], torch.eye(2))


# ----------------------------------------------------------------------------- operations
def test_tensor_codes_and_shape():
    from hasten.utils.operations import TENSOR_INT_TO_DTYPE, TENSOR_TYPE_TO_INT, gather_tensor_shape

    assert TENSOR_TYPE_TO_INT[torch.bfloat16] == 4 and TENSOR_INT_TO_DTYPE[9] is torch.int64
    shape, code = gather_tensor_shape(torch.zeros(2, 5, dtype=torch.int32))
    assert shape.tolist() == [2, 5] and TENSOR_INT_TO_DTYPE[code] is torch.int32
    tensor = torch.ones(3)
    assert utils.copy_tensor_to_devices(tensor) is tensor  # one process: nothing to copy
    with pytest.raises(ValueError):
        utils.copy_tensor_to_devices(None)


@pytest.mark.parametrize("batch, processes, size", [(3, 4, 4), (5, 4, 8), (9, 4, 12), (8, 4, 8), (1, 1, 1),
                                                    (7, 2, 8)])
def test_pad_input_tensors_makes_the_batch_split_evenly(batch, processes, size):
    data = {"x": torch.arange(batch * 2.0).reshape(batch, 2) + 1, "y": [torch.arange(batch)]}
    padded = utils.pad_input_tensors(data, batch, processes)
    assert padded["x"].shape == (size, 2) and padded["y"][0].shape == (size,)
    assert torch.equal(padded["x"][:batch], data["x"]) and not padded["x"][batch:].any()  # zeros after
    assert isinstance(padded["y"], list)


def test_pad_input_tensors_other_dim_and_errors():
    padded = utils.pad_input_tensors(torch.ones(2, 3), 3, 2, dim=1)
    assert padded.shape == (2, 4) and padded[:, 3].eq(0).all()
    with pytest.raises(TypeError):
        utils.pad_input_tensors([torch.ones(3), "text"], 3, 2)
    with pytest.raises(ValueError, match="more than"):
        utils.pad_input_tensors(torch.ones(9), 3, 2)
    with pytest.raises(ValueError):
        utils.pad_input_tensors(torch.ones(3), 3, 0)


def test_verify_and_chained_operation_in_one_process():
    from hasten.utils.operations import DistributedOperationException, chained_operation, verify_operation

    @verify_operation
    def total(tensor):
        return tensor.sum()

    assert total(torch.ones(3)).item() == 3 and total.__name__ == "total"

    @chained_operation
    def fails():
        raise DistributedOperationException("inner")

    with pytest.raises(DistributedOperationException, match="fails") as raised:
        fails()
    assert str(raised.value.__cause__) == "inner"


def test_gathered_parameters_is_a_no_op_without_zero3():
    model = nn.Linear(2, 2)
    with utils.GatheredParameters(model.parameters(), modifier_rank=0):
        model.weight.data.fill_(1.0)
    assert model.weight.eq(1).all()


def test_operations_across_two_processes():
    result = run_launch("check_utils_surface.py", num_processes=2)
    assert "check_utils_surface OK on 2 processes" in result.stdout


# ----------------------------------------------------------------------------- modeling
def test_device_and_storage_helpers(caplog):
    from hasten.utils import modeling

    assert utils.id_tensor_storage(torch.ones(4)) != utils.id_tensor_storage(torch.ones(4))
    base = torch.ones(4)
    assert utils.id_tensor_storage(base[:2]) == utils.id_tensor_storage(base[2:])
    assert utils.id_tensor_storage(torch.empty(3, device="meta"))[1] == 0
    assert modeling.check_device_same(torch.device("cpu"), "cpu")
    assert modeling.check_device_same("cuda", "cuda:0") and not modeling.check_device_same("cuda:1", "cuda:0")
    assert not modeling.check_device_same("cpu", "cuda")
    assert utils.check_tied_parameters_in_config(Tower()) is False
    assert utils.is_peft_model(Tower()) is False
    with caplog.at_level(logging.WARNING):
        utils.check_tied_parameters_on_same_device([["embed.weight", "head.weight"]], {"embed": 0, "head": 0})
        assert caplog.text == ""
        utils.check_tied_parameters_on_same_device([["embed.weight", "head.weight"]], {"embed": 0, "head": "cpu"})
    assert "different devices" in caplog.text
    with pytest.raises(ValueError):
        utils.check_tied_parameters_on_same_device([["missing.weight"]], {"embed": 0})


def test_allocation_helpers():
    from hasten.utils.modeling import fallback_allocate, get_module_leaves, get_module_size_with_ties

    model = Tower()
    sizes = utils.compute_module_sizes(model)
    leaves = get_module_leaves(sizes)
    assert "blocks.0.0.weight" in leaves and "blocks" not in leaves and "" not in leaves
    modules = list(model.named_children())
    size, names, _ = get_module_size_with_ties(["head.weight"], sizes["embed"], sizes, modules)
    assert size == sizes["embed"] + sizes["head"] - sizes["head.weight"] and names == ["head"]
    name, module, remaining = fallback_allocate(modules, sizes, sizes["blocks.0"])
    assert (name, module) == ("embed", model.embed) and [n for n, _ in remaining] == ["blocks", "head"]
    name, module, remaining = fallback_allocate([("blocks", model.blocks)], sizes, sizes["blocks.0"] + 1)
    assert name == "blocks.0" and [n for n, _ in remaining] == ["blocks.1", "blocks.2"]
    assert fallback_allocate(modules, sizes, 1)[0] == "blocks.0.1"  # the ReLU: nothing to store
    assert fallback_allocate([("embed", model.embed)], sizes, 1)[0] is None
    assert fallback_allocate(modules, sizes, "not a size") == (None, None, modules)


# ----------------------------------------------------------------------------- layerwise casting
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 2, 3)
        self.norm = nn.LayerNorm(8)
        self.proj = nn.Linear(8, 4)
        self.out = nn.Linear(4, 2)

    def forward(self, image, features):
        return self.conv(image).sum(), self.out(self.proj(self.norm(features)))


def test_layerwise_casting_stores_small_and_computes_large():
    from hasten.big_modeling import attach_layerwise_casting_hooks
    from hasten.hooks import LayerwiseCastingHook

    torch.manual_seed(0)
    model = Net()
    reference = Net()
    reference.load_state_dict(model.state_dict())
    attach_layerwise_casting_hooks(model, storage_dtype=torch.bfloat16, compute_dtype=torch.float32,
                                   skip_modules_pattern="^out$")
    assert model.proj.weight.dtype == torch.bfloat16 and model.conv.weight.dtype == torch.bfloat16
    assert model.norm.weight.dtype == torch.float32 and model.out.weight.dtype == torch.float32  # skipped / unsupported
    assert isinstance(model.proj._hf_hook, LayerwiseCastingHook)

    calls = []
    original = model.proj._old_forward  # what the hook calls once it has cast the weights

    def spy(*args, **kwargs):
        calls.append(model.proj.weight.dtype)
        return original(*args, **kwargs)

    model.proj._old_forward = spy
    image, features = torch.randn(1, 1, 5, 5), torch.randn(3, 8)
    with torch.no_grad():
        conv_sum, output = model(image, features)  # fp32 inputs: would fail on bf16 weights without the upcast
    assert calls == [torch.float32]  # computed in the compute dtype
    assert output.dtype == torch.float32 and model.proj.weight.dtype == torch.bfloat16  # stored small again
    with torch.no_grad():  # equals full precision run on the bf16-rounded weights
        reference.proj.weight.copy_(reference.proj.weight.to(torch.bfloat16).float())
        reference.proj.bias.copy_(reference.proj.bias.to(torch.bfloat16).float())
        reference.conv.weight.copy_(reference.conv.weight.to(torch.bfloat16).float())
        reference.conv.bias.copy_(reference.conv.bias.to(torch.bfloat16).float())
        expected_sum, expected = reference(image, features)
    torch.testing.assert_close(output, expected)
    torch.testing.assert_close(conv_sum, expected_sum)


def test_layerwise_casting_skips_classes_and_chains_hooks():
    from hasten.big_modeling import attach_layerwise_casting_hooks
    from hasten.hooks import ModelHook, SequentialHook, add_hook_to_module

    class Marker(ModelHook):
        pass

    model = Net()
    add_hook_to_module(model.proj, Marker())
    attach_layerwise_casting_hooks(model, torch.bfloat16, torch.float32, skip_modules_classes=(nn.Conv2d,))
    assert model.conv.weight.dtype == torch.float32 and not hasattr(model.conv, "_hf_hook")
    assert isinstance(model.proj._hf_hook, SequentialHook)  # appended after the hook it had
    with torch.no_grad():
        model(torch.randn(1, 1, 5, 5), torch.randn(2, 8))


# ----------------------------------------------------------------------------- optimizer
def test_move_to_device_and_patched_step():
    from hasten.optimizer import move_to_device, patch_optimizer_step

    Pair = namedtuple("Pair", "a b")
    state = {"x": [torch.ones(1), (torch.zeros(1), 3)], "p": Pair(torch.ones(1), "s")}
    moved = move_to_device(state, "meta")
    assert moved["x"][0].is_meta and moved["x"][1][0].is_meta and moved["x"][1][1] == 3
    assert isinstance(moved["p"], Pair) and moved["p"].a.is_meta
    optimizer = torch.optim.Adam(nn.Linear(2, 2).parameters())
    optimizer.state[0] = {"exp_avg": torch.ones(1)}
    moved_state = move_to_device(optimizer.state, "meta")
    assert isinstance(moved_state, defaultdict) and moved_state[0]["exp_avg"].is_meta

    class Holder:
        pass

    holder = Holder()
    step = patch_optimizer_step(holder, lambda *args, **kwargs: ("stepped", args, kwargs))
    assert step(1, closure=None) == ("stepped", (1,), {"closure": None})
    assert holder._accelerate_step_called is True


# ----------------------------------------------------------------------------- checkpointing
class Counter:
    def __init__(self, value=0, extra=None):
        self.value, self.extra = value, extra

    def state_dict(self):
        return {"value": self.value, "extra": self.extra}

    def load_state_dict(self, state):
        self.value, self.extra = state["value"], state["extra"]


@pytest.mark.parametrize("safe", [True, False])
def test_save_and_load_accelerator_state_round_trip(tmp_path, safe):
    import random

    from hasten.checkpointing import load_accelerator_state, save_accelerator_state
    from hasten.state import PartialState

    PartialState(cpu=True)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 3))
    model[1].weight = model[0].weight  # tied
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1)
    model(torch.randn(2, 3)).sum().backward()
    optimizer.step()
    scheduler.step()
    scaler = torch.amp.GradScaler("cpu", init_scale=8.0)
    folder = save_accelerator_state(tmp_path / "ckpt", [model.state_dict()], [optimizer], [scheduler], [], 0,
                                    step=7, scaler=scaler, safe_serialization=safe)
    assert (folder / ("model.safetensors" if safe else "pytorch_model.bin")).is_file()
    assert {p.name for p in folder.iterdir()} >= {"optimizer.bin", "scheduler.bin", "scaler.pt", "random_states_0.pkl"}
    expected_random = (random.random(), torch.rand(1))

    fresh = nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 3))
    fresh[1].weight = fresh[0].weight
    fresh_optimizer = torch.optim.AdamW(fresh.parameters(), lr=0.1)
    fresh_scheduler = torch.optim.lr_scheduler.StepLR(fresh_optimizer, step_size=1)
    fresh_scaler = torch.amp.GradScaler("cpu", init_scale=1.0)
    overrides = load_accelerator_state(folder, [fresh], [fresh_optimizer], [fresh_scheduler], [], 0,
                                       scaler=fresh_scaler)
    assert overrides == {"step": 7}
    assert (random.random(), torch.rand(1)) == expected_random  # generators continue as after the save
    for ours, theirs in zip(fresh.state_dict().values(), model.state_dict().values()):
        assert torch.equal(ours, theirs)
    assert torch.equal(fresh_optimizer.state_dict()["state"][0]["exp_avg"], optimizer.state_dict()["state"][0]["exp_avg"])
    assert fresh_scheduler.state_dict() == scheduler.state_dict() and fresh_scaler.get_scale() == 8.0
    with pytest.raises(ValueError, match="map_location"):
        load_accelerator_state(folder, [], [], [], [], 0, map_location="gpu")


def test_custom_state_is_saved_and_loaded_safely(tmp_path):
    from hasten.checkpointing import UnsafeCheckpointError, load_custom_state, save_custom_state

    save_custom_state(Counter(41), tmp_path, index=2)
    assert (tmp_path / "custom_checkpoint_2.pkl").is_file()
    restored = Counter()
    load_custom_state(restored, tmp_path, index=2)
    assert restored.value == 41
    save_custom_state(Counter(1, extra=nn.Linear), tmp_path)  # a class object: only free unpickling rebuilds it
    with pytest.raises(UnsafeCheckpointError):
        load_custom_state(Counter(), tmp_path)
    trusting = Counter()
    load_custom_state(trusting, tmp_path, load_kwargs={"weights_only": False})
    assert trusting.extra is nn.Linear
