"""Rank 0's MLflow run (`mlflow_tracking_uri`): one run per job, through MLflow's own client.

- Opened once, on rank 0 alone: in `mlflow_experiment` (made when missing; unset: MLflow's default
  experiment), named `mlflow_run_name`. A resumed job continues the run its checkpoint names (the run id is
  in the checkpoint's meta.json); a run id the server does not know starts a new run, said in one line.
- A new run gets the resolved config as params; a continued run keeps the params it has (MLflow refuses to
  change a param's value, and a resume may change `epochs`).
- Every `Session.log` call: its numbers as metrics at the step it names; `close(summary)`: the JSON
  summary as the run's `summary.json` and the run FINISHED. A job killed or failed leaves it RUNNING, and
  its resume continues it.

MlflowClient, not the fluent `mlflow.start_run`: a user's own script may have its own active run, which the
toolkit leaves alone. MLflow retries an unreachable server for minutes; the first request is made with 2
retries, so a wrong URI is one line within seconds; later requests get MLflow's own retries.
"""
from __future__ import annotations

import contextlib
import logging
import os
import time
from typing import Any, Iterator, Sequence

from toolkit import messages
from toolkit.errors import ToolkitError

BATCH = 100     # MLflow's most params (or metrics) in one log_batch request


@contextlib.contextmanager
def _few_retries() -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in ("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR")}
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "1")
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _said(e: Exception) -> str:
    return str(e).strip().splitlines()[0] if str(e).strip() else e.__class__.__name__


class MlflowRun:
    def __init__(self, config, run_id: str | None = None, rank: int = 0):
        from mlflow import MlflowClient
        from mlflow.entities import Param
        for name in ("mlflow", "alembic"):      # the database's migrations and "creating experiment" notes
            logging.getLogger(name).setLevel(logging.WARNING)       # after the import, which sets mlflow's

        uri = config.mlflow_tracking_uri
        try:
            self.client = MlflowClient(tracking_uri=uri)
            with _few_retries():
                if run_id and self._exists(run_id):
                    self.client.update_run(run_id, status="RUNNING")
                    self.run_id, self.resumed = run_id, True
                else:
                    if run_id:
                        messages.say(rank, f"warning: MLflow run {run_id} (the checkpoint's) is not at {uri}; a new "
                                           "run starts", config.quiet)
                    experiment = self._experiment(config.mlflow_experiment)
                    run = self.client.create_run(experiment, run_name=config.mlflow_run_name)
                    self.run_id, self.resumed = run.info.run_id, False
                    self._log_batches(params=[Param(k, str(v)[:6000]) for k, v in config.to_dict().items()])
        except Exception as e:      # MlflowException, a refused file store, a bad scheme: one line
            raise ToolkitError(f"mlflow_tracking_uri={uri!r}: {_said(e)}") from None

    def _exists(self, run_id: str) -> bool:
        from mlflow.exceptions import MlflowException
        try:
            self.client.get_run(run_id)
            return True
        except MlflowException as e:
            if e.error_code == "RESOURCE_DOES_NOT_EXIST":
                return False
            raise

    def _experiment(self, name: str | None) -> str:
        if not name:
            return "0"      # MLflow's default experiment
        found = self.client.get_experiment_by_name(name)
        return found.experiment_id if found else self.client.create_experiment(name)

    def write(self, step: int, scalars: dict[str, float]) -> None:
        from mlflow.entities import Metric
        now = int(time.time() * 1000)
        self._log_batches(metrics=[Metric(k, float(v), now, step) for k, v in scalars.items()])

    def _log_batches(self, params: Sequence = (), metrics: Sequence = ()) -> None:
        """Params and metrics in log_batch requests of at most BATCH of each."""
        for i in range(0, max(len(params), len(metrics)), BATCH):
            self.client.log_batch(self.run_id, params=params[i:i + BATCH], metrics=metrics[i:i + BATCH])

    def close(self, summary: dict[str, Any] | None = None) -> None:
        if summary is not None:
            self.client.log_dict(self.run_id, summary, "summary.json")
        self.client.set_terminated(self.run_id, "FINISHED")
