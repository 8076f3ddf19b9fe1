"""Out-of-memory helpers: free cached device memory, and find the largest batch size that runs.

``find_executable_batch_size`` retries a function with a smaller batch size each time it runs out of
memory (on any device, or on the host), so a script can start optimistic and settle on what fits.
"""
from __future__ import annotations

import functools
import gc
import inspect
from typing import Any, Callable, Optional

import torch

__all__ = ["find_executable_batch_size", "release_memory", "clear_device_cache", "should_reduce_batch_size"]

# Fragments of the messages torch and its device backends use when an allocation fails.
_OUT_OF_MEMORY_MESSAGES = (
    " out of memory",  # CUDA / HIP / XPU / NPU: "CUDA out of memory. Tried to allocate ..."
    "MPS backend out of memory",
    "CUDNN_STATUS_NOT_SUPPORTED",  # cuDNN's answer to a workspace it cannot allocate for a too-large batch
    "CUDNN_STATUS_ALLOC_FAILED",
    "CUBLAS_STATUS_ALLOC_FAILED",
    "DefaultCPUAllocator: can't allocate memory",  # host RAM (Linux)
    "DefaultCPUAllocator: not enough memory",  # host RAM (Windows)
    "PT_DEVMEM Allocation failed",  # HPU
)
_DEVICE_CACHES = ("cuda", "xpu", "npu", "mlu", "musa", "sdaa")


def clear_device_cache(garbage_collection: bool = False) -> None:
    """Return the memory torch's caching allocators hold but do not use to the device.

    ``garbage_collection`` runs ``gc.collect()`` first so tensors only kept alive by reference cycles are freed
    too (slow: use sparingly). Devices that were never initialised in this process are left alone.
    """
    if garbage_collection:
        gc.collect()
    for name in _DEVICE_CACHES:
        module = getattr(torch, name, None)
        is_initialized = getattr(module, "is_initialized", None)
        if is_initialized is not None and is_initialized():
            module.empty_cache()
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        torch.mps.empty_cache()


def release_memory(*objects: Any) -> list:
    """Drop references to ``objects``, collect garbage and clear the device cache.

    Returns a list of ``None`` of the same length; assign it back so your names stop holding the objects::

        model, optimizer = release_memory(model, optimizer)
    """
    objects = list(objects)
    for index in range(len(objects)):
        objects[index] = None
    clear_device_cache(garbage_collection=True)
    return objects


def should_reduce_batch_size(exception: BaseException) -> bool:
    """Whether ``exception`` means "out of memory" (device or host), so a smaller batch may succeed."""
    if isinstance(exception, (torch.OutOfMemoryError, MemoryError)):
        return True
    if isinstance(exception, RuntimeError):
        message = " ".join(str(arg) for arg in exception.args)
        return any(fragment in message for fragment in _OUT_OF_MEMORY_MESSAGES)
    return False


def _check_batch_size_not_passed(function: Callable, args: tuple, kwargs: dict) -> None:
    """The decorator supplies the first argument; a caller that passes it too gets a clear error."""
    parameters = list(inspect.signature(function).parameters.values())
    if not parameters:
        raise TypeError(
            f"`{function.__name__}` must take the batch size as its first argument to be used with "
            "find_executable_batch_size."
        )
    first = parameters[0]
    if first.name in kwargs and first.kind is not inspect.Parameter.VAR_KEYWORD:
        raise TypeError(
            f"Do not pass `{first.name}` to `{function.__name__}`: find_executable_batch_size supplies it. "
            f"Call `{function.__name__}(...)` without it."
        )
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    if any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in parameters):
        return
    positional = [p for p in parameters if p.kind in kinds]
    if len(args) + 1 > len(positional):
        shown = ", ".join(f"{p.name}={value!r}" for p, value in zip(positional[1:], args[1:]))
        raise TypeError(
            f"`{function.__name__}` got the batch size as its first argument, but find_executable_batch_size "
            f"already supplies it. Call it without the batch size: `{function.__name__}({shown})`."
        )


def _check_starting_batch_size(value) -> int:
    """A non-negative int; 0 is taken (as in the reference): the first call then raises "reached zero"."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"starting_batch_size must be a non-negative int, got {value!r}.")
    return value


def find_executable_batch_size(function: Optional[Callable] = None, starting_batch_size: int = 128,
                               reduce_batch_size_fn: Optional[Callable[[], int]] = None) -> Callable[..., Any]:
    """Decorator: call ``function(batch_size, ...)``, retrying with a smaller batch after out-of-memory errors.

    ``function`` takes the batch size as its first argument, which the decorator supplies: call the decorated
    function without it. On an out-of-memory error (see ``should_reduce_batch_size``) memory is freed and the
    batch size becomes ``int(batch_size * 0.9)``, or ``reduce_batch_size_fn()`` (no argument, returns the new
    int) when given. Other exceptions propagate unchanged. At batch size 0 it gives up with ``RuntimeError``.
    The size that worked is remembered: a later call starts from it.

    Usable as ``@find_executable_batch_size`` or ``@find_executable_batch_size(starting_batch_size=64)``.
    """
    _check_starting_batch_size(starting_batch_size)
    if reduce_batch_size_fn is not None and not callable(reduce_batch_size_fn):
        raise TypeError(
            f"reduce_batch_size_fn must be callable (no argument, returns an int), got {reduce_batch_size_fn!r}."
        )
    if function is None:
        return functools.partial(find_executable_batch_size, starting_batch_size=starting_batch_size,
                                 reduce_batch_size_fn=reduce_batch_size_fn)
    if not callable(function):
        raise TypeError(f"find_executable_batch_size decorates a function, got {function!r}.")

    batch_size = starting_batch_size

    def reduce() -> int:
        if reduce_batch_size_fn is None:
            return int(batch_size * 0.9)
        new_size = reduce_batch_size_fn()
        if isinstance(new_size, bool) or not isinstance(new_size, int) or new_size < 0:
            raise TypeError(f"reduce_batch_size_fn must return a non-negative int, returned {new_size!r}.")
        if new_size >= batch_size:
            raise ValueError(
                f"reduce_batch_size_fn returned {new_size} after an out-of-memory error at batch size {batch_size}; "
                "it must return a smaller size, or the search would never end."
            )
        return new_size

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        nonlocal batch_size
        _check_batch_size_not_passed(function, args, kwargs)
        clear_device_cache(garbage_collection=True)
        while True:
            if batch_size == 0:
                raise RuntimeError(
                    f"No executable batch size found, reached zero: `{function.__name__}` ran out of memory at "
                    f"every batch size from {starting_batch_size} down. Reduce the model or sequence size, or "
                    "free memory held elsewhere." if starting_batch_size else
                    f"No executable batch size found, reached zero: `{function.__name__}` was given "
                    "starting_batch_size=0. Start from a positive batch size."
                )
            try:
                return function(batch_size, *args, **kwargs)
            except Exception as error:
                if not should_reduce_batch_size(error):
                    raise
            # Outside the except block: the failed attempt's traceback (and the tensors its frames hold) is gone.
            clear_device_cache(garbage_collection=True)
            batch_size = reduce()

    return wrapper
