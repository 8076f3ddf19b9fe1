"""The greedy walk behind ``infer_auto_device_map``.

Modules are taken in model order and put on the first device (GPUs by index, then cpu, then disk) where they
fit; a module that does not fit is split into its direct parameters and children unless its class is
no-split, otherwise the walk moves on to the next device. The "main" devices (GPU 0 and the cpu, or mps) keep
room for the largest remaining layer, so that an offloaded layer can be brought back for its forward. Tied
parameters are placed together with the module that owns their first copy.

The decisions are Accelerate's, so the same model and arguments give the same device map; the bookkeeping
is different (memoised layer sizes, a stack instead of list pops from the front, a sorted list of the
largest layer's names), which is what makes planning a model of tens of thousands of modules fast.
Two Accelerate traps are avoided: tied parameters are matched to modules by path prefix (Accelerate matches
substrings, so module ``1`` claims ``h.11.weight``), and a tied parameter whose module is already placed is
skipped instead of raising ``IndexError``.
"""
from __future__ import annotations

import bisect
import logging
import warnings
from collections import OrderedDict, deque

from typing import Optional, Union

import torch
import torch.nn as nn

from .layer_index import LayerIndex
from .module_tensors import walk_modules
from .sizes import _sizes, _Sizer
from .tied import find_tied_parameters

logger = logging.getLogger("hasten.big_modeling.device_map")


def _inside(tensor_name: str, module_name: str) -> bool:
    return tensor_name == module_name or tensor_name.startswith(module_name + ".")


def _splittable_children(obj, name: str, no_split: set) -> list | None:
    """Direct parameters then children of ``obj`` (named from ``name``), or None when it cannot be split."""
    if not isinstance(obj, nn.Module):
        return None
    children = list(obj.named_children())
    if not children or obj.__class__.__name__ in no_split:
        return None
    return [(f"{name}.{n}", v) for n, v in list(obj.named_parameters(recurse=False)) + children]


class DevicePlanner:
    """One planning run; see ``infer_auto_device_map`` for the arguments."""

    def __init__(self, model: nn.Module, max_memory: dict, no_split: list[str],
                 dtype: Optional[Union[str, torch.dtype]], special_dtypes: Optional[dict[str, Union[str, torch.dtype]]],
                 verbose: bool, offload_buffers: bool, fallback_allocation: bool):
        self.max_memory = max_memory
        self.devices = list(max_memory) + ([] if "disk" in max_memory else ["disk"])
        gpus = [d for d in self.devices if d not in ("cpu", "disk")]
        self.gpus = gpus
        self.main_devices = ["mps"] if "mps" in gpus else ([gpus[0], "cpu"] if gpus else ["cpu"])
        self.no_split = set(no_split)
        self.verbose = verbose
        self.offload_buffers = offload_buffers
        self.fallback_allocation = fallback_allocation
        walk = walk_modules(model)
        sizer = _Sizer(dtype, special_dtypes)
        self.sizes = _sizes(walk, sizer, ("_parameters", "_buffers"))
        self.buffer_sizes = _sizes(walk, sizer, ("_buffers",))
        self.tied_groups = find_tied_parameters(model)
        self.layers = LayerIndex(self.sizes, no_split)
        top = (list(model.named_parameters(recurse=False)) + list(model.named_children())
               + list(model.named_buffers(recurse=False)))
        self._stack: list = []  # remaining entries, the next one last
        self._present: dict = {}
        self._push_front(top)
        self._set_largest(*self.layers.over(top))  # the first pass counts bare tensors as layers too

    # ------------------------------------------------------------ the remaining entries
    def _push_front(self, entries: list) -> None:
        for name, obj in reversed(entries):
            self._stack.append((name, obj))
            self._present[name] = obj

    def _pop_front(self):
        name, obj = self._stack.pop()
        del self._present[name]
        return name, obj

    def _remaining(self) -> list:
        return self._stack[::-1]

    def _replace_remaining(self, entries: list) -> None:
        self._stack = entries[::-1]
        self._present = dict(entries)

    def _remove(self, name: str) -> None:
        for position in range(len(self._stack) - 1, -1, -1):
            if self._stack[position][0] == name:
                del self._stack[position]
                del self._present[name]
                return

    def _entry_holding(self, tensor_name: str, entries=None):
        """The remaining entry (name, obj) that contains ``tensor_name``, or None."""
        if entries is None:
            parts = tensor_name.split(".")
            for end in range(1, len(parts) + 1):
                candidate = ".".join(parts[:end])
                if candidate in self._present:
                    return candidate, self._present[candidate]
            return None
        return next(((n, m) for n, m in entries if _inside(tensor_name, n)), None)

    # ------------------------------------------------------------ the largest remaining layer
    def _set_largest(self, size, names) -> None:
        self.largest = size
        self._largest_names = sorted(names)

    def _refresh_largest(self) -> None:
        self._set_largest(*self.layers.over(self._remaining(), modules_only=True))

    def _forget_largest(self, name: str) -> None:
        names = self._largest_names
        position = bisect.bisect_left(names, name)
        if position < len(names) and names[position] == name:
            del names[position]
        start = bisect.bisect_left(names, name + ".")
        end = bisect.bisect_left(names, name + "/")  # "/" sorts right after "."
        del names[start:end]
        if not names:
            self._refresh_largest()

    # ------------------------------------------------------------ tied parameters
    def _tied_outside(self, name: str) -> list[str]:
        """Parameters tied to one inside ``name`` but living outside it."""
        outside = []
        for group in self.tied_groups:
            inside = [_inside(k, name) for k in group]
            if any(inside) and not all(inside):
                outside.extend(k for k, is_in in zip(group, inside) if not is_in)
        return outside

    def _size_with_ties(self, tied_params, size, entries=None):
        names, objs = [], []
        for tensor_name in tied_params:
            holder = self._entry_holding(tensor_name, entries)
            if holder is None:  # already placed elsewhere: nothing to bring along
                continue
            names.append(holder[0])
            objs.append(holder[1])
            size += self.sizes.get(holder[0], 0) - self.sizes.get(tensor_name, 0)
        return size, names, objs

    # ------------------------------------------------------------ the walk
    def _say(self, message: str) -> None:
        if self.verbose:
            print(message)

    def run(self) -> OrderedDict:
        device_map: OrderedDict = OrderedDict()
        current = 0
        used = {device: 0 for device in self.devices}
        buffer_bytes: dict = {}
        minimum_needed: dict = {}
        while self._stack:
            name, obj = self._pop_front()
            self._say(f"\nTreating module {name}.")
            self._forget_largest(name)
            size = self.sizes.get(name, 0)
            tied_params = self._tied_outside(name)
            if tied_params:
                self._say(f"  Tied parameters outside {name} to take along: {tied_params}")
            device = self.devices[current]
            limit = None if device == "disk" else self.max_memory[device]
            reserved = 0
            if device in self.main_devices:
                limit -= self.largest
                reserved = self.largest
            with_ties, tied_names, tied_objs = self._size_with_ties(tied_params, size)

            if limit is None or used[device] + with_ties <= limit:
                self._say(f"Putting {name}{' and ' + str(tied_names) if tied_names else ''} (size={with_ties}) on {device}"
                          + (f" (available={limit - used[device]})." if limit is not None else "."))
                used[device] += with_ties
                device_map[name] = device
                for tied_name in tied_names:
                    if tied_name in self._present:
                        self._remove(tied_name)
                    device_map[tied_name] = device
                if not self.offload_buffers and isinstance(obj, nn.Module):
                    buffer_bytes[device] = buffer_bytes.get(device, 0) + self.buffer_sizes.get(name, 0)
                continue

            if tied_params and used[device] + size <= limit:
                self._say(f"Not enough space on {device} for {name} with {tied_names}; trying to split those.")
                if self._split_a_tied_module(name, obj, tied_names, tied_objs):
                    continue
                self._say("None of the tied modules can be split, going to the next device.")

            if used[device] + size >= limit:
                self._say(f"Not enough space on {device} to put {name} (available {limit - used[device]}, size {size}).")
                children = _splittable_children(obj, name, self.no_split)
                if children is not None:
                    self._say(f"Splitting {name}.")
                    self._push_front(children)
                    self._refresh_largest()
                    continue
                self._say("This module cannot be split, going to the next device.")

            if used[device] == 0 and self.fallback_allocation and device != "disk":
                room = self.max_memory[device] - max(self.largest, with_ties)
                found = self._fallback(room - used[device])
                if found is not None:
                    fallback_name, fallback_obj, rest = found
                    self._replace_remaining([(fallback_name, fallback_obj), (name, obj)] + rest)
                    continue

            if used[device] == 0:
                minimum_needed[device] = with_ties + reserved
            used[device] += reserved
            current += 1
            self._push_front([(name, obj)])

        self.used = {device: bytes_ for device, bytes_ in used.items() if bytes_ > 0}
        self._warn_about_buffers(buffer_bytes)
        if minimum_needed:
            logger.info("No module could be placed on these devices, for insufficient memory (bytes each would need at "
                        "least): %s. Give "
                        "them more memory or expect more offloading.", minimum_needed)
        return device_map

    def _split_a_tied_module(self, name, obj, tied_names, tied_objs) -> bool:
        for tied_name, tied_obj in zip(tied_names, tied_objs):
            children = _splittable_children(tied_obj, tied_name, self.no_split)
            if children is None:
                continue
            self._say(f"Splitting {tied_name}.")
            rest = self._remaining()
            index = next(i for i, (n, _) in enumerate(rest) if n == tied_name)
            self._replace_remaining([(name, obj)] + rest[:index] + children + rest[index + 1:])
            self._refresh_largest()
            return True
        return False

    def _fallback(self, limit):
        """Search (children before siblings) the remaining modules for one that fits in ``limit`` bytes; return
        it with the remaining list, its ancestors replaced by their parts, or None."""
        if limit < 0:
            return None
        modules = self._remaining()
        search = deque(modules)
        found = None
        while search:
            name, obj = search.popleft()
            with_ties, _, _ = self._size_with_ties(self._tied_outside(name), self.sizes.get(name, 0), search)
            if with_ties <= limit:
                found = (name, obj)
                break
            children = _splittable_children(obj, name, self.no_split)
            if children is not None:
                search.extendleft(reversed(children))
        if found is None:
            return None
        name = found[0]
        for dot in [i for i, c in enumerate(name) if c == "."]:
            parent = name[:dot]
            names = [n for n, _ in modules]
            if parent in names:
                index = names.index(parent)
                parent_obj = modules[index][1]
                parts = list(parent_obj.named_parameters(recurse=False)) + list(parent_obj.named_children())
                modules = modules[:index] + [(f"{parent}.{n}", v) for n, v in parts] + modules[index + 1:]
        index = next(i for i, (n, _) in enumerate(modules) if n == name)
        entry = modules.pop(index)
        return entry[0], entry[1], modules

    def _warn_about_buffers(self, buffer_bytes: dict) -> None:
        offloaded = buffer_bytes.get("cpu", 0) + buffer_bytes.get("disk", 0)
        if offloaded <= 0 or self.offload_buffers or not self.gpus:
            return
        fits = any(limit >= offloaded + self.used.get(device, 0)
                   for device, limit in self.max_memory.items() if device not in ("cpu", "disk"))
        if not fits:
            warnings.warn(
                f"The offloaded layers hold {offloaded} bytes of buffers, which do not fit in what is left on any GPU. "
                "If the forward runs out of memory, pass offload_buffers=True."
            )
