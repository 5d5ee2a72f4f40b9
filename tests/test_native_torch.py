"""torch's own engine (`backend: native`: torch.distributed, DDP, FSDP2, ZeRO) from the same config and API.

Real jobs under torchrun, horovodrun and mpirun; every claim that the native backend means what Horovod's
path means is checked as bit-equality of the parameters with the Horovod job of the same config.
"""
import re
import shutil
import sys

import pytest

from tests.conftest import (
    ROOT,
    assert_replicas,
    clean_env,
    one_line_error,
    run,
    run_native,
    summary,
    toolkit,
    train_job,
)
from tests.helpers import params

pytestmark = pytest.mark.distributed
DIGITS = ["--framework", "torch", "--dataset", "digits"]


def test_your_torch_trains_on_the_native_backend_under_torchrun_horovodrun_and_mpirun():
    """The issue's three launch lines of examples/your_torch.py, unchanged, with TOOLKIT_BACKEND=native:
    the same replicas everywhere (the launcher only says where each rank is)."""
    script = [sys.executable, ROOT / "examples" / "your_torch.py"]
    env = clean_env(TOOLKIT_BACKEND="native")
    launches = {"torchrun": [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                             script[1]],
                "horovodrun": ["horovodrun", "-np", "2", "-H", "localhost:2", "--gloo", "--start-timeout", "60", *script],
                "mpirun": ["mpirun", "--allow-run-as-root", "-np", "2", "-bind-to", "none", "-x", "TOOLKIT_BACKEND",
                           "-x", "PATH", *script]}
    digests = {}
    for name, argv in launches.items():
        out = summary(run_native(argv, env=env, timeout=240))
        assert out["world_size"] == 2 and len(set(out["final_digests"])) == 1, (name, out)
        assert out["accuracy"] > 0.85, (name, out)
        digests[name] = out["final_digests"][0]
    assert len(set(digests.values())) == 1, digests


def test_native_equals_horovod_and_checkpoints_cross_backends_and_sharding(tmp_path):
    """One 6-epoch training cut into jobs, each resuming the one before on another engine, sharding or checkpoint
    format: native -> horovod (writes `sharded`: rank 0 the whole state as DCP files) -> native fsdp (every rank
    reads its shards) -> native fsdp for 2 epochs (writes `sharded` in the background: every rank its own shards
    through DCP's async_save; epoch 5 trains while epoch 4's is written) -> native zero1 from epoch 4's (read
    whole on rank 0; writes `sharded` whole from rank 0's background thread) -> horovod, ends bit-identical to
    horovod's uninterrupted run (so each engine's epoch equals Horovod's, and a save in the background holds its
    step's state; built-in script, `toolkit launch --backend native`). Adam: both engines start it empty
    (Horovod's own broadcast would step it once on zero gradients). The fsdp ranks' sharded checkpoint then
    resumes on 3 ranks and on one process with the parameters `toolkit export` consolidates from it."""
    adam = DIGITS + ["--optimizer", "adam", "--lr", "0.005"]
    straight = train_job("gloo", adam + ["--epochs", "6"])
    folder = tmp_path / "ckpt"
    sharded = ["--checkpoint-format", "sharded"]
    chain = [(0, 1, "native", []), (1, 2, "gloo", sharded), (2, 3, "native", ["--sharding", "fsdp"]),
             (3, 5, "native", ["--sharding", "fsdp", *sharded, "--checkpoint-async"]),
             (4, 5, "native", ["--sharding", "zero1", *sharded, "--checkpoint-async"]), (5, 6, "gloo", [])]
    for start, epochs, launcher, extra in chain:
        if start == 4:      # resume the save made in the background while epoch 5 trained
            shutil.rmtree(folder / f"ckpt-{22 * 5:08d}")
        out = train_job(launcher, adam + ["--epochs", str(epochs), "--checkpoint-dir", folder, "--keep-checkpoints",
                                          "6", *extra] + (["--resume"] if start else []))
        assert len(set(out["final_digests"])) == 1, (epochs, out)
        if not start:       # the first epoch on native from scratch: the replicas start apart, end equal
            assert_replicas(out)
            assert "DistributedDataParallel" in out["path"] and out["backend"] == "native"
        else:
            assert out["resumed_from"] == 22 * start and out["steps_run"] == 22 * (epochs - start), (epochs, out)
        if "--sharding" in extra:
            assert {"fsdp": "FSDP2", "zero1": "ZeroRedundancyOptimizer"}[extra[1]] in out["path"], out["path"]
    assert out["param_digest"] == straight["param_digest"]
    shards = {epochs: sorted(p.name for p in (folder / f"ckpt-{22 * epochs:08d}").glob("*.distcp"))
              for epochs in (2, 4, 5)}
    assert shards == {2: ["__0_0.distcp"], 4: ["__0_0.distcp", "__1_0.distcp"], 5: ["__0_0.distcp"]}, shards
    moved = tmp_path / "moved"
    moved.mkdir()
    shutil.copytree(folder / f"ckpt-{22 * 4:08d}", moved / f"ckpt-{22 * 4:08d}")
    exported = tmp_path / "model.safetensors"       # the saved parameters, consolidated without a process group
    proc = toolkit("export", moved, exported)
    assert proc.returncode == 0, proc.stderr
    from safetensors.numpy import load_file

    from toolkit.adapters.topology import digest
    tensors = load_file(exported)
    saved = digest([tensors[name] for name in params("torch", folder)])
    again = adam + ["--epochs", "4", "--checkpoint-dir", moved, "--resume"]
    for out in (train_job("native", again, np_=3), train_job("single", again)):      # loaded: the saved ones
        assert out["steps_run"] == 0 and out["param_digest"] == saved, out


def test_uneven_data_joins_as_horovod_does_and_bf16_and_powersgd_are_ddps_hooks():
    """uneven_data: DDP's Join gives Horovod's join result bit for bit; compression bf16 and powersgd on native
    are DDP's own hooks: bf16 2 bytes a value, PowerSGD its factors after 2 dense steps; replicas identical."""
    uneven = DIGITS + ["--epochs", "2", "--uneven-data", "1:0.5"]
    native, horovod = train_job("native", uneven), train_job("gloo", uneven)
    assert native["steps_trained_per_rank"] == horovod["steps_trained_per_rank"] == [44, 22]
    assert native["param_digest"] == horovod["param_digest"] and len(set(native["final_digests"])) == 1
    bf16 = train_job("native", DIGITS + ["--epochs", "1", "--compression", "bf16"])
    assert "bf16_compress_hook" in bf16["path"] and len(set(bf16["final_digests"])) == 1
    assert bf16["bytes_sent_per_step"] == native["bytes_sent_per_step"] / 2
    assert bf16["accuracy"] > 0.5
    # PowerSGD is DDP's own hook (one gradient bucket on Gloo): 2 dense steps, then P and Q a fraction of it
    psgd = train_job("native", DIGITS + ["--epochs", "2", "--compression", "powersgd"])
    assert "powerSGD_hook" in psgd["path"] and len(set(psgd["final_digests"])) == 1
    dense, steps = native["bytes_sent_per_step"], psgd["steps"]
    assert 2 * dense / steps < psgd["bytes_sent_per_step"] < dense / 4, (psgd["bytes_sent_per_step"], dense)
    assert psgd["accuracy"] > 0.5


@pytest.mark.parametrize("args, needles", [
    (["--backend", "dataparallel"], ["backend=dataparallel", "GIL", "GPU 0", "backend: native"]),
    (["--sharding", "zero1"], ["sharding='zero1'", "backend: native"]),
    (["--backend", "native", "--sharding", "fsdp", "--precision", "fp16"], ["sharding='fsdp'", "precision: bf16"]),
    (["--backend", "native", "--sharding", "zero1", "--compression", "int8"], ["sharding='zero1'", "compression"]),
    (["--backend", "native", "--op", "adasum"], ["op='adasum'", "backend: horovod"]),
    (["--framework", "mxnet", "--checkpoint-format", "sharded"], ["checkpoint_format='sharded' is torch's",
                                                                   "keeps the single format"]),
])
def test_what_the_native_backend_cannot_do_is_one_line(args, needles):
    one_line_error(toolkit("train", "--framework", "torch", *args), *needles)


def test_a_dataparallel_module_is_refused_in_one_line(tmp_path):
    script = tmp_path / "dp.py"
    script.write_text("import torch, toolkit\nsession = toolkit.start(framework='torch', backend='native')\n"
                      "session.setup(torch.nn.DataParallel(torch.nn.Linear(4, 2)))\n")
    proc = run([sys.executable, script], timeout=120)
    last = proc.stderr.strip().splitlines()[-1]     # a user's script: Python's own traceback ends with it
    last = re.sub(r"^\[rank\d+\]: ", "", last)     # torch.distributed's excepthook tags the lines with the rank
    assert proc.returncode == 1 and last.startswith("toolkit.errors.ToolkitError: session.setup(model): a torch.nn"
                                                    ".DataParallel is refused"), proc.stderr
    assert "GIL" in last and "GPU 0" in last and "model.module" in last


def test_rendezvous_reads_every_launcher():
    from toolkit.adapters.torch import rendezvous as rv
    assert rv.place({"RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}) == \
        rv.Place(1, 4, 1, 2, "torchrun")
    assert rv.place({"HOROVOD_RANK": "3", "HOROVOD_SIZE": "4", "HOROVOD_LOCAL_RANK": "1",
                     "HOROVOD_LOCAL_SIZE": "2"}) == rv.Place(3, 4, 1, 2, "horovodrun")
    assert rv.place({"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "0",
                     "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}).launcher == "mpirun"
    assert rv.place({"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1",
                     "SLURM_NTASKS_PER_NODE": "4(x2)"}) == rv.Place(5, 8, 1, 4, "slurm")
    assert rv.place({}) == rv.Place(0, 1, 0, 1, "none")
    assert rv.first_slurm_host("node[03-05,07],gpu1") == "node03" and rv.first_slurm_host("gpu1,gpu2") == "gpu1"
    assert rv.init_method(rv.Place(1, 2, 1, 2, "slurm"), {"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "1234"}) == \
        "tcp://10.0.0.1:1234"
    assert rv.init_method(rv.Place(1, 2, 1, 2, "slurm"), {"SLURM_JOB_NODELIST": "n[7-8]"}) == "tcp://n7:29500"
    from toolkit.errors import ToolkitError
    with pytest.raises(ToolkitError, match="RANK=5 is not a rank of WORLD_SIZE=2"):
        rv.place({"RANK": "5", "WORLD_SIZE": "2"})


SHARDS = """
import json, sys, torch, toolkit
session = toolkit.start(framework="torch", backend="native", sharding=sys.argv[1], optimizer="adam", lr=0.01)
model, optimizer = session.setup(torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(4)]))
for _ in range(2):
    session.backward(model(torch.randn(8, 64)).pow(2).mean())
    session.step()
local = lambda t: t.to_local() if hasattr(t, "to_local") else t
state = getattr(optimizer, "optim", optimizer).state     # ZeroRedundancyOptimizer keeps its shard's in .optim
print(json.dumps({"rank": session.rank, "params": sum(local(p).numel() for p in model.parameters()),
                  "state": sum(local(t).numel() for s in state.values() for t in s.values() if t.dim() > 0),
                  "digests": session.check_replicas()}))
"""


@pytest.mark.parametrize("sharding", ["zero1", "fsdp"])
def test_each_rank_holds_its_share(sharding, tmp_path):
    """2 ranks, Adam, 4 x Linear(64, 64) (P = 16,640 values): zero1 keeps half of the optimizer state on a
    rank (2P in all), fsdp half of the parameters and half of the state too; the replicas still agree."""
    script = tmp_path / "shards.py"
    script.write_text(SHARDS)
    proc = run_native([sys.executable, "-m", "toolkit", "launch", "--backend", "native", "--framework", "torch", "-np",
                       "2", "--timeout", "150", "--", "python", script, sharding], timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    import json
    ranks = [json.loads(line) for line in re.sub(r"\[\d+\]<stdout>:", "", proc.stdout).splitlines() if line.startswith("{")]
    P = 4 * (64 * 64 + 64)
    assert len(ranks) == 2 and len({r["digests"][0] for r in ranks} | set(ranks[0]["digests"])) == 1, ranks
    for r in ranks:
        assert r["params"] == (P if sharding == "zero1" else P // 2), r
        assert r["state"] == P, r       # Adam's two slots of the half this rank owns


def test_toolkit_bench_times_the_native_engine(tmp_path):
    proc = toolkit("bench", "--framework", "torch", "--backend", "native", "--np", "2", "--warmup", "1", "--iters",
                   "1", "--steps-per-iter", "2", "--out", tmp_path, timeout=200)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    import json
    bench = json.loads((tmp_path / "bench.json").read_text())
    assert bench["rows"][0]["np"] == 2 and "DistributedDataParallel" in bench["rows"][0]["path"], bench["rows"]
    assert "torchrun" in bench["title"]
