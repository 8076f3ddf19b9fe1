import functools
import sys
import types
import warnings
from types import MethodType

import pytest
import torch
import torch.distributed as dist
from torch import nn

from hasten.utils import extract_model_from_parallel, get_module_children_bottom_up


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 4)
        self.norm = nn.LayerNorm(4)

    def forward(self, x):
        return self.norm(self.linear(x))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(3, 4)
        self.blocks = nn.ModuleList([Block(), Block()])
        self.head = nn.Linear(4, 2)

    def forward(self, x):
        x = self.embed(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


class HasModuleAttribute(nn.Module):
    """Not a wrapper: it merely names its child `module`."""

    def __init__(self):
        super().__init__()
        self.module = nn.Linear(2, 2)
        self.extra = nn.Linear(2, 2)


@pytest.fixture(scope="module")
def process_group(tmp_path_factory):
    """A one-process gloo group, enough to build DDP and FSDP wrappers on the CPU."""
    init_file = tmp_path_factory.mktemp("pg") / "init"
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def prepared_with_fp32_wrapper(model):
    """Mimic what preparing with mixed precision does: keep the forward, install a wrapper converting outputs."""
    model._original_forward = model.forward

    @functools.wraps(type(model).forward)
    def forward(self, *args, **kwargs):
        return type(model).forward(self, *args, **kwargs).double()  # float64 so the wrapper is visible

    model.forward = MethodType(forward, model)
    return model


# ----------------------------------------------------------------------------- extract_model_from_parallel
def test_plain_model_is_returned_as_is():
    model = Net()
    assert extract_model_from_parallel(model) is model


def test_data_parallel_is_unwrapped():
    model = Net()
    assert extract_model_from_parallel(nn.DataParallel(nn.DataParallel(model))) is model


def test_ddp_is_unwrapped(process_group):
    model = Net()
    assert extract_model_from_parallel(nn.parallel.DistributedDataParallel(model)) is model


def test_fsdp1_is_unwrapped(process_group):
    from torch.distributed.fsdp import FullyShardedDataParallel

    model = Net()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # FSDP says it uses NO_SHARD with one process
        wrapped = FullyShardedDataParallel(model, device_id=torch.device("cpu"))
    assert extract_model_from_parallel(wrapped) is model


def test_deepspeed_engine_is_unwrapped_when_deepspeed_is_imported(monkeypatch):
    fake = types.ModuleType("deepspeed")

    class DeepSpeedEngine(nn.Module):
        def __init__(self, module):
            super().__init__()
            self.module = module

    fake.DeepSpeedEngine = DeepSpeedEngine
    monkeypatch.setitem(sys.modules, "deepspeed", fake)
    model = Net()
    assert extract_model_from_parallel(DeepSpeedEngine(model)) is model


def test_compiled_model_keeps_or_drops_the_compiled_wrapper():
    model = Net()
    compiled = torch.compile(nn.DataParallel(model))  # compiled after wrapping, as in a prepared model
    kept = extract_model_from_parallel(compiled)
    assert kept is compiled and kept._orig_mod is model
    compiled = torch.compile(nn.DataParallel(model))
    assert extract_model_from_parallel(compiled, keep_torch_compile=False) is model


def test_regionally_compiled_model_keeps_or_drops_the_copy():
    model = Net()
    copy = Net()
    copy.__dict__["_orig_mod"] = nn.DataParallel(model)  # how regional compilation keeps the original
    kept = extract_model_from_parallel(copy)
    assert kept is copy and kept.__dict__["_orig_mod"] is model
    copy.__dict__["_orig_mod"] = model
    assert extract_model_from_parallel(copy, keep_torch_compile=False) is model


def test_recursive_unwraps_wrapped_submodules():
    model = Net()
    inner_block = model.blocks[1]
    model.blocks[1] = nn.DataParallel(nn.DataParallel(inner_block))
    model.head = nn.DataParallel(model.head)
    head = model.head.module
    not_recursive = extract_model_from_parallel(nn.DataParallel(model))
    assert isinstance(not_recursive.blocks[1], nn.DataParallel)
    unwrapped = extract_model_from_parallel(nn.DataParallel(model), recursive=True)
    assert unwrapped is model and unwrapped.blocks[1] is inner_block and unwrapped.head is head
    assert not any(isinstance(m, nn.DataParallel) for m in unwrapped.modules())


def test_recursive_leaves_modules_that_merely_have_a_module_attribute():
    model = nn.Sequential(HasModuleAttribute())
    unwrapped = extract_model_from_parallel(model, recursive=True)
    assert isinstance(unwrapped[0], HasModuleAttribute)


def test_fp32_wrapper_is_kept_or_removed():
    model = prepared_with_fp32_wrapper(Net())
    x = torch.randn(2, 3)
    assert extract_model_from_parallel(nn.DataParallel(model))(x).dtype == torch.float64
    unwrapped = extract_model_from_parallel(nn.DataParallel(model), keep_fp32_wrapper=False)
    assert unwrapped is model
    assert unwrapped(x).dtype == torch.float32
    assert "forward" not in unwrapped.__dict__ and "_original_forward" not in unwrapped.__dict__


def test_fp32_wrapper_restores_a_custom_original_forward():
    model = Net()
    custom = MethodType(lambda self, x: torch.zeros(1), model)
    model.forward = custom
    prepared_with_fp32_wrapper(model)
    model.forward = MethodType(lambda self, x: torch.ones(1, dtype=torch.float64), model)
    unwrapped = extract_model_from_parallel(model, keep_fp32_wrapper=False)
    assert unwrapped.forward is custom


def test_same_results_as_accelerate(process_group):
    accelerate_utils = pytest.importorskip("accelerate.utils")
    x = torch.randn(2, 3)
    for keep_fp32 in (True, False):
        for keep_compile in (True, False):
            model = prepared_with_fp32_wrapper(Net())
            ours = extract_model_from_parallel(torch.compile(nn.parallel.DistributedDataParallel(model)),
                                               keep_fp32_wrapper=keep_fp32, keep_torch_compile=keep_compile)
            ours_type, ours_inner = type(ours), getattr(ours, "_orig_mod", ours)
            ours_dtype = ours_inner(x).dtype
            model = prepared_with_fp32_wrapper(Net())
            theirs = accelerate_utils.extract_model_from_parallel(
                torch.compile(nn.parallel.DistributedDataParallel(model)),
                keep_fp32_wrapper=keep_fp32, keep_torch_compile=keep_compile)
            theirs_inner = getattr(theirs, "_orig_mod", theirs)
            assert ours_type is type(theirs) and type(ours_inner) is type(theirs_inner) is Net
            assert ours_dtype == theirs_inner(x).dtype


# ----------------------------------------------------------------------------- get_module_children_bottom_up
def test_children_come_before_their_parents():
    model = Net()
    expected = [model.embed,
                model.blocks[0].linear, model.blocks[0].norm, model.blocks[0],
                model.blocks[1].linear, model.blocks[1].norm, model.blocks[1],
                model.blocks, model.head, model]
    order = get_module_children_bottom_up(model)
    assert len(order) == len(expected) and all(a is b for a, b in zip(order, expected))


def test_qualified_names():
    model = Net()
    names = [name for name, _ in get_module_children_bottom_up(model, return_fqns=True)]
    assert names == ["embed", "blocks.0.linear", "blocks.0.norm", "blocks.0", "blocks.1.linear", "blocks.1.norm",
                     "blocks.1", "blocks", "head", ""]


def test_a_leaf_module_is_alone():
    leaf = nn.Linear(2, 2)
    assert get_module_children_bottom_up(leaf) == [leaf]


def test_not_a_module_is_a_clear_error():
    with pytest.raises(TypeError, match="torch.nn.Module"):
        get_module_children_bottom_up([nn.Linear(2, 2)])


def test_same_order_as_accelerate():
    accelerate_utils = pytest.importorskip("accelerate.utils.other")
    shared = nn.Linear(4, 4)
    model = nn.Sequential(Net(), nn.Sequential(shared, nn.ReLU(), nn.Sequential(nn.Tanh(), shared)), Block())
    ours = get_module_children_bottom_up(model)
    theirs = accelerate_utils.get_module_children_bottom_up(model)
    assert len(ours) == len(theirs) and all(a is b for a, b in zip(ours, theirs))
    ours = get_module_children_bottom_up(model, return_fqns=True)
    theirs = accelerate_utils.get_module_children_bottom_up(model, return_fqns=True)
    assert [name for name, _ in ours] == [name for name, _ in theirs]
    assert all(a is b for (_, a), (_, b) in zip(ours, theirs))
