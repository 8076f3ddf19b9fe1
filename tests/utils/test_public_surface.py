"""Accelerate's public surface exists in hasten at the same import paths, with compatible signatures.

Walks the reference library's public modules (the ``reference`` extra), lists every public name each one
defines (packages: every name they export) and checks the same path in hasten (``accelerate`` replaced by
``hasten`` in module and name). Names that cannot exist are listed, with the reason, in one table in
docs/migration.md; this test reads that table, so nothing is missing silently and nothing listed there
exists after all.
"""
from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import re
import types
import warnings
from pathlib import Path

import pytest

accelerate = pytest.importorskip("accelerate")

MIGRATION_DOC = Path(__file__).resolve().parents[2] / "docs" / "migration.md"
UTILS_SUBMODULES = ("dataclasses operations modeling offload memory random other imports constants environment "
                    "launch fsdp_utils deepspeed megatron_lm bnb versions torch_xla tqdm transformer_engine ao").split()
TOP_MODULES = ("hooks big_modeling data_loader state optimizer scheduler logging launchers local_sgd tracking "
               "inference parallelism_config memory_utils checkpointing test_utils accelerator").split()
# Modules that scripts import the package's main names from (``from accelerate.accelerator import
# DataLoaderConfiguration``): every main name they hold (see _is_top_level_name) counts as public there.
MAIN_NAME_MODULES = ("accelerate.accelerator", "accelerate.state")
_P = inspect.Parameter
_POSITIONAL = (_P.POSITIONAL_ONLY, _P.POSITIONAL_OR_KEYWORD)
_VARIADIC = (_P.VAR_POSITIONAL, _P.VAR_KEYWORD)


def reference_modules() -> list[str]:
    import accelerate.commands

    names = ["accelerate", "accelerate.utils"]
    names += [f"accelerate.utils.{m}" for m in UTILS_SUBMODULES]
    names += [f"accelerate.{m}" for m in TOP_MODULES]
    names += [m.name for m in pkgutil.walk_packages(accelerate.commands.__path__, "accelerate.commands.")]
    return names


def _defined_in_source(module) -> set[str]:
    """Top-level names a module's own source defines (functions, classes, assignments, incl. inside if/try)."""
    names = set()

    def visit(nodes):
        for node in nodes:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Assign):
                names.update(t.id for t in node.targets if isinstance(t, ast.Name))
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                names.add(node.target.id)
            elif isinstance(node, ast.If):
                visit(node.body), visit(node.orelse)
            elif isinstance(node, ast.Try):
                visit(node.body), visit(node.orelse), visit(node.finalbody)
                for handler in node.handlers:
                    visit(handler.body)

    visit(ast.parse(inspect.getsource(module)).body)
    return names


def public_names(module) -> dict[str, object]:
    """A package's exported names (its own or accelerate's); a module's names defined in its own source."""
    is_package = hasattr(module, "__path__")
    own = _defined_in_source(module)
    found = {}
    for name, value in vars(module).items():
        if name.startswith("_") or isinstance(value, types.ModuleType) or name == "logger":
            continue
        if is_package:
            home = getattr(value, "__module__", None) or ""
            if (callable(value) or inspect.isclass(value)) and not home.startswith("accelerate") and name not in own:
                continue  # a third-party name the package happens to import
        elif name not in own and not (module.__name__ in MAIN_NAME_MODULES and _is_top_level_name(name)):
            continue
        found[name] = value
    return found


def _is_top_level_name(name: str) -> bool:
    """Whether ``name`` is a main name: exported by ``accelerate``, or a class ``accelerate.utils`` exports
    (configuration classes, plugins and enums, which scripts import from wherever they see them)."""
    import accelerate.utils

    if hasattr(accelerate, name):
        return not isinstance(getattr(accelerate, name), types.ModuleType)
    return inspect.isclass(getattr(accelerate.utils, name, None))


def hasten_path(path: str) -> str:
    return path.replace("accelerate", "hasten")


def _table(heading: str) -> dict[str, str]:
    """The rows ``| `accelerate.path` | why |`` of one section of the migration guide: ``{path: why}``."""
    text = MIGRATION_DOC.read_text()
    section = text.split(f"## {heading}\n", 1)
    assert len(section) == 2, f"docs/migration.md lost its '## {heading}' section"
    body = re.split(r"^## ", section[1], maxsplit=1, flags=re.M)[0]
    rows = {}
    for match in re.finditer(r"^\|\s*`(accelerate[\w.]*)`\s*\|\s*(.+?)\s*\|\s*$", body, re.M):
        rows[match.group(1)] = match.group(2)
    return rows


def cannot_exist() -> dict[str, str]:
    """Accelerate names that hasten does not provide, with the reason."""
    return _table("Names that cannot exist")


def values_that_differ() -> dict[str, str]:
    """Accelerate constants whose hasten value differs on purpose, with the reason."""
    return _table("Values that differ on purpose")


def _without_self(signature) -> list:
    params = list(signature.parameters.values())
    return params[1:] if params and params[0].name in ("self", "cls") else params


def signature_problem(reference, ours) -> str | None:
    """Why a call written for ``reference`` would not work on ``ours`` (None when it would)."""
    try:
        ref_sig, our_sig = inspect.signature(reference), inspect.signature(ours)
    except (TypeError, ValueError):
        return None
    ref_params = _without_self(ref_sig)
    our_params = _without_self(our_sig)
    if [p.kind for p in ref_params] == [_P.VAR_POSITIONAL, _P.VAR_KEYWORD]:
        return None  # a decorator hid the reference's signature (its init_trackers, log): SPEC.md gives the real one
    ours_by_name = {p.name: p for p in our_params}
    takes_kwargs = any(p.kind == _P.VAR_KEYWORD for p in our_params)
    takes_args = any(p.kind == _P.VAR_POSITIONAL for p in our_params)
    for p in ref_params:
        if p.kind == _P.VAR_KEYWORD and not takes_kwargs:
            return "does not take **kwargs"
        if p.kind == _P.VAR_POSITIONAL and not takes_args:
            return "does not take *args"
        if p.kind in _VARIADIC:
            continue
        mine = ours_by_name.get(p.name)
        if mine is None:
            if (p.kind == _P.POSITIONAL_ONLY and takes_args) or (p.kind != _P.POSITIONAL_ONLY and takes_kwargs):
                continue
            return f"has no parameter {p.name!r}"
        if p.kind == _P.KEYWORD_ONLY and mine.kind == _P.POSITIONAL_ONLY:
            return f"{p.name!r} cannot be passed by keyword"
    ref_positional = [p.name for p in ref_params if p.kind in _POSITIONAL]
    our_positional = [p.name for p in our_params if p.kind in _POSITIONAL]
    if our_positional[:len(ref_positional)] != ref_positional and not (
            takes_args and ref_positional[:len(our_positional)] == our_positional):
        return f"positional parameters {our_positional} differ from the reference's {ref_positional}"
    ref_required = {p.name for p in ref_params if p.default is _P.empty and p.kind not in _VARIADIC}
    extra = [p.name for p in our_params
             if p.default is _P.empty and p.kind not in _VARIADIC and p.name not in ref_required]
    if extra:
        return f"requires {extra}, which the reference does not"
    return None


def _surface():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for module_name in reference_modules():
            module = importlib.import_module(module_name)
            for name, value in public_names(module).items():
                yield module_name, name, value


def _lookup(path_module: str, name: str):
    """hasten's object for a reference name, or a string saying why there is none."""
    module_name = hasten_path(path_module)
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        return f"module {module_name} cannot be imported ({error})"
    for candidate in dict.fromkeys((name, hasten_path(name))):
        if hasattr(module, candidate):
            return getattr(module, candidate), candidate
    return f"{module_name} has no {name}"


def test_every_reference_name_exists_with_a_compatible_signature():
    exempt = cannot_exist()
    own_values = values_that_differ()
    problems = []
    for module_name, name, reference in _surface():
        path = f"{module_name}.{name}"
        if path in exempt or module_name in exempt:
            continue
        found = _lookup(module_name, name)
        if isinstance(found, str):
            problems.append(f"{path}: {found}")
            continue
        ours, _ = found
        if callable(reference) and not inspect.isclass(reference) or inspect.isclass(reference):
            why = signature_problem(reference, ours)
            if why:
                problems.append(f"{path}: {why}")
        elif isinstance(reference, (str, int, float, bool)) and not isinstance(reference, enum_types()):
            if ours != reference and path not in own_values:
                problems.append(f"{path}: value {ours!r} differs from the reference's {reference!r}")
    assert not problems, f"{len(problems)} Accelerate names are missing or incompatible:\n" + "\n".join(problems)


def enum_types():
    import enum

    return (enum.Enum,)


def test_every_reference_class_method_exists_with_a_compatible_signature():
    exempt = cannot_exist()
    problems = []
    seen = set()
    for module_name, name, reference in _surface():
        if not inspect.isclass(reference) or id(reference) in seen:
            continue
        seen.add(id(reference))
        if f"{module_name}.{name}" in exempt or module_name in exempt:
            continue
        found = _lookup(module_name, name)
        if isinstance(found, str):
            continue  # reported by the test above
        ours = found[0]
        for attr, member in vars(reference).items():
            if attr.startswith("_") or not callable(member) and not isinstance(member, (property, classmethod,
                                                                                        staticmethod)):
                continue
            path = f"{module_name}.{name}.{attr}"
            if path in exempt:
                continue
            if not hasattr(ours, attr):
                problems.append(f"{path}: missing")
                continue
            ref_member, our_member = getattr(reference, attr, None), getattr(ours, attr, None)
            if callable(ref_member) and callable(our_member) and not inspect.isclass(ref_member):
                why = signature_problem(ref_member, our_member)
                if why:
                    problems.append(f"{path}: {why}")
    assert not problems, f"{len(problems)} methods are missing or incompatible:\n" + "\n".join(problems)


def _reference_value(path: str):
    module_name, name = path.rsplit(".", 1)
    return getattr(importlib.import_module(module_name), name)


def test_the_cannot_exist_table_lists_only_reference_names_that_hasten_lacks():
    surface = {f"{m}.{n}" for m, n, _ in _surface()} | set(reference_modules())
    classes = {f"{m}.{n}": v for m, n, v in _surface() if inspect.isclass(v)}
    stale = [f"{path}: listed as differing but equal to the reference's value" for path in values_that_differ()
             if path in surface and _lookup(*path.rsplit(".", 1))[0] == _reference_value(path)]
    for path in cannot_exist():
        owner, _, attr = path.rpartition(".")
        if path not in surface and not (owner in classes and hasattr(classes[owner], attr)):
            stale.append(f"{path}: not a public name of the reference")
    assert not stale, "docs/migration.md lists names it should not:\n" + "\n".join(stale)
