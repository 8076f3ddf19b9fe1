"""``TensorBoardTracker`` (``log_with="tensorboard"``): scalars, text and images in TensorBoard event files.

Scalars go to ``<logging_dir>/<run_name>/``. The run's config goes where the reference puts it, so that tools reading
its runs find it: TensorBoard's hyperparameters as a sub-run ``<logging_dir>/<run_name>/<time.time()>/``, with the
config also written there as ``hparams.yml`` (readable without TensorBoard). Uses ``torch.utils.tensorboard`` (needs the ``tensorboard`` package) or ``tensorboardX``.
"""
from __future__ import annotations

import os
import time
from typing import Any, Optional, Union

from ..core import imports
from .base import GeneralTracker, on_main_process
from .packages import import_tracker_package
from .values import prepare_config, prepare_log_values

__all__ = ["TensorBoardTracker", "HPARAMS_FILE"]

HPARAMS_FILE = "hparams.yml"


def _summary_writer_class():
    try:
        import_tracker_package("tensorboard", "tensorboard")
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        try:
            from tensorboardX import SummaryWriter
        except ImportError:
            import_tracker_package("tensorboard", "tensorboard")  # raises, naming the extra
            raise
    return SummaryWriter


def _flat(config: dict, prefix: str = "") -> dict:
    """Nested config flattened to ``a/b`` keys with values TensorBoard's hparams accept."""
    flat = {}
    for key, value in config.items():
        if isinstance(value, dict):
            flat.update(_flat(value, f"{prefix}{key}/"))
        else:
            flat[f"{prefix}{key}"] = value if isinstance(value, (bool, int, float, str)) else str(value)
    return flat


class TensorBoardTracker(GeneralTracker):
    """Write TensorBoard event files to ``<logging_dir>/<run_name>``; extra keyword arguments go to
    ``SummaryWriter`` (e.g. ``flush_secs``)."""

    name = "tensorboard"
    package = "tensorboard"
    is_installed = staticmethod(imports.is_tensorboard_available)
    requires_logging_directory = True

    def __init__(self, run_name: str, logging_dir: Union[str, os.PathLike], **kwargs: Any):
        super().__init__()
        self.run_name = run_name
        self.logging_dir_param = logging_dir
        self.logging_dir = os.path.join(os.fspath(logging_dir), run_name)
        self.init_kwargs = kwargs
        self.writer = None

    @on_main_process
    def start(self) -> None:
        self.writer = _summary_writer_class()(self.logging_dir, **self.init_kwargs)

    @property
    def tracker(self) -> Any:
        return self.writer

    @on_main_process
    def store_init_configuration(self, values: dict[str, Any]) -> None:
        import yaml

        config = prepare_config(values)
        sub_run = str(time.time())  # the reference's layout: the hyperparameters are a timestamped sub-run
        self.writer.add_hparams(_flat(config), metric_dict={}, run_name=sub_run)
        self.writer.flush()
        os.makedirs(os.path.join(self.logging_dir, sub_run), exist_ok=True)
        with open(os.path.join(self.logging_dir, sub_run, HPARAMS_FILE), "w", encoding="utf-8") as file:
            yaml.safe_dump(config, file, sort_keys=True)

    @on_main_process
    def log(self, values: dict[str, Any], step: Optional[int] = None, **kwargs: Any) -> None:
        for key, value in prepare_log_values(values).items():
            if isinstance(value, str):
                self.writer.add_text(key, value, global_step=step, **kwargs)
            elif isinstance(value, dict):
                self.writer.add_scalars(key, value, global_step=step, **kwargs)
            else:
                self.writer.add_scalar(key, value, global_step=step, **kwargs)
        self.writer.flush()

    @on_main_process
    def log_images(self, values: dict[str, Any], step: Optional[int] = None, **kwargs: Any) -> None:
        """Log batches of images (``{name: array of N images}``, ``add_images``'s ``dataformats`` in kwargs)."""
        for key, images in values.items():
            self.writer.add_images(key, images, global_step=step, **kwargs)
        self.writer.flush()

    @on_main_process
    def finish(self) -> None:
        if self.writer is not None:
            self.writer.close()
