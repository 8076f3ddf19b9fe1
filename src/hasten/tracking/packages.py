"""Lazy imports of the trackers' third-party packages, with an error that says how to install a missing one."""
from __future__ import annotations

import importlib

__all__ = ["TRACKERS_EXTRA", "import_tracker_package"]

#: pip distributions the ``trackers`` extra installs (keep in step with pyproject.toml's ``trackers = [...]``).
TRACKERS_EXTRA = ("tensorboard", "wandb", "mlflow", "trackio", "aim", "comet_ml", "clearml", "dvclive", "swanlab")


def import_tracker_package(module: str, tracker: str, distribution: str | None = None):
    """Import ``module`` for the ``tracker`` tracker, or raise ImportError naming the pip command that installs it.

    Imports happen when a tracker starts, never when hasten is imported: the packages are heavy and optional.
    """
    distribution = distribution or module.split(".")[0]
    try:
        return importlib.import_module(module)
    except ImportError as error:
        how = f"pip install 'hasten[trackers]' (or pip install {distribution})" if distribution in TRACKERS_EXTRA \
            else f"pip install {distribution}"
        raise ImportError(f"The {tracker!r} tracker needs the `{distribution}` package, which is not installed "
                          f"({error}): {how}") from error
