"""``MLflowTracker`` (``log_with="mlflow"``): an MLflow run; numbers become metrics, the config becomes params.

Where runs are stored is MLflow's tracking URI (``MLFLOW_TRACKING_URI``). When it is not set and the Accelerator has
a logging directory, hasten stores them in a local SQLite database, ``<logging_dir>/mlflow.db``, and artifacts in
``<logging_dir>/artifacts``. The ``MLFLOW_*``
environment variables that Accelerate reads (experiment name, run id, tags, nested run) win over the arguments.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Optional, Union

from ..config.booleans import parse_bool
from ..core import imports
from .base import GeneralTracker, on_main_process
from .packages import import_tracker_package
from .values import prepare_config, prepare_log_values

__all__ = ["MLflowTracker"]


class MLflowTracker(GeneralTracker):
    """An MLflow run in experiment ``experiment_name`` (created with ``logging_dir`` as its artifact location)."""

    name = "mlflow"
    package = "mlflow"
    is_installed = staticmethod(imports.is_mlflow_available)
    requires_logging_directory = False

    def __init__(self, experiment_name: Optional[str] = None, logging_dir: Optional[Union[str, os.PathLike]] = None,
                 run_id: Optional[str] = None, tags: Optional[Union[dict[str, Any], str]] = None,
                 nested_run: Optional[bool] = False, run_name: Optional[str] = None,
                 description: Optional[str] = None):
        super().__init__()
        tags = os.environ.get("MLFLOW_TAGS", tags)
        nested_run = os.environ.get("MLFLOW_NESTED_RUN", nested_run)
        self.experiment_name = os.environ.get("MLFLOW_EXPERIMENT_NAME", experiment_name)
        self.logging_dir = os.fspath(logging_dir) if logging_dir is not None else None
        self.run_id = os.environ.get("MLFLOW_RUN_ID", run_id)
        self.tags = json.loads(tags) if isinstance(tags, str) else tags
        self.nested_run = parse_bool(nested_run, "MLFLOW_NESTED_RUN") if isinstance(nested_run, str) else nested_run
        self.run_name = run_name
        self.description = description
        self.active_run = None

    def _use_logging_dir(self, logging_dir: str) -> None:
        if self.logging_dir is None:
            self.logging_dir = logging_dir

    @on_main_process
    def start(self) -> None:
        mlflow = import_tracker_package("mlflow", self.name)
        if self.logging_dir is not None and not os.environ.get("MLFLOW_TRACKING_URI"):
            os.makedirs(self.logging_dir, exist_ok=True)
            mlflow.set_tracking_uri(f"sqlite:///{Path(self.logging_dir, 'mlflow.db').absolute()}")
        found = mlflow.search_experiments(filter_string=f"name = '{self.experiment_name}'")
        if found:
            experiment_id = found[0].experiment_id
        else:
            artifacts = Path(self.logging_dir, "artifacts").absolute().as_uri() if self.logging_dir else None
            experiment_id = mlflow.create_experiment(self.experiment_name, artifact_location=artifacts, tags=self.tags)
        self.active_run = mlflow.start_run(run_id=self.run_id, experiment_id=experiment_id, run_name=self.run_name,
                                           nested=self.nested_run, tags=self.tags, description=self.description)

    @property
    def tracker(self) -> Any:
        return self.active_run

    @on_main_process
    def store_init_configuration(self, values: dict[str, Any]) -> None:
        """Log the config as params, in batches MLflow accepts; values longer than MLflow allows are left out."""
        mlflow = import_tracker_package("mlflow", self.name)
        limits = mlflow.utils.validation
        params = [(key, value) for key, value in prepare_config(values).items()
                  if len(str(value)) <= limits.MAX_PARAM_VAL_LENGTH]
        for start in range(0, len(params), limits.MAX_PARAMS_TAGS_PER_BATCH):
            mlflow.log_params(dict(params[start:start + limits.MAX_PARAMS_TAGS_PER_BATCH]))

    @on_main_process
    def log(self, values: dict[str, Any], step: Optional[int] = None, **kwargs: Any) -> None:
        """Log the numbers as metrics (``a/b`` for a dict's entries); MLflow metrics cannot be strings: they become
        tags."""
        mlflow = import_tracker_package("mlflow", self.name)
        metrics, texts = {}, {}
        for key, value in prepare_log_values(values).items():
            if isinstance(value, str):
                texts[key] = value
            elif isinstance(value, dict):
                metrics.update({f"{key}/{sub}": inner for sub, inner in value.items() if not isinstance(inner, str)})
            else:
                metrics[key] = value
        if metrics:
            mlflow.log_metrics(metrics, step=step, **kwargs)
        if texts:
            mlflow.set_tags(texts)

    @on_main_process
    def log_figure(self, figure: Any, artifact_file: str, **save_kwargs: Any) -> None:
        import_tracker_package("mlflow", self.name).log_figure(figure=figure, artifact_file=artifact_file,
                                                                **save_kwargs)

    @on_main_process
    def log_artifacts(self, local_dir: str, artifact_path: Optional[str] = None) -> None:
        import_tracker_package("mlflow", self.name).log_artifacts(local_dir=local_dir, artifact_path=artifact_path)

    @on_main_process
    def log_artifact(self, local_path: str, artifact_path: Optional[str] = None) -> None:
        import_tracker_package("mlflow", self.name).log_artifact(local_path=local_path, artifact_path=artifact_path)

    @on_main_process
    def finish(self) -> None:
        if self.active_run is not None:
            import_tracker_package("mlflow", self.name).end_run()
