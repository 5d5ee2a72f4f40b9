"""`toolkit export CHECKPOINT OUT` (toolkit/commands/export.py): a checkpoint a real training wrote, exported in
each framework's own format, loads with that framework's own loader in a plain process (no toolkit import) and
gives the predictions the checkpoint's model gives on a batch; what it cannot do is one line."""
import json
import sys

import pytest

from tests.conftest import ROOT, horovod_status, one_line_error, run, toolkit

pytestmark = pytest.mark.distributed
USER = str(ROOT / "tests" / "user_code.py")

# The exported file loaded by the framework's own loader, against the checkpoint's own files read with plain
# framework code; both models predict on the same batch (BatchNorm in inference mode: its statistics count).
CHECK = {
    "torch": """
import sys, numpy as np, torch
from safetensors.torch import load_file
sys.path.insert(0, ROOT)
from tests import user_code
config = type("Config", (), {"framework": "torch"})()
exported, saved = user_code.build(config), user_code.build(config)
exported.load_state_dict(load_file(OUT), strict=True)
saved.load_state_dict(torch.load(CKPT + "/state.pt", weights_only=True)["model"], strict=True)
x = torch.from_numpy(user_code.arrays()[0][:32])
with torch.no_grad():
    a, b = exported.eval()(x).numpy(), saved.eval()(x).numpy()
""",
    "tensorflow": """
import sys, numpy as np, keras
sys.path.insert(0, ROOT)
from tests import user_code
config = type("Config", (), {"framework": "tensorflow"})()
if OUT.endswith(".keras"):
    exported = keras.saving.load_model(OUT)
else:
    exported = user_code.build(config)
    exported.load_weights(OUT)
saved = user_code.build(config)
with np.load(CKPT + "/weights.npz") as arrays:
    saved.set_weights([arrays[f"arr_{i}"] for i in range(len(arrays.files))])
x = user_code.arrays()[0][:32]
a, b = np.asarray(exported(x, training=False)), np.asarray(saved(x, training=False))
""",
    "mxnet": """
import sys, numpy as np
sys.path.insert(0, ROOT)
import toolkit.shims.toolkit_numpy_compat
import mxnet as mx
from tests import user_code
config = type("Config", (), {"framework": "mxnet"})()
exported, saved = user_code.build(config), user_code.build(config)
exported.load_parameters(OUT)
saved.load_parameters(CKPT + "/model.params")
x = mx.nd.array(user_code.arrays()[0][:32])
a, b = exported(x).asnumpy(), saved(x).asnumpy()
""",
}
REPORT = 'print(json.dumps({"max_diff": float(np.abs(a - b).max()), "spread": float(a.std())}))'


@pytest.mark.parametrize("framework, suffixes", [("torch", [".safetensors"]), ("tensorflow", [".keras", ".weights.h5"]),
                                                 ("mxnet", [".params"])])
def test_an_exported_checkpoint_loads_with_the_frameworks_own_loader_and_predicts_the_same(tmp_path, framework,
                                                                                           suffixes):
    why = horovod_status(framework)
    if why:
        pytest.skip(f"horovod.{framework} does not import ({why})")
    ckpt = tmp_path / "ckpt"
    train = toolkit("train", "--framework", framework, "--model", f"{USER}:build", "--dataset", f"{USER}:load",
                    "--epochs", "1", "--checkpoint-dir", ckpt, "--quiet", timeout=240)
    assert train.returncode == 0, train.stderr[-3000:]
    (kept,) = ckpt.glob("ckpt-*")
    for suffix in suffixes:
        out = tmp_path / f"model{suffix}"
        model = ["--model", f"{USER}:build"] if framework == "tensorflow" else []
        proc = toolkit("export", ckpt, out, *model, timeout=240)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert proc.stdout.startswith(f"toolkit: export: {out} ({framework}, model 0 of {kept}: ") and out.is_file()
        code = f"import json\nROOT, OUT, CKPT = {str(ROOT)!r}, {str(out)!r}, {str(kept)!r}\n" + CHECK[framework] + REPORT
        check = run([sys.executable, "-c", code], timeout=240)
        assert check.returncode == 0, check.stderr[-3000:]
        result = json.loads(check.stdout.strip().splitlines()[-1])
        assert result["max_diff"] == 0 and result["spread"] > 0, result
    if framework == "tensorflow":
        one_line_error(toolkit("export", ckpt, tmp_path / "m.keras", timeout=240),
                       "a Keras checkpoint holds the weights only", "--model pkg.module:build")
    one_line_error(toolkit("export", ckpt, tmp_path / "m.onnx"), "m.onnx: the suffix names the format",
                   ".safetensors")
    other = ".params" if framework != "mxnet" else ".safetensors"
    one_line_error(toolkit("export", kept, tmp_path / f"m{other}", timeout=240),
                   f"is a {framework} checkpoint", "name OUT with", *suffixes)
    one_line_error(toolkit("export", ckpt, tmp_path / f"m{suffixes[0]}", "--part", "1",
                           *(["--model", f"{USER}:build"] if framework == "tensorflow" else []), timeout=240),
                   "--part 1", "holds 1 model(s); give 0")


def test_a_bad_checkpoint_path_is_one_line(tmp_path):
    one_line_error(toolkit("export", tmp_path / "nope", tmp_path / "m.safetensors"), "no such folder")
    one_line_error(toolkit("export", tmp_path, tmp_path / "m.safetensors"), "holds no ckpt-N checkpoint")
