"""MLflow (`mlflow_tracking_uri`): a real `mlflow server` on 127.0.0.1 (SQLite behind it), started here and
stopped with everything it started; one run per job from rank 0, continued by a resume; TensorFlow and MXNet
ranks log to a SQLite store without a server; a server out of reach is one line."""
from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from tests.conftest import TRAIN, digits, one_line_error, run, started, summary, train_job

pytestmark = pytest.mark.distributed
mlflow = pytest.importorskip("mlflow", reason="MLflow is not installed; run `make setup` (pins.py pins it)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """`mlflow server` on a free port of 127.0.0.1, its runs in SQLite and its artifacts in a temporary folder."""
    folder = tmp_path_factory.mktemp("mlflow")
    port = _free_port()
    argv = [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", f"sqlite:///{folder / 'runs.db'}",
            "--artifacts-destination", folder / "artifacts", "--host", "127.0.0.1", "--port", port, "--workers", "1"]
    with open(folder / "server.log", "w") as log, started(argv, cwd=folder, stdout=log, stderr=subprocess.STDOUT) as job:
        uri = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 90
        while True:
            try:
                with urllib.request.urlopen(f"{uri}/health", timeout=2) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                pass
            assert job.poll() is None, (folder / "server.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "mlflow server did not answer /health in 90 s"
            time.sleep(0.5)
        yield uri


def _runs(uri: str, experiment: str):
    client = mlflow.MlflowClient(tracking_uri=uri)
    found = client.get_experiment_by_name(experiment)
    return client, (client.search_runs([found.experiment_id]) if found else [])


def test_one_run_per_job_on_a_tracking_server_its_resume_continues_it(server, tmp_path):
    """Two ranks: one run (rank 0's), named as asked, the resolved config as its params, each epoch's loss at its
    step, FINISHED with the job's summary as summary.json. The resumed job (one epoch more) continues that
    run: its params as they were, the third epoch's metrics after the first two."""
    ckpt = tmp_path / "ckpt"
    common = digits("torch") + ["--mlflow-tracking-uri", server, "--mlflow-experiment", "digits",
                                "--mlflow-run-name", "first", "--checkpoint-dir", ckpt]
    first = train_job("gloo", common + ["--epochs", "2"])
    client, runs = _runs(server, "digits")
    assert len(runs) == 1, [r.info.run_name for r in runs]
    run_ = runs[0]
    assert run_.info.run_name == "first" and run_.info.status == "FINISHED"
    params = run_.data.params
    assert params["framework"] == "torch" and params["epochs"] == "2" and params["lr"] == str(0.05), params
    assert params["mlflow_run_name"] == "first" and len(params) > 50, params
    steps = first["steps"] // 2
    loss = client.get_metric_history(run_.info.run_id, "loss")
    assert [m.step for m in loss] == [steps, 2 * steps], loss
    assert [m.step for m in client.get_metric_history(run_.info.run_id, "samples_per_sec")] == [steps, 2 * steps]
    assert abs(loss[-1].value - first["final_loss"]) < 1e-9
    assert json.loads((tmp_path / "ckpt" / f"ckpt-{2 * steps:08d}" / "meta.json").read_text())["mlflow_run_id"] \
        == run_.info.run_id

    resumed = train_job("gloo", common + ["--epochs", "3", "--resume"])
    client, runs = _runs(server, "digits")
    assert [r.info.run_id for r in runs] == [run_.info.run_id], "the resume started another run"
    assert runs[0].info.status == "FINISHED" and runs[0].data.params["epochs"] == "2"
    assert [m.step for m in client.get_metric_history(run_.info.run_id, "loss")] == [steps, 2 * steps, 3 * steps]
    kept = client.download_artifacts(run_.info.run_id, "summary.json", str(tmp_path))
    assert json.loads(open(kept).read()) == resumed


@pytest.mark.parametrize("framework", ["tensorflow", "mxnet"])
def test_tensorflow_and_mxnet_log_to_a_store_without_a_server(framework, tmp_path):
    """A SQLite store, one process: the run, its per-epoch loss and summary.json, nothing of MLflow's own
    (its database migrations, its notes) on the job's stderr."""
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    proc = run([*TRAIN, *digits(framework), "--epochs", "1", "--mlflow-tracking-uri", store], cwd=tmp_path)
    out = summary(proc)
    assert "mlflow" not in proc.stderr.lower() and "alembic" not in proc.stderr.lower(), proc.stderr[-3000:]
    client = mlflow.MlflowClient(tracking_uri=store)
    (run_,) = client.search_runs(["0"])
    assert run_.info.status == "FINISHED" and run_.data.params["framework"] == framework
    assert [m.value for m in client.get_metric_history(run_.info.run_id, "loss")] == [out["final_loss"]]
    assert [f.path for f in client.list_artifacts(run_.info.run_id)] == ["summary.json"]


def test_a_tracking_server_out_of_reach_or_a_refused_store_is_one_line(tmp_path):
    """Nothing listens at the URI: one line within seconds (MLflow alone would retry for minutes), before any
    training; MLflow's refusal of a file store: one line with its own fix; a run name without a URI: one line."""
    start = time.monotonic()
    proc = run([*TRAIN, *digits("torch"), "--epochs", "1", "--mlflow-tracking-uri", f"http://127.0.0.1:{_free_port()}"],
               timeout=120, cwd=tmp_path)
    one_line_error(proc, "mlflow_tracking_uri='http://127.0.0.1:", "Connection refused")
    assert time.monotonic() - start < 30, f"{time.monotonic() - start:.0f} s"
    assert "epoch 1/1" not in proc.stderr
    proc = run([*TRAIN, *digits("torch"), "--epochs", "1", "--mlflow-tracking-uri", f"file:{tmp_path / 'mlruns'}"],
               cwd=tmp_path)
    one_line_error(proc, "mlflow_tracking_uri='file:", "MLFLOW_ALLOW_FILE_STORE")
    proc = run([*TRAIN, *digits("torch"), "--mlflow-run-name", "x"], cwd=tmp_path)
    one_line_error(proc, "mlflow_run_name", "--mlflow-tracking-uri")


LOOP = """
import sys, torch, toolkit
store, ckpt, resume = sys.argv[1], sys.argv[2], sys.argv[3] == "resume"
s = toolkit.start(framework="torch", mlflow_tracking_uri=store, mlflow_run_name="my-loop", checkpoint_dir=ckpt,
                  quiet=True)
model, opt = s.setup(torch.nn.Linear(4, 1))
if resume:
    s.load()
x = torch.ones(8, 4)
s.backward(model(x).square().mean())
s.step()
if not resume:
    s.save()                      # before the loop's first log: the run opens here, the checkpoint keeps its id
s.log(s.global_step, {"loss": float(model(x).square().mean())})
s.close()
"""


def test_a_users_loop_that_saves_before_its_first_log_continues_its_run_on_resume(tmp_path):
    """Your own loop (`toolkit.start`, `session.save`, `session.log`, `session.close`): the checkpoint saved before
    the first log names the run, and the resumed process logs into that same run, one run in all."""
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    for mode in ("first", "resume"):
        proc = run([sys.executable, "-c", LOOP, store, tmp_path / "ckpt", mode], cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr[-3000:]
    client = mlflow.MlflowClient(tracking_uri=store)
    (run_,) = client.search_runs(["0"])
    (kept,) = (tmp_path / "ckpt").glob("ckpt-*")
    assert json.loads((kept / "meta.json").read_text())["mlflow_run_id"] == run_.info.run_id
    assert run_.info.run_name == "my-loop" and run_.info.status == "FINISHED"
    assert [m.step for m in client.get_metric_history(run_.info.run_id, "loss")] == [1, 2]
