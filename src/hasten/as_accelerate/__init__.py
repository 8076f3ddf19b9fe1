"""hasten answering for Accelerate: with the switch on, ``import accelerate`` anywhere in the process is hasten.

The switch is ``hasten.install_as_accelerate()`` in code, or ``HASTEN_AS_ACCELERATE=1`` in the environment, read at
interpreter start by the start-up hook the package installs (``hasten-as-accelerate.pth``) and again by
``import hasten``. Then:

- ``import accelerate.X.Y`` gives hasten's module ``hasten.X.Y`` itself (the same object); the top-level
  ``accelerate`` is a small module whose names are hasten's objects (``accelerate.Accelerator is
  hasten.Accelerator``) and whose ``__version__`` is the Accelerate API version hasten implements;
- ``importlib.metadata.version("accelerate")`` answers that version too, whether or not the real accelerate is
  installed (libraries such as transformers check it before using Accelerate).

Nothing here imports the rest of hasten until an ``accelerate`` module is asked for.
"""
from .switch import ACCELERATE_API_VERSION, install_as_accelerate, is_installed_as_accelerate, uninstall_as_accelerate

__all__ = ["ACCELERATE_API_VERSION", "install_as_accelerate", "is_installed_as_accelerate",
           "uninstall_as_accelerate"]
