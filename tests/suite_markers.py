"""Markers the suite gives every test by reading its code: ``launches`` (it starts processes) and ``heavy`` (it
imports a large optional library). ``make test-fast`` runs the tests with neither (``-m "not launches and not
heavy"``); ``make test`` runs them all.

A test's code is its function, the fixtures it requests, and every function of the tests folder these call (their
names resolved in the module that defines them), followed to the end. It launches when that code names a way to
start a process (``subprocess``, ``run_launch``, ``debug_launcher`` ...); it is heavy when it imports, or asks
``pytest.importorskip`` for, one of ``HEAVY_LIBRARIES``, or its module imports one at the top.
"""
from __future__ import annotations

import inspect
import types
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
LAUNCHING_NAMES = frozenset({
    "subprocess", "Popen", "pexpect", "os.fork", "fork", "spawn", "run_launch", "run_real_launch", "debug_launcher",
    "notebook_launcher", "start_processes", "multiprocessing", "mp", "ProcessPoolExecutor", "launch_command",
    "execute_subprocess_async", "run_command",
})
HEAVY_LIBRARIES = frozenset({
    "transformers", "deepspeed", "diffusers", "peft", "trl", "sentence_transformers", "datasets", "bitsandbytes",
    "torchao", "accelerate", "wandb", "mlflow", "tensorboard", "aim", "comet_ml", "clearml", "dvclive", "swanlab",
    "trackio", "matplotlib", "torchdata", "megatron", "evaluate", "ray",
})


def _code_objects(code: types.CodeType):
    yield code
    for constant in code.co_consts:
        if isinstance(constant, types.CodeType):
            yield from _code_objects(constant)


def _in_tests(function) -> bool:
    try:
        return Path(inspect.getfile(function)).resolve().is_relative_to(TESTS)
    except (TypeError, OSError):
        return False


class _Reading:
    """What one function's code, and the tests-folder functions it calls, reach: ``(launches, heavy)``."""

    def __init__(self):
        self.seen: dict = {}

    def read(self, function) -> tuple:
        function = inspect.unwrap(function)
        code = getattr(function, "__code__", None)
        if code is None or not _in_tests(function):
            return False, False
        if code in self.seen:
            return self.seen[code]
        self.seen[code] = (False, False)  # a cycle adds nothing
        launches = heavy = False
        namespace = getattr(function, "__globals__", {})
        for inner in _code_objects(code):
            names = set(inner.co_names) | set(inner.co_varnames) | set(inner.co_freevars)
            strings = {c for c in inner.co_consts if isinstance(c, str)}
            launches = launches or bool(names & LAUNCHING_NAMES)
            heavy = heavy or any(name.split(".")[0] in HEAVY_LIBRARIES for name in names | strings)
            for name in inner.co_names:
                value = namespace.get(name)
                if isinstance(value, types.ModuleType):
                    heavy = heavy or value.__name__.split(".")[0] in HEAVY_LIBRARIES
                    launches = launches or value.__name__ in ("subprocess", "multiprocessing", "pexpect")
                elif callable(value) and _in_tests(value):
                    more = self.read(value if inspect.isfunction(value) or inspect.ismethod(value)
                                     else getattr(value, "__init__", value))
                    launches, heavy = launches or more[0], heavy or more[1]
        self.seen[code] = (launches, heavy)
        return launches, heavy


def _module_is_heavy(module) -> bool:
    return any(isinstance(value, types.ModuleType) and value.__name__.split(".")[0] in HEAVY_LIBRARIES
               for value in vars(module).values())


def mark_items(items) -> None:
    """Add ``launches`` / ``heavy`` to each collected test that has them."""
    reading = _Reading()
    for item in items:
        function = getattr(item, "function", None)
        if function is None:
            continue
        launches, heavy = reading.read(function)
        for definitions in getattr(item, "_fixtureinfo").name2fixturedefs.values():
            for definition in definitions:
                more = reading.read(definition.func)
                launches, heavy = launches or more[0], heavy or more[1]
        heavy = heavy or _module_is_heavy(item.module)
        if launches:
            item.add_marker(pytest.mark.launches)
        if heavy:
            item.add_marker(pytest.mark.heavy)
