"""Structure rules for the source tree, checked by reading the code (nothing is imported).

* No import cycle anywhere in the package: two modules that import each other, even from inside a function, are one
  job split badly; the shared piece belongs in a module both can import.
* Floors: every room (top-level package or module) has a floor, and no module imports a room above its own; the
  faces (Accelerate's import paths) sit on top and hold nothing but re-exports.
* No module hides behind a leading underscore: a module other modules import is part of the structure, and its
  name should say so. Privacy is expressed by the package's ``__all__`` / export table instead.
* Typed signatures: the share of public functions whose parameters and return are all annotated never falls below
  ``ANNOTATED_FLOOR``.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path


SOURCE_ROOT = Path(__file__).resolve().parent.parent / "src"
PACKAGE = "hasten"

# Folders whose modules may still start with an underscore (none: the CLI package has been renamed).
UNDERSCORE_EXEMPT_FOLDERS = ()


# ----------------------------------------------------------------------------- the import graph
def module_files(root: Path, package: str) -> dict[str, Path]:
    """Dotted module name -> file, for every module of ``package`` under ``root`` (a package is its __init__)."""
    modules = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def _imported_modules(node: ast.AST, module: str, is_package: bool, modules: dict) -> set:
    """The modules of ``modules`` one import statement brings in: ``import p.x`` -> ``p.x``; ``from .x import y``
    -> ``p.x.y`` when y is a module, else ``p.x`` (for a package, its ``__init__``)."""
    if isinstance(node, ast.Import):
        return {_known_module(alias.name, modules) for alias in node.names}
    if not isinstance(node, ast.ImportFrom):
        return set()
    if node.level:
        base = module.split(".") if is_package else module.split(".")[:-1]
        base = base[:len(base) - (node.level - 1)]
        source = ".".join(base + ([node.module] if node.module else []))
    else:
        source = node.module or ""
    return {f"{source}.{alias.name}" if f"{source}.{alias.name}" in modules else _known_module(source, modules)
            for alias in node.names}


def _known_module(name: str, modules: dict):
    """The module ``name`` is, or lies in (``hasten.data.samplers.get_sampler`` -> ``hasten.data.samplers``)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def import_graph(root: Path = SOURCE_ROOT, package: str = PACKAGE) -> dict[str, dict[str, int]]:
    """Module -> {imported module of the same package: line}, from every import statement of the module:
    at module level, inside functions and classes, under ``if TYPE_CHECKING`` alike."""
    modules = module_files(root, package)
    graph = {}
    for module, path in modules.items():
        is_package = path.name == "__init__.py"
        edges: dict[str, int] = {}
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            for target in _imported_modules(node, module, is_package, modules):
                if target is not None and target != module:
                    edges.setdefault(target, node.lineno)
        graph[module] = edges
    return graph


def cycles(graph: dict[str, dict]) -> list[frozenset]:
    """The strongly connected components of more than one module (each holds at least one cycle)."""
    index: dict = {}
    low: dict = {}
    stack: list = []
    on_stack: set = set()
    found = []

    def visit(start):
        # iterative Tarjan: (node, iterator over its targets)
        work = [(start, iter(graph[start]))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, targets = work[-1]
            for target in targets:
                if target not in graph:
                    continue
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(graph[target])))
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.add(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(frozenset(component))

    for node in graph:
        if node not in index:
            visit(node)
    return found


def within(graph: dict[str, dict], package: str) -> dict[str, dict]:
    """The part of ``graph`` made of ``package`` and its modules."""
    def inside(name):
        return name == package or name.startswith(package + ".")
    return {module: {t: line for t, line in edges.items() if inside(t)}
            for module, edges in graph.items() if inside(module)}


def describe(component: frozenset, graph: dict) -> str:
    links = [f"{a} -> {b} (line {graph[a][b]})" for a in sorted(component) for b in sorted(graph[a]) if b in component]
    return "; ".join(links)


# ----------------------------------------------------------------------------- the scanner itself
def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


def test_the_scan_finds_cycles_hidden_in_functions_and_every_import_form(tmp_path):
    _write(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/a.py": "from .b import thing\n",
        "pkg/b.py": "def f():\n    from .a import other\n",                  # function-level: still a cycle
        "pkg/sub/__init__.py": "",
        "pkg/sub/c.py": "import pkg.sub.d\n",
        "pkg/sub/d.py": "class K:\n    def m(self):\n        from ..sub import c\n",  # `from ..sub import c`: module c
        "pkg/e.py": "from . import a\nimport os\n",                              # one way only: no cycle
    })
    graph = import_graph(tmp_path, "pkg")
    assert graph["pkg.b"] == {"pkg.a": 2}
    assert graph["pkg.sub.d"] == {"pkg.sub.c": 3}
    assert graph["pkg.e"] == {"pkg.a": 1}
    assert sorted(map(sorted, cycles(graph))) == [["pkg.a", "pkg.b"], ["pkg.sub.c", "pkg.sub.d"]]
    assert cycles(within(graph, "pkg.sub")) == [frozenset({"pkg.sub.c", "pkg.sub.d"})]


def test_the_scan_sees_cycles_through_a_package_init(tmp_path):
    _write(tmp_path, {
        "pkg/__init__.py": "from .a import x\n",
        "pkg/a.py": "from pkg import y\n",  # y is a name of the package, so the edge goes to its __init__
    })
    assert cycles(import_graph(tmp_path, "pkg")) == [frozenset({"pkg", "pkg.a"})]


# ----------------------------------------------------------------------------- the rules
def test_no_module_name_starts_with_an_underscore():
    hidden = []
    for path in sorted((SOURCE_ROOT / PACKAGE).rglob("*.py")):
        relative = path.relative_to(SOURCE_ROOT / PACKAGE)
        if relative.parts[0] in UNDERSCORE_EXEMPT_FOLDERS or path.name in ("__init__.py", "__main__.py"):
            continue
        if any(part.startswith("_") for part in relative.parts):
            hidden.append(str(relative))
    assert not hidden, (f"Modules whose name starts with an underscore: {hidden}. Give them a plain name: other "
                        "modules import them, and the package's __all__ / export table already says what is public.")


# ----------------------------------------------------------------------------- floors
# The rooms of the package, lowest floor first. A module imports its own room, rooms on its floor and rooms below,
# never a room above: what two rooms share lives on the lower one. The faces (Accelerate's import paths, which only
# re-export) sit above every floor.
FLOORS = (
    ("core", "as_accelerate"),
    ("config",),
    ("state", "logging"),
    ("parallel", "collectives", "progress"),
    ("precision", "data", "big_modeling", "compile", "optimizer", "scheduler", "tracking", "checkpointing",
     "local_sgd"),
    ("quantization", "strategies"),
    ("accumulation", "evaluation", "inference", "accelerator", "planning"),
    ("commands", "launchers", "test_utils", "integrations", "__main__"),
)
FACES = ("utils", "data_loader", "hooks", "memory_utils", "parallelism_config", "")


def room_of(module: str) -> str:
    """``hasten.strategies.fsdp.fsdp2`` -> ``strategies``; the package itself -> ``""``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def floor_of(room: str):
    for floor, rooms in enumerate(FLOORS):
        if room in rooms:
            return floor
    return None


def upward_imports(graph: dict) -> list:
    found = []
    for module, edges in graph.items():
        room = room_of(module)
        if room in FACES:
            continue
        for target, line in edges.items():
            other = room_of(target)
            if other == room:
                continue
            if other in FACES or floor_of(other) > floor_of(room):
                found.append(f"{module} (line {line}) -> {target}")
    return found


def test_every_room_has_a_floor():
    rooms = {room_of(module) for module in import_graph()}
    unplaced = sorted(room for room in rooms if room not in FACES and floor_of(room) is None)
    assert not unplaced, f"Rooms without a floor in FLOORS: {unplaced}"


def test_no_import_runs_up_a_floor():
    found = upward_imports(within(import_graph(), PACKAGE))
    assert not found, ("Imports from a lower floor to a higher one (or into a face): " + "; ".join(found) +
                       ". Move what both need to the lower room, or pass it in.")


def test_no_import_cycle_anywhere():
    graph = within(import_graph(), PACKAGE)
    found = cycles(graph)
    assert not found, "Import cycles: " + " | ".join(describe(c, graph) for c in found)


# ----------------------------------------------------------------------------- faces
def face_files() -> list:
    package = SOURCE_ROOT / PACKAGE
    return sorted(package.joinpath("utils").glob("*.py")) + [
        package / f"{name}.py" for name in FACES if name and name != "utils" and (package / f"{name}.py").is_file()]


def _face_statement_is_a_re_export(node: ast.stmt) -> bool:
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return True
    if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
        return True  # a docstring
    if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):  # the old path's deprecation warning
        return ast.unparse(node.value.func) == "warnings.warn"
    if isinstance(node, ast.Assign):
        names = [ast.unparse(target) for target in node.targets]
        if names == ["__all__"]:
            return True
        # a lazy table: names served on first use from their home modules
        return isinstance(node.value, ast.Call) and ast.unparse(node.value.func) in ("lazy_exports", "build_table")
    return False


def test_faces_only_re_export():
    """Accelerate's import paths (``utils/`` and the root compatibility modules) hold no logic of their own: imports,
    ``__all__`` and lazy tables only, so every behaviour has one home in a room."""
    found = []
    for path in face_files():
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if not _face_statement_is_a_re_export(node):
                found.append(f"{path.relative_to(SOURCE_ROOT)}:{node.lineno} {ast.unparse(node).splitlines()[0][:80]}")
    assert not found, "Logic in face modules (move it to the room it belongs to): " + "; ".join(found)


# ----------------------------------------------------------------------------- backend branches
# Rooms that may name backends: the strategies themselves, and the command line, whose flags and questions do.
BRANCHING_ROOMS = ("strategies", "commands", "utils")
# Process kinds, not backends: which launcher started the processes and on what device.
PROCESS_KINDS = {"NO", "XLA"}
# The few branches elsewhere, each because Accelerate's API names the backend there (the comment beside it says so).
ALLOWED_BRANCHES = {
    ("precision/autocast.py", "get_grad_scaler"),  # get_grad_scaler(distributed_type=...): FSDP's sharded scaler
    ("state.py", "is_fsdp2"),  # AcceleratorState.is_fsdp2: read-only view of what the strategy set
    ("state.py", "deepspeed_plugin"),  # AcceleratorState.deepspeed_plugin: likewise
    # the reference's PartialState says DEEPSPEED for a DeepSpeed launch, before any strategy exists
    ("state.py", "launched_backend_type"),
    # a launched test script asserting what the process state reports for the launch it was given
    ("test_utils/scripts/test_script.py", "check_process_state"),
    # a launched test script setting another backend on the state to see join_uneven_inputs warn that it is DDP's
    ("test_utils/scripts/test_distributed_data_loop.py", "check_join_warns_without_ddp"),
}


def backend_branches(root: Path = SOURCE_ROOT / PACKAGE) -> list:
    """``(file, enclosing function, line)`` of every backend test outside the rooms that may name backends: a
    ``DistributedType.<BACKEND>`` (not a process kind), an ``isinstance(..., <...>Strategy)`` or a ``_is_deepspeed``."""
    found = []
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(root)
        if relative.parts[0] in BRANCHING_ROOMS or relative.as_posix() == "config/enums.py":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for function in [tree] + [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]:
            name = getattr(function, "name", "<module>")
            body = function.body if function is not tree else [n for n in tree.body
                                                                if not isinstance(n, (ast.FunctionDef, ast.ClassDef))]
            for node in (inner for statement in body for inner in ast.walk(statement)):
                branch = None
                if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and \
                        node.value.id == "DistributedType" and node.attr.isupper() and \
                        node.attr not in PROCESS_KINDS and not node.attr.startswith("MULTI_"):
                    branch = f"DistributedType.{node.attr}"
                elif isinstance(node, ast.Call) and ast.unparse(node.func) == "isinstance" and len(node.args) == 2 \
                        and "Strategy" in ast.unparse(node.args[1]):
                    branch = ast.unparse(node)
                elif isinstance(node, ast.Name) and "_is_deepspeed" in node.id:
                    branch = node.id
                if branch is not None:
                    found.append((relative.as_posix(), name, node.lineno, branch))
    return found


def test_the_branch_scan_finds_each_form(tmp_path):
    _write(tmp_path, {"pkg/mod.py": (
        "from x import DistributedType\n"
        "def a(state):\n    return state.distributed_type == DistributedType.FSDP\n"
        "def b(strategy):\n    return isinstance(strategy, FSDP2Strategy)\n"
        "def c(path):\n    return _is_deepspeed(path)\n"
        "def d(state):\n    return state.distributed_type in (DistributedType.NO, DistributedType.MULTI_CPU)\n")})
    found = backend_branches(tmp_path / "pkg")
    assert [(name, branch) for _, name, _, branch in found] == [
        ("a", "DistributedType.FSDP"), ("b", "isinstance(strategy, FSDP2Strategy)"), ("c", "_is_deepspeed")]


def test_backend_branches_live_in_the_strategies():
    found = [entry for entry in backend_branches() if entry[:2] not in ALLOWED_BRANCHES]
    assert not found, ("Backend branches outside strategies/ (ask the strategy instead, or add a row to "
                       "ALLOWED_BRANCHES with the reason): " + "; ".join(f"{f}:{line} {name}: {b}"
                                                                         for f, name, line, b in found))
    allowed_present = {entry[:2] for entry in backend_branches()}
    assert ALLOWED_BRANCHES <= allowed_present, f"ALLOWED_BRANCHES lists gone branches: {ALLOWED_BRANCHES - allowed_present}"


# ----------------------------------------------------------------------------- words that say what the code does
# A source path as docstrings, comments and docs write it: folders and a file name ending in .py (``room/file.py``);
# inside the package also a bare file name (``checks.py``), except the names of scripts that are the user's or
# another project's, which the package mentions as examples
PATH_MENTION = re.compile(r"(?<![\w./-])((?:[a-z_0-9]+/)+[a-z_0-9]+\.py)\b")
BARE_MENTION = re.compile(r"(?<![\w./-])([a-z_0-9]+\.py)\b")
NOT_OURS = {"train.py", "script.py", "model.py", "path.py", "placeholder.py", "zero_to_fp32.py", "nlp_example.py",
            "complete_nlp_example.py", "cv_example.py"}


def stale_path_mentions(project: Path) -> list:
    """``file:line: path`` for every source path named in ``project``'s package, docs and README that exists nowhere:
    a path counts when it is relative to the project, to ``src/``, to the package, or the tail of any file there
    (``fsdp/fsdp2.py``). ``path/to/...`` placeholders are skipped; bare names are checked in ``src/`` only."""
    tops = [entry for entry in project.iterdir() if entry.name not in (".venv", ".git", "build")]
    files = {path.relative_to(project).as_posix() for top in tops
             for path in ([top] if top.suffix == ".py" else top.rglob("*.py") if top.is_dir() else [])}
    tails = {"/".join(parts[i:]) for parts in (name.split("/") for name in files) for i in range(len(parts))}
    stale = []
    texts = [*sorted((project / "src").rglob("*.py")), *sorted((project / "docs").rglob("*.md")), project / "README.md"]
    for text in filter(Path.exists, texts):
        in_package = text.suffix == ".py"
        for number, line in enumerate(text.read_text(errors="ignore").splitlines(), 1):
            found = PATH_MENTION.findall(line) + (BARE_MENTION.findall(line) if in_package else [])
            for path in found:
                if not path.startswith("path/to/") and path not in tails and path not in NOT_OURS:
                    stale.append(f"{text.relative_to(project)}:{number}: {path}")
    return stale


def test_the_path_scan_finds_a_path_that_is_gone(tmp_path):
    _write(tmp_path, {"src/pkg/room/real.py": '"""Works with room/real.py, real.py and path/to/x.py, not gone.py."""\n',
                      "docs/a.md": "See `room/gone.py` and src/pkg/room/real.py, run with gone.py.\n"})
    assert stale_path_mentions(tmp_path) == ["src/pkg/room/real.py:1: gone.py", "docs/a.md:1: room/gone.py"]


def test_every_source_path_a_docstring_or_doc_names_exists():
    stale = stale_path_mentions(SOURCE_ROOT.parent)
    assert not stale, "Paths named in docstrings, comments or docs that do not exist (say what the code does " \
                      "today):\n" + "\n".join(stale)


# ----------------------------------------------------------------------------- the run is registered once
# The process-wide state's training facts: written by state.py alone (AcceleratorState's constructor and
# register_run), read everywhere else. Accelerate's own test scripts (test_utils/scripts) may set them, as its tests do.
TRAINING_FACTS = {"distributed_type", "fsdp_plugin", "megatron_lm_plugin", "deepspeed_plugins", "torch_tp_plugin",
                  "mixed_precision", "_mixed_precision", "parallelism_config", "dynamo_plugin"}
MAY_WRITE_FACTS = ("state.py", "test_utils/scripts/")


def state_fact_writes(root: Path = SOURCE_ROOT / PACKAGE) -> list:
    """``file:line: target`` for every assignment to a training fact of something named like a state
    (``self.state.fsdp_plugin = ...``, ``AcceleratorState().distributed_type = ...``) outside ``MAY_WRITE_FACTS``."""
    found = []
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(root).as_posix()
        if relative.startswith(MAY_WRITE_FACTS):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets = node.targets if isinstance(node, ast.Assign) else \
                [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
            for target in targets:
                if isinstance(target, ast.Attribute) and target.attr in TRAINING_FACTS and \
                        "state" in ast.unparse(target.value).lower():
                    found.append(f"{relative}:{node.lineno}: {ast.unparse(target)}")
    return found


def test_the_fact_scan_finds_writes_to_the_state(tmp_path):
    _write(tmp_path, {"pkg/mod.py": "def f(self, s):\n    self.state.fsdp_plugin = 1\n"
                                    "    AcceleratorState().distributed_type = 2\n    s.distributed_type = 3\n"
                                    "    self.fsdp_plugin = 4\n"})
    assert state_fact_writes(tmp_path / "pkg") == ["mod.py:2: self.state.fsdp_plugin",
                                                   "mod.py:3: AcceleratorState().distributed_type"]


def test_no_room_writes_a_training_fact_into_the_process_wide_state():
    found = state_fact_writes()
    assert not found, ("Training facts written into the process-wide state outside state.py (register the run, or "
                       "pass the value down as an argument):\n" + "\n".join(found))


# Nor is a training setting read back from it: rooms are given what they need. The state is read only by the
# facade's one creation (``AcceleratorState(...)`` with the run's settings) and, through ``AcceleratorState.current()``,
# by the free functions Accelerate defines as following the state, which have no argument to be given it.
FOLLOW_THE_STATE = ("precision/autocast.py", "strategies/deepspeed/wrappers.py", "strategies/deepspeed/strategy.py")


def state_reads(root: Path = SOURCE_ROOT / PACKAGE) -> list:
    """``file:line: expression`` for every read of the process-wide training state outside ``MAY_WRITE_FACTS``:
    ``AcceleratorState()`` (no arguments: the existing state), ``AcceleratorState._shared_state``, and
    ``AcceleratorState.current()`` outside ``FOLLOW_THE_STATE``."""
    found = []
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(root).as_posix()
        if relative.startswith(MAY_WRITE_FACTS):
            continue
        nodes = sorted((n for n in ast.walk(ast.parse(path.read_text(encoding="utf-8"))) if hasattr(n, "lineno")),
                       key=lambda n: (n.lineno, n.col_offset))
        for node in nodes:
            bare_call = isinstance(node, ast.Call) and not node.args and not node.keywords
            if bare_call and isinstance(node.func, ast.Name) and node.func.id == "AcceleratorState":
                found.append(f"{relative}:{node.lineno}: {ast.unparse(node)}")
            elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and \
                    node.value.id == "AcceleratorState" and (
                        node.attr == "_shared_state" or (node.attr == "current" and relative not in FOLLOW_THE_STATE)):
                found.append(f"{relative}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_the_read_scan_finds_reads_of_the_state(tmp_path):
    _write(tmp_path, {"pkg/mod.py": "def f():\n    AcceleratorState().mixed_precision\n"
                                    "    AcceleratorState._shared_state.get('x')\n    AcceleratorState.current()\n"
                                    "    AcceleratorState(mixed_precision='no')\n    PartialState().device\n",
                      "pkg/precision/autocast.py": "AcceleratorState.current()\n"})
    assert state_reads(tmp_path / "pkg") == ["mod.py:2: AcceleratorState()", "mod.py:3: AcceleratorState._shared_state",
                                             "mod.py:4: AcceleratorState.current"]


def test_no_room_reads_a_training_setting_back_from_the_process_wide_state():
    found = state_reads()
    assert not found, ("The process-wide training state read outside state.py (give the room the value as an "
                       "argument; PartialState's process facts are free to read):\n" + "\n".join(found))


# ----------------------------------------------------------------------------- typed signatures
# The share of public functions whose signature is fully annotated only goes up: a new public function comes typed,
# and an annotation once written stays. Raise the floor when the share rises (``python tests/test_code_structure.py``
# prints it, per room). 28.7% before issue 38; 87.6% once every room but test_utils was typed.
ANNOTATED_FLOOR = 87  # whole percent


def _public_functions(tree: ast.Module, public_only: bool = True):
    """``(qualified name, function, is a method)`` for every function of a module a user can reach: module-level
    functions and methods of public classes (nested classes too), whose name has no leading underscore or is
    ``__init__``; nested functions and private classes are skipped. With ``public_only=False``: every function."""
    def visit(body, prefix, in_class):
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if not public_only or not node.name.startswith("_") or (in_class and node.name == "__init__"):
                    yield prefix + node.name, node, in_class
                if not public_only:
                    yield from visit(node.body, f"{prefix}{node.name}.", False)
            elif isinstance(node, ast.ClassDef) and (not public_only or not node.name.startswith("_")):
                yield from visit(node.body, f"{prefix}{node.name}.", True)
            elif isinstance(node, (ast.If, ast.Try, ast.With)):  # ``if TYPE_CHECKING``, ``try: ... except`` ...
                handlers = [h for handler in getattr(node, "handlers", []) for h in handler.body]
                yield from visit(node.body + getattr(node, "orelse", []) + handlers + getattr(node, "finalbody", []),
                                 prefix, in_class)
    yield from visit(tree.body, "", False)


def _parameters(function: ast.FunctionDef, in_class: bool) -> list:
    arguments = function.args
    parameters = [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]
    parameters += [p for p in (arguments.vararg, arguments.kwarg) if p is not None]
    positional = [*arguments.posonlyargs, *arguments.args]
    decorators = {ast.unparse(d) for d in function.decorator_list}
    if in_class and positional and "staticmethod" not in decorators:
        parameters.remove(positional[0])  # self / cls
    return parameters


def annotation_census(root: Path = SOURCE_ROOT / PACKAGE,
                      public_only: bool = True) -> dict[str, tuple[int, int, list]]:
    """Folder (the first part of a module's path under ``root``; a top-level module is its own) -> ``(functions,
    fully annotated, the names of those that are not)`` over the public functions with at least one parameter besides
    self/cls (every function with ``public_only=False``). Fully annotated: every such parameter (``*args`` and
    ``**kwargs`` included) has an annotation, and so does the return, except for ``__init__``."""
    census: dict[str, tuple[int, int, list]] = {}
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(root)
        folder = relative.parts[0] if len(relative.parts) > 1 else relative.name
        total, typed, missing = census.get(folder, (0, 0, []))
        for name, function, in_class in _public_functions(ast.parse(path.read_text(encoding="utf-8")), public_only):
            parameters = _parameters(function, in_class)
            if not parameters:
                continue
            total += 1
            if all(p.annotation is not None for p in parameters) and \
                    (function.returns is not None or function.name == "__init__"):
                typed += 1
            else:
                missing.append(f"{relative.as_posix()}:{function.lineno} {name}")
        census[folder] = (total, typed, missing)
    return census


def annotated_share(census: dict) -> float:
    total = sum(entry[0] for entry in census.values())
    return 100.0 * sum(entry[1] for entry in census.values()) / total if total else 100.0


def annotation_shortfall(census: dict, floor: int) -> str | None:
    """Why ``census`` falls below ``floor`` percent of fully annotated public functions, or None when it does not."""
    share = annotated_share(census)
    if share >= floor:
        return None
    missing = [name for entry in census.values() for name in entry[2]]
    shown = "\n  ".join(missing[:40]) + (f"\n  ... and {len(missing) - 40} more" if len(missing) > 40 else "")
    return (f"{share:.1f}% of the public functions are fully annotated, below the floor of {floor}%: give every "
            "parameter and the return a type (a new public function comes typed, and no annotation is removed).\n"
            f"{annotation_report(census)}\nNot fully annotated:\n  {shown}")


def annotation_report(census: dict, what: str = "public functions") -> str:
    lines = [f"whole package: {annotated_share(census):.1f}% of "
             f"{sum(entry[0] for entry in census.values())} {what} fully annotated"]
    for folder, (total, typed, _) in sorted(census.items()):
        if total:
            lines.append(f"  {folder:<24} {100.0 * typed / total:5.1f}%  ({typed}/{total})")
    return "\n".join(lines)


def test_the_annotation_census_counts_public_signatures(tmp_path):
    _write(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/top.py": "def f(x: int) -> int: ...\n",
        "pkg/room/__init__.py": "",
        "pkg/room/mod.py": (
            "def typed(a: int, *rest: str, key: bool = False, **options: bool) -> None: ...\n"
            "def no_return(a: int): ...\n"
            "def one_bare_parameter(a, b: int) -> int: ...\n"
            "def bare_kwargs(a: int, **options) -> int: ...\n"
            "def no_parameters(): ...\n"                             # nothing to annotate but the return: not counted
            "def _private(a): ...\n"                                 # private: not counted
            "class Public:\n"
            "    def __init__(self, a: int): ...\n"                  # typed: __init__ needs no return type
            "    def method(self, a) -> None: ...\n"
            "    @staticmethod\n    def static(a: int) -> int: ...\n"  # no self to leave out
            "    @classmethod\n    def build(cls, a: int) -> 'Public': ...\n"
            "    def _hidden(self, a): ...\n"
            "class _Private:\n    def method(self, a): ...\n"
            "if True:\n    def guarded(a: int) -> int: ...\n"
            "def outer(a: int) -> None:\n    def inner(b): ...\n"),  # nested functions are no API
    })
    census = annotation_census(tmp_path / "pkg")
    total, typed, missing = census["room"]
    assert (total, typed) == (10, 6)
    assert [name.split(" ")[1] for name in missing] == ["no_return", "one_bare_parameter", "bare_kwargs", "Public.method"]
    assert census["top.py"] == (1, 1, [])
    assert annotated_share(census) == 100.0 * 7 / 11
    assert annotation_census(tmp_path / "pkg", public_only=False)["room"][:2] == (14, 6)


def test_removing_an_annotation_breaks_the_floor(tmp_path):
    _write(tmp_path, {"pkg/mod.py": "def f(a: int) -> int: ...\ndef g(b: str) -> str: ...\n"})
    assert annotation_shortfall(annotation_census(tmp_path / "pkg"), 100) is None
    _write(tmp_path, {"pkg/mod.py": "def f(a: int) -> int: ...\ndef g(b) -> str: ...\n"})  # one annotation gone
    problem = annotation_shortfall(annotation_census(tmp_path / "pkg"), 100)
    assert problem is not None and "50.0%" in problem and "mod.py:2 g" in problem
    _write(tmp_path, {"pkg/mod.py": "def f(a: int) -> int: ...\ndef g(b: str): ...\n"})  # a return type gone
    assert annotation_shortfall(annotation_census(tmp_path / "pkg"), 51) is not None
    assert annotation_shortfall(annotation_census(tmp_path / "pkg"), 50) is None


def test_the_share_of_typed_public_signatures_only_goes_up():
    problem = annotation_shortfall(annotation_census(), ANNOTATED_FLOOR)
    assert problem is None, problem


if __name__ == "__main__":  # the figures: python tests/test_code_structure.py
    print(annotation_report(annotation_census()))
    print(annotation_report(annotation_census(public_only=False), "functions (private and nested included)"))
