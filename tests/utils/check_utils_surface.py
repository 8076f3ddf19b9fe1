"""Run with `hasten launch -n N` (N >= 2): Accelerate-named utilities that talk between processes.

copy_tensor_to_devices / gather_tensor_shape (a tensor only the last process has), verify_operation and
chained_operation in debug mode, wait_for_everyone, save_accelerator_state / load_accelerator_state with one
random-state file per process.
"""
from __future__ import annotations

import random
import sys
import tempfile

import torch

from hasten.checkpointing import load_accelerator_state, save_accelerator_state
from hasten.state import PartialState
from hasten.utils import copy_tensor_to_devices, wait_for_everyone
from hasten.utils.operations import (TENSOR_INT_TO_DTYPE, DistributedOperationException, broadcast_object_list,
                                     chained_operation, gather_tensor_shape, verify_operation)


def check_copy_from_last(state):
    last = state.num_processes - 1
    source = torch.arange(12, dtype=torch.bfloat16).reshape(3, 4) + 7 if state.process_index == last else None
    shape, code = gather_tensor_shape(source)
    assert shape.tolist() == [3, 4] and TENSOR_INT_TO_DTYPE[code] == torch.bfloat16, (shape, code)
    copied = copy_tensor_to_devices(source)
    assert copied.dtype == torch.bfloat16 and copied.shape == (3, 4)
    assert torch.equal(copied, torch.arange(12, dtype=torch.bfloat16).reshape(3, 4) + 7)
    if source is not None:
        assert copied is not source  # a new tensor everywhere

    everyone = torch.ones(2) if state.process_index in (0, last) else None
    try:
        copy_tensor_to_devices(everyone)
    except ValueError as error:
        assert "exactly one process" in str(error), error
    else:
        raise AssertionError("two sources must be refused")


@chained_operation
@verify_operation
def summed(tensor):
    return tensor.sum()


def check_verify_operation(state):
    state.debug = True
    try:
        assert summed(torch.ones(2, 2)).item() == 4  # same shapes everywhere: goes through
        try:
            summed(torch.ones(2, state.process_index + 1))
        except DistributedOperationException as error:
            assert "summed" in str(error) and isinstance(error.__cause__, DistributedOperationException), error
            assert "process 1" in str(error.__cause__), error.__cause__
        else:
            raise AssertionError("mismatched shapes must raise on every process")
    finally:
        state.debug = False


def check_state_files(state):
    folder = [tempfile.mkdtemp(prefix="hasten-state-files-") if state.is_main_process else None]
    broadcast_object_list(folder)
    torch.manual_seed(1)
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    random.seed(100 + state.process_index)  # each process's generators differ
    save_accelerator_state(folder[0], [model.state_dict()], [optimizer], [], [], state.process_index, step=5)
    expected = [random.random() for _ in range(3)]
    wait_for_everyone()
    random.seed(0)
    overrides = load_accelerator_state(folder[0], [model], [optimizer], [], [], state.process_index)
    assert overrides == {"step": 5}, overrides
    assert [random.random() for _ in range(3)] == expected  # this process's own random state came back


def main():
    state = PartialState()
    assert state.num_processes >= 2, "run with hasten launch -n 2 (or more)"
    check_copy_from_last(state)
    check_verify_operation(state)
    check_state_files(state)
    wait_for_everyone()
    if state.is_main_process:
        print(f"check_utils_surface OK on {state.num_processes} processes")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
