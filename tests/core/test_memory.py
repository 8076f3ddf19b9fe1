import gc
import weakref

import pytest
import torch

import hasten.core.memory as memory
from hasten.utils import clear_device_cache, find_executable_batch_size, release_memory, should_reduce_batch_size

OUT_OF_MEMORY = [
    torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 79.15 GiB total capacity)"),
    RuntimeError("CUDA out of memory. Tried to allocate 20.00 MiB"),
    RuntimeError("HIP out of memory. Tried to allocate 1.00 GiB"),
    RuntimeError("XPU out of memory. Tried to allocate 512.00 MiB"),
    RuntimeError("NPU out of memory. Tried to allocate 1.00 GiB"),
    RuntimeError("MPS backend out of memory (MPS allocated: 17.00 GB, other allocations: 1.00 MB)"),
    RuntimeError("cuDNN error: CUDNN_STATUS_NOT_SUPPORTED. This error may appear if you passed in a "
                 "non-contiguous input."),
    RuntimeError("cuDNN error: CUDNN_STATUS_ALLOC_FAILED"),
    RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"),
    RuntimeError("[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: can't allocate memory: you tried "
                 "to allocate 8589934592 bytes. Error code 12 (Cannot allocate memory)"),
    RuntimeError("[enforce fail at ..\\c10\\core\\impl\\alloc_cpu.cpp:72] data. DefaultCPUAllocator: not enough "
                 "memory: you tried to allocate 4294967296 bytes."),
    RuntimeError("FATAL ERROR :: MODULE:PT_DEVMEM Allocation failed"),
    MemoryError(),
]
NOT_OUT_OF_MEMORY = [
    RuntimeError("Expected all tensors to be on the same device"),
    ValueError("out of memory"),  # right words, wrong kind of error
    KeyError("batch"),
    TypeError("unsupported operand"),
]


@pytest.fixture
def fast_gc(monkeypatch):
    """A full gc.collect() takes ~0.1 s with torch loaded; retry tests only need to know it is called."""
    calls = []
    monkeypatch.setattr(memory.gc, "collect", lambda *args: calls.append(1) or 0)
    return calls


def expected_sizes(start, smallest_that_fits):
    """Batch sizes tried with the default x0.9 reduction until one fits (derived from the rule, not the code)."""
    sizes = [start]
    while sizes[-1] > smallest_that_fits:
        sizes.append(int(sizes[-1] * 0.9))
    return sizes


def runs_when_at_most(limit, error, tried):
    def train(batch_size, *args, **kwargs):
        tried.append(batch_size)
        if batch_size > limit:
            raise error
        return batch_size, args, kwargs

    return train


@pytest.mark.parametrize("error", OUT_OF_MEMORY, ids=lambda e: type(e).__name__ + ":" + str(e)[:30])
def test_out_of_memory_errors_are_recognised(error):
    assert should_reduce_batch_size(error)


@pytest.mark.parametrize("error", NOT_OUT_OF_MEMORY, ids=repr)
def test_other_errors_are_not(error):
    assert not should_reduce_batch_size(error)


def test_a_real_cpu_allocation_failure_is_recognised():
    with pytest.raises(RuntimeError) as info:
        torch.empty(2**60, dtype=torch.uint8)
    assert should_reduce_batch_size(info.value)


@pytest.mark.parametrize("error", OUT_OF_MEMORY, ids=lambda e: type(e).__name__ + ":" + str(e)[:30])
def test_batch_size_shrinks_by_ten_percent_until_it_fits(error, fast_gc):
    tried = []
    train = find_executable_batch_size(runs_when_at_most(50, error, tried), starting_batch_size=128)
    result = train("model", lr=0.1)
    assert tried == expected_sizes(128, 50)
    assert result == (tried[-1], ("model",), {"lr": 0.1})


def test_decorator_without_arguments_starts_at_128(fast_gc):
    tried = []

    @find_executable_batch_size
    def train(batch_size):
        tried.append(batch_size)
        if batch_size > 110:
            raise torch.OutOfMemoryError("CUDA out of memory.")
        return batch_size

    assert train() == 103
    assert tried == [128, 115, 103]


def test_decorator_with_arguments(fast_gc):
    tried = []

    @find_executable_batch_size(starting_batch_size=16)
    def train(batch_size):
        tried.append(batch_size)
        if batch_size > 10:
            raise RuntimeError("CUDA out of memory.")
        return batch_size

    assert train() == 10
    assert tried == expected_sizes(16, 10)


def test_custom_reduction_takes_no_argument(fast_gc):
    state = {"size": 64}

    def halve():
        state["size"] //= 2
        return state["size"]

    tried = []
    train = find_executable_batch_size(runs_when_at_most(10, MemoryError(), tried), starting_batch_size=64,
                                       reduce_batch_size_fn=halve)
    assert train()[0] == 8
    assert tried == [64, 32, 16, 8]


def test_reduction_that_does_not_shrink_is_an_error_not_a_hang(fast_gc):
    tried = []
    train = find_executable_batch_size(runs_when_at_most(1, MemoryError(), tried), starting_batch_size=8,
                                       reduce_batch_size_fn=lambda: 8)
    with pytest.raises(ValueError, match="must return a smaller size"):
        train()
    assert tried == [8]


def test_gives_up_at_zero(fast_gc):
    tried = []
    train = find_executable_batch_size(runs_when_at_most(0, MemoryError(), tried), starting_batch_size=3)
    with pytest.raises(RuntimeError, match="No executable batch size found, reached zero"):
        train()
    assert tried == [3, 2, 1]


@pytest.mark.parametrize("error", NOT_OUT_OF_MEMORY, ids=repr)
def test_other_exceptions_propagate_unchanged(error, fast_gc):
    tried = []
    train = find_executable_batch_size(runs_when_at_most(-1, error, tried), starting_batch_size=32)
    with pytest.raises(type(error)) as info:
        train()
    assert info.value is error
    assert tried == [32]


def test_the_size_that_worked_is_remembered(fast_gc):
    tried = []
    train = find_executable_batch_size(runs_when_at_most(90, MemoryError(), tried), starting_batch_size=128)
    first = train()[0]
    tried.clear()
    assert train()[0] == first
    assert tried == [first]


def test_passing_the_batch_size_is_a_clear_error(fast_gc):
    tried = []

    @find_executable_batch_size(starting_batch_size=8)
    def train(batch_size, model):
        tried.append(batch_size)

    with pytest.raises(TypeError, match="Call it without the batch size"):
        train(8, "model")
    with pytest.raises(TypeError, match="Do not pass `batch_size`"):
        train(batch_size=8, model="model")
    assert tried == []
    train("model")
    assert tried == [8]


@pytest.mark.parametrize("bad", [-4, 2.5, True, "64"])
def test_bad_starting_batch_size(bad):
    with pytest.raises(ValueError, match="starting_batch_size"):
        find_executable_batch_size(lambda batch_size: None, starting_batch_size=bad)


def test_a_starting_batch_size_of_zero_is_taken_and_the_call_says_it_reached_zero():
    """As in the reference: decorating works, calling raises (the function never runs)."""
    ran = []
    train = find_executable_batch_size(lambda batch_size: ran.append(batch_size), starting_batch_size=0)
    with pytest.raises(RuntimeError, match="No executable batch size found, reached zero.*starting_batch_size=0"):
        train()
    assert ran == []


def test_memory_is_freed_before_each_retry(fast_gc):
    collections = fast_gc
    tried = []
    train = find_executable_batch_size(runs_when_at_most(110, MemoryError(), tried), starting_batch_size=128)
    train()
    assert len(tried) == 3 and len(collections) == len(tried)  # once before the first try, once per retry


def test_clear_device_cache_collects_reference_cycles():
    class Node:
        pass

    gc.disable()
    try:
        node = Node()
        node.self = node
        alive = weakref.ref(node)
        del node
        assert alive() is not None
        clear_device_cache(garbage_collection=True)
        assert alive() is None
    finally:
        gc.enable()


def test_clear_device_cache_empties_initialised_devices_only(monkeypatch):
    emptied = []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: emptied.append("cuda"))
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    clear_device_cache()
    assert emptied == []
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    clear_device_cache()
    assert emptied == ["cuda"]


def test_release_memory_returns_nones_and_collects(fast_gc):
    collections = fast_gc
    a, b, c = release_memory(torch.ones(3), [1, 2], object())
    assert (a, b, c) == (None, None, None)
    assert collections == [1]
    assert release_memory() == []


def test_gc_paused_pauses_collection_and_puts_it_back_as_it_was():
    import gc

    from hasten.core.gc_pause import gc_paused

    assert gc.isenabled()
    with pytest.raises(RuntimeError):
        with gc_paused():
            assert not gc.isenabled()
            raise RuntimeError("an error inside")
    assert gc.isenabled()
    gc.disable()
    try:
        with gc_paused():
            pass
        assert not gc.isenabled()  # paused before: left paused
    finally:
        gc.enable()
