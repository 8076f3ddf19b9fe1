"""The import finder that answers every ``accelerate`` / ``accelerate.X.Y`` import with hasten's module, and the
distribution metadata that says which Accelerate version hasten stands for."""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.metadata
import importlib.util
import sys
import types
from pathlib import Path

from .logger_names import alias_logger_names, unalias_logger_names

__all__ = ["ACCELERATE_API_VERSION", "install_as_accelerate", "is_installed_as_accelerate", "uninstall_as_accelerate"]

#: The Accelerate release whose API hasten implements: what ``accelerate.__version__`` and the metadata answer.
ACCELERATE_API_VERSION = "1.15.0"

_ALIAS = "accelerate"
_HOME = "hasten"


#: Accelerate's modules that hasten keeps under its own name (the console script ``accelerate`` imports
#: ``accelerate.commands.accelerate_cli``).
_RENAMED = {".commands.accelerate_cli": ".commands.hasten_cli"}


def _home_name(fullname: str) -> str:
    tail = fullname[len(_ALIAS):]
    return _HOME + _RENAMED.get(tail, tail)


def _top_module() -> types.ModuleType:
    """The top-level ``accelerate``: hasten's public names (lazily), submodules through the alias, and the API
    version as ``__version__``."""
    hasten = importlib.import_module(_HOME)
    module = types.ModuleType(_ALIAS, "hasten, answering for Accelerate (HASTEN_AS_ACCELERATE / "
                                      "hasten.install_as_accelerate()).")
    module.__version__ = ACCELERATE_API_VERSION
    module.__file__ = hasten.__file__
    module.__path__ = []  # submodules come from the alias finder, never from a folder
    module.__all__ = list(hasten.__all__)

    def __getattr__(name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        try:
            return getattr(hasten, name)
        except AttributeError:
            if importlib.util.find_spec(f"{_HOME}.{name}") is None:
                raise AttributeError(f"module {_ALIAS!r} has no attribute {name!r}") from None
        return importlib.import_module(f"{_ALIAS}.{name}")

    def __dir__():
        return sorted(set(dir(hasten)) | set(module.__dict__))

    module.__getattr__ = __getattr__
    module.__dir__ = __dir__
    return module


class _AccelerateDistribution(importlib.metadata.Distribution):
    """The installed-distribution record of ``accelerate`` while hasten answers for it."""

    _FILES = {
        # the fields clients read: sentence-transformers checks that the Home-page is Hugging Face's project,
        # whose API this is
        "METADATA": (f"Metadata-Version: 2.1\nName: accelerate\nVersion: {ACCELERATE_API_VERSION}\n"
                     "Summary: hasten answering for Accelerate (HASTEN_AS_ACCELERATE)\n"
                     "Home-page: https://github.com/huggingface/accelerate\nLicense: Apache-2.0\n"
                     "Requires-Python: >=3.10\n"),
        "top_level.txt": "accelerate\n",
        "INSTALLER": "hasten\n",
    }

    def read_text(self, filename):
        return self._FILES.get(filename)

    def locate_file(self, path):
        return Path(importlib.util.find_spec(_HOME).origin).parent.parent / path


class _AccelerateAlias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """First on ``sys.meta_path``: ``accelerate[.X]`` is found as hasten's ``hasten[.X]``, and its distribution is
    hasten's record of the API version."""

    def __init__(self):
        self._home_specs: dict[str, importlib.machinery.ModuleSpec] = {}  # alias name -> hasten's spec, while loading

    def find_spec(self, fullname, path=None, target=None):
        if fullname != _ALIAS and not fullname.startswith(_ALIAS + "."):
            return None
        home = importlib.util.find_spec(_home_name(fullname))
        if home is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, self, origin=home.origin,
                                              is_package=home.submodule_search_locations is not None)

    def create_module(self, spec):
        if spec.name == _ALIAS:
            return _top_module()
        module = importlib.import_module(_home_name(spec.name))  # the same object: accelerate.X is hasten.X
        self._home_specs[spec.name] = module.__spec__
        return module

    def exec_module(self, module):
        """Nothing to run: the module is hasten's, already imported. Python's import machinery has just set the
        module's ``__spec__`` to the alias's; hasten's own spec is put back, so that the module's relative imports
        (``__package__`` against ``__spec__.parent``) and ``importlib.reload`` keep naming ``hasten.X``."""
        home_spec = self._home_specs.pop(module.__spec__.name, None)
        if home_spec is not None:
            module.__spec__ = home_spec

    def find_distributions(self, context=importlib.metadata.DistributionFinder.Context()):
        name = context.name
        if name is None or name.replace("-", "_").replace(".", "_").lower() == _ALIAS:
            yield _AccelerateDistribution()


_FINDER = _AccelerateAlias()


def is_installed_as_accelerate() -> bool:
    """Whether ``import accelerate`` answers with hasten in this process."""
    return any(isinstance(finder, _AccelerateAlias) for finder in sys.meta_path)


def install_as_accelerate() -> None:
    """Make every ``accelerate`` / ``accelerate.X.Y`` import in this process hasten's module at the same path, and
    ``importlib.metadata.version("accelerate")`` the Accelerate version hasten implements (``ACCELERATE_API_VERSION``).

    Call it before anything imports accelerate (or set ``HASTEN_AS_ACCELERATE=1`` before Python starts, which works
    for every process: ``python``, ``torchrun``, ``hasten launch``'s workers, notebook kernels). Calling it again
    does nothing. If the real accelerate was already imported, raises ``RuntimeError`` and changes nothing: two
    libraries would then each hold half of the run's state.
    """
    if is_installed_as_accelerate():
        return
    already = [name for name in sys.modules if name == _ALIAS or name.startswith(_ALIAS + ".")]
    if already:
        raise RuntimeError(
            f"The real accelerate is already imported in this process ({', '.join(sorted(already)[:3])}"
            f"{' ...' if len(already) > 3 else ''}), so hasten cannot answer for it any more. Set "
            "HASTEN_AS_ACCELERATE=1 in the environment before Python starts (for example `HASTEN_AS_ACCELERATE=1 "
            "python train.py`, or `hasten launch --as_accelerate`), or call hasten.install_as_accelerate() before "
            "anything imports accelerate.")
    sys.meta_path[:] = [finder for finder in sys.meta_path if type(finder).__name__ != "Refusal"]  # a fixed variable
    sys.meta_path.insert(0, _FINDER)
    importlib.invalidate_caches()
    alias_logger_names()


def uninstall_as_accelerate() -> None:
    """Undo ``install_as_accelerate`` (tests): the alias modules are forgotten, later imports find the real
    accelerate if it is installed."""
    sys.meta_path[:] = [finder for finder in sys.meta_path if not isinstance(finder, _AccelerateAlias)]
    for name in [name for name in sys.modules if name == _ALIAS or name.startswith(_ALIAS + ".")]:
        del sys.modules[name]
    importlib.invalidate_caches()
    unalias_logger_names()
