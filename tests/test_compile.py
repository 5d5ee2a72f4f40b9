"""torch.compile through the toolkit (the `compile` key, and a user's torch.compile'd model handed to setup()), in
real 2-rank jobs on Horovod and on torch's native engine (DDP): replicas identical, checkpoints that hold the
plain module's state (loadable without compile), an exact resume on both engines, the first step's time and the
graph breaks said once."""
import sys

import pytest
import torch

from tests.conftest import TRAIN, assert_replicas, digits, run, summary
from tests.helpers import assert_resumed, interrupted_copy, max_diff, params, user_loop

pytestmark = pytest.mark.distributed


def _job(backend: str, *args, timeout: int = 400):
    """(the summary, rank 0's stderr lines) of examples/train.py on 2 ranks."""
    how = ["--gloo", "--start-timeout", "60"] if backend == "horovod" else ["--backend", "native", "--framework", "torch"]
    extra = ["--backend", "native"] if backend == "native" else []
    proc = run([sys.executable, "-m", "toolkit", "launch", "-np", 2, *how, "--timeout", timeout - 10, "--", *TRAIN,
                *digits("torch"), *extra, *args], timeout=timeout)
    return summary(proc), [ln for ln in proc.stderr.splitlines() if ln.startswith("[0]")]


def _plain_keys(folder) -> None:
    ckpt = sorted(p for p in folder.iterdir() if p.name.startswith("ckpt-"))[-1]
    state = torch.load(ckpt / "state.pt", weights_only=False)
    assert state["model"] and not any("_orig_mod" in k or k.startswith("module.") for k in state["model"]), \
        list(state["model"])


def test_compile_on_horovod_trains_says_its_first_step_once_and_resumes_exactly(tmp_path):
    common = ["--epochs", "2", "--compile"]
    straight, said = _job("horovod", *common, "--checkpoint-dir", tmp_path / "a")
    assert_replicas(straight)
    assert straight["accuracy"] > 0.7, straight
    first = [ln for ln in said if "compile: the first step took" in ln]
    assert len(first) == 1 and "graph break" in first[0], said
    _plain_keys(tmp_path / "a")
    cut = interrupted_copy(tmp_path / "a", tmp_path / "b")
    resumed, _ = _job("horovod", *common, "--resume", "--checkpoint-dir", tmp_path / "b")
    assert_resumed(resumed, straight, cut)
    assert max_diff(params("torch", tmp_path / "a"), params("torch", tmp_path / "b")) == 0


def test_compile_on_ddp_keeps_replicas_identical_resumes_exactly_and_its_checkpoint_loads_without_compile(tmp_path):
    common = ["--epochs", "2", "--compile"]
    compiled, said = _job("native", *common, "--checkpoint-dir", tmp_path / "a")
    assert_replicas(compiled)
    assert compiled["accuracy"] > 0.7, compiled
    first = [ln for ln in said if "compile: the first step took" in ln]
    assert len(first) == 1 and "graph break" in first[0], said
    _plain_keys(tmp_path / "a")
    _loads_into_the_plain_model(tmp_path / "a")
    cut = interrupted_copy(tmp_path / "a", tmp_path / "b")
    resumed, _ = _job("native", *common, "--resume", "--checkpoint-dir", tmp_path / "b")
    assert_resumed(resumed, compiled, cut)
    assert resumed["param_digest"] == compiled["param_digest"], (resumed, compiled)
    assert max_diff(params("torch", tmp_path / "a"), params("torch", tmp_path / "b")) == 0


def _loads_into_the_plain_model(folder) -> None:
    """The checkpoint's model state loads, strictly, into the built-in model made without compile or DDP."""
    from toolkit import config as config_module
    from toolkit.adapters.torch import models
    ckpt = sorted(p for p in folder.iterdir() if p.name.startswith("ckpt-"))[-1]
    state = torch.load(ckpt / "state.pt", weights_only=False)["model"]
    model = models.build(config_module.load({"framework": "torch", "dataset": "digits"}), 64, 10)
    model.load_state_dict(state, strict=True)
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())


@pytest.mark.parametrize("fw", ["torch", "torch-native"])
def test_a_users_compiled_model_trains_and_saves_the_plain_modules_state(fw, tmp_path):
    """session.setup(torch.compile(model)): Horovod trains the compiled module as it is; DDP wraps the plain
    module and compiles it after. Either way the checkpoint has the plain module's names."""
    out = user_loop(fw, tmp_path / "out.json", "--epochs", "1", "--compile", "--checkpoint-dir", tmp_path / "c",
                    "--save-at", "4")
    assert len(set(out["final_digests"])) == 1 and len(set(out["initial_digests"])) == 2, out
    _plain_keys(tmp_path / "c")
