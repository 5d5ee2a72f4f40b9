"""compression: auto (toolkit/planner/auto.py): which candidates a config allows, how each one's exchange is timed,
the link probe's fit, and the pick. The real jobs (a probe on real links, one host and two namespace hosts with a
shaped link) are in tests/test_distributed_communication.py and tests/test_multihost.py."""
import time

import numpy as np
import pytest

from tests.conftest import one_line_error, toolkit
from toolkit.config import Config, ConfigError
from toolkit.exchange import hierarchy
from toolkit.exchange.wire import Link
from toolkit.planner import auto

MBIT = 1e6 / 8      # bytes/s


def _config(**kw) -> Config:
    return Config.from_dict({"framework": "torch", "compression": "auto", **kw})


def _labels(options) -> list:
    return [label for label, _ in options]


def test_candidates_are_what_the_config_allows_at_the_jobs_shape():
    """One host: the backend's own methods (none, and on GPUs Horovod's fp16; DDP's fp16 and bf16 hooks on native).
    Two hosts of two ranks: the toolkit's bf16 and int8, and the hierarchical forms (float32, bf16, int8), each
    config hierarchical_exchange true, the flat ones false; Horovod's hierarchical forms on GPUs only, unless
    hierarchical_exchange is true (on a CPU the flat ones, hierarchical_exchange false). What the rest of the
    config refuses is left out: FSDP reduces in float32 (none only), hierarchical_exchange false or true keeps one form, a strategy
    without groups of ranks has no hierarchical form."""
    assert _labels(auto.candidates(_config(), (2, 1))) == ["none"]
    assert _labels(auto.candidates(_config(), (2, 1), gpu=True)) == ["none", "fp16"]
    assert _labels(auto.candidates(_config(backend="native"), (2, 1))) == ["none", "fp16", "bf16"]
    assert _labels(auto.candidates(_config(), (1, 2))) == ["none", "bf16", "int8"]
    both = auto.candidates(_config(), (2, 2), gpu=True)
    assert _labels(both) == ["none", "fp16", "bf16", "int8", "fp32 hierarchical", "bf16 hierarchical",
                             "int8 hierarchical"]
    chosen = dict(both)
    assert chosen["int8 hierarchical"].hierarchical_exchange is True and chosen["int8"].hierarchical_exchange is False
    assert chosen["int8"].toolkit_exchange and not chosen["fp16"].toolkit_exchange
    assert chosen["fp32 hierarchical"].toolkit_exchange
    assert chosen["int8"].error_feedback is True        # the chosen config is complete (its derived defaults)
    assert _labels(auto.candidates(_config(), (2, 2), groups=False)) == ["none", "bf16", "int8"]
    cpu = auto.candidates(_config(), (2, 2))      # Horovod on a CPU: no hierarchical form, the flat ones stay flat
    assert _labels(cpu) == ["none", "bf16", "int8"]
    assert all(c.hierarchical_exchange is False for _, c in cpu)
    assert _labels(auto.candidates(_config(backend="native"), (2, 2))) == [
        "none", "fp16", "bf16", "int8", "fp32 hierarchical", "bf16 hierarchical", "int8 hierarchical"]
    assert _labels(auto.candidates(_config(hierarchical_exchange=False), (2, 2))) == ["none", "bf16", "int8"]
    assert _labels(auto.candidates(_config(hierarchical_exchange=True), (2, 2))) == _labels(
        auto.candidates(_config(hierarchical_exchange=True), (2, 2), gpu=True)) == [
        "fp32 hierarchical", "bf16 hierarchical", "int8 hierarchical"]
    fsdp = _config(backend="native", sharding="fsdp")
    assert _labels(auto.candidates(fsdp, (2, 1))) == ["none"]


def test_every_frameworks_gpu_counts_as_one():
    """Horovod's fp16 and hierarchical forms are candidates on GPUs, whichever framework names the device."""
    assert all(hierarchy.on_gpu(d) for d in ("cuda:0", "gpu:0", "gpu(1)"))
    assert not any(hierarchy.on_gpu(d) for d in ("cpu", "cpu(0)"))


class _TwoRanks:
    """A session of two ranks on two hosts, in one process, whose collectives take `bandwidth` bytes/s through
    the link (allreduce and allgather: the buffer once) and return what two identical ranks would."""
    world_size, rank, local_rank, local_size = 2, 0, 0, 1

    def __init__(self, config: Config, bandwidth: float):
        from types import SimpleNamespace
        self.config, self.bandwidth = config, bandwidth
        self.strategy = SimpleNamespace(name="horovod", groups=False)

    def _wait(self, nbytes: float) -> None:
        time.sleep(nbytes / self.bandwidth)

    def allreduce(self, array, average=True, name=None, group=None):
        self._wait(array.nbytes)
        return array

    def allgather(self, array, group=None):
        self._wait(array.nbytes)
        return np.concatenate([array, array])

    def allgather_object(self, obj, name):
        return [obj, obj]


@pytest.mark.serial      # times real compression against a simulated link: no other job beside it
def test_each_candidates_exchange_is_timed_and_a_slow_link_picks_the_fewest_bytes(monkeypatch):
    """`measure` runs each candidate's exchange as training would (Horovod's allreduce for none and fp16, the
    toolkit's exchange with its compression for bf16 and int8) on a gradient of the model's size: on a 10 MB/s
    link int8's quarter of the bytes is the cheapest and picked; on a link far faster than compressing, the
    exact method (none) is. A gradient over CAP values is timed on CAP and scaled."""
    config = _config()
    options = auto.candidates(config, (1, 2), groups=False, gpu=True)
    assert _labels(options) == ["none", "fp16", "bf16", "int8"]
    values = 250_000
    slow = auto.measure(_TwoRanks(config, 10e6), options, values, (1, 2))
    assert set(slow) == {"none", "fp16", "bf16", "int8"}
    assert slow["none"] > 4 * values / 10e6 and slow["int8"] < 0.5 * slow["none"]
    assert auto.pick(slow, {"none"})[0] == "int8"
    fast = auto.measure(_TwoRanks(config, 1e12), options, values, (1, 2))
    assert auto.pick(fast, {"none"})[0] == "none"
    monkeypatch.setattr(auto, "CAP", 1 << 20)        # a gradient over CAP values, quickly
    big = auto.measure(_TwoRanks(config, 1e8), options[:1], 4 * auto.CAP, (1, 2))
    small = auto.measure(_TwoRanks(config, 1e8), options[:1], auto.CAP, (1, 2))
    assert big["none"] == pytest.approx(4 * small["none"], rel=0.2)


class _OnceFast(_TwoRanks):
    """none's allreduce takes 60 ms but once 2 ms (its first timed round); every allgather (int8's form at two
    ranks) 20 ms: a candidate whose fastest round is not its usual one."""
    def __init__(self, config: Config):
        super().__init__(config, 1e12)
        self.reduces = 0

    def allreduce(self, array, average=True, name=None, group=None):
        self.reduces += 1
        time.sleep(0.002 if self.reduces == 2 else 0.06)
        return array

    def allgather(self, array, group=None):
        time.sleep(0.02)
        return np.concatenate([array, array])


def test_a_candidate_counts_its_median_round_not_its_fastest(monkeypatch):
    """A step pays the exchange's usual time: none, fast once in its rounds and slow in the others, loses to int8,
    steadily between the two."""
    monkeypatch.setattr(auto, "MIN_SECONDS", 0.0)      # ROUNDS timed rounds, whatever a round takes
    config = _config()
    options = [(label, c) for label, c in auto.candidates(config, (1, 2), groups=False) if label in ("none", "int8")]
    measured = auto.measure(_OnceFast(config), options, 1000, (1, 2))
    assert measured["none"] > 0.05 and 0.015 < measured["int8"] < 0.04
    assert auto.pick(measured, {"none"})[0] == "int8"


class _TwoByTwo:
    """Rank 0 of a job of 2 hosts x 2 ranks on Horovod, in one process: every rank's buffers are rank 0's; it
    records its process sets made and given back, and the candidates' collectives, in order."""
    world_size, rank, local_rank, local_size, device = 4, 0, 0, 2, "cpu"

    def __init__(self, config: Config):
        from types import SimpleNamespace
        self.config, self.events = config, []
        self.strategy = SimpleNamespace(name="horovod", groups=True, new_group=self._new_group,
                                        drop_groups=lambda: self.events.append("drop groups"))

    def _new_group(self, ranks):
        self.events.append(f"group {ranks}")
        return tuple(ranks)

    def allgather_object(self, obj, name):
        return [(r % 2, 2) for r in range(4)] if name in ("toolkit.auto.places", "toolkit.hierarchy") else [obj] * 4

    def allreduce(self, array, average=True, name=None, group=None):
        self.events.append("allreduce" if group is None else "group allreduce")
        return array

    def allgather(self, array, group=None):
        self.events.append("allgather")
        return np.concatenate([array] * 4)

    def alltoall(self, array, splits, group=None):
        self.events.append("alltoall")
        return np.concatenate([array[:splits[0]]] * 4)


def test_the_probes_groups_are_given_back_before_flat_candidates_are_timed():
    """Horovod on a CPU, 2 x 2: the link probe times allreduces inside the process sets it makes; no hierarchical
    form is a candidate there, so the sets are given back before none, bf16 and int8 are timed (Horovod negotiates
    every process set each cycle, which slows the flat methods beside them)."""
    session = _TwoByTwo(_config())
    choice = auto.choose(session, 4 * 256 * 40)
    assert set(choice.measured) == {"none", "bf16", "int8"}
    events = session.events
    assert events.index("drop groups") > max(i for i, e in enumerate(events) if e.startswith("group ["))
    assert events.index("drop groups") > max(i for i, e in enumerate(events) if e == "group allreduce")
    assert events.index("drop groups") < min(events.index(e) for e in ("allreduce", "alltoall", "allgather"))


def test_hierarchical_by_default_on_gpus_and_native_and_on_a_horovod_cpu_only_when_asked():
    """2 x 2, int8, hierarchical_exchange unset: the hierarchical exchange on GPUs (every framework's name for
    one) and on torch's native backend; Horovod on a CPU runs the flat one unless hierarchical_exchange is true
    (toolkit/exchange/hierarchy.py says why)."""
    from toolkit.exchange import arrays

    def made(device="cpu", backend="horovod", **kw):
        session = _TwoByTwo(Config.from_dict({"framework": "torch", "compression": "int8", **kw}))
        session.device, session.strategy.name = device, backend
        return hierarchy.make(session.config, session, arrays.numpy_ops(), 4 * 256 * 40)

    assert made() is None
    assert isinstance(made(hierarchical_exchange=True), hierarchy.HierarchicalExchange)
    for device in ("cuda:0", "gpu:0", "gpu(1)"):
        assert isinstance(made(device), hierarchy.HierarchicalExchange)
    assert isinstance(made(backend="native"), hierarchy.HierarchicalExchange)


def test_an_exact_method_within_five_percent_of_the_fastest_is_picked():
    assert auto.pick({"none": 1.04, "fp16": 1.0, "int8": 1.2}, {"none"})[0] == "none"
    assert auto.pick({"none": 1.4e-3, "fp16": 1.0e-3}, {"none"})[0] == "none"       # within the probe's resolution
    assert auto.pick({"none": 1.6e-3, "fp16": 1.0e-3}, {"none"})[0] == "fp16"
    assert auto.pick({"none": 1.06, "fp16": 1.0, "int8": 1.2}, {"none"})[0] == "fp16"
    assert auto.pick({"none": 2.0, "int8 hierarchical": 1.0, "fp32 hierarchical": 1.03},
                     {"none", "fp32 hierarchical"})[0] == "fp32 hierarchical"
    label, why = auto.pick({"none": 2.0, "int8": 1.0}, {"none"})
    assert why == "exchange a step: int8 1000.0 ms, none 2000.0 ms"


def test_the_link_probe_fits_latency_and_bandwidth_and_bounds_jitter():
    """A level's two allreduces give its latency (the intercept at no bytes) and bandwidth; a large message no
    slower than the small one (jitter on a fast link) gives the small one's time as latency and a bandwidth
    bounded by a 50th of the large one's time."""
    from toolkit.exchange import wire
    from toolkit.planner.calibration import Sample
    link = Link(1e-3, 100 * MBIT)        # 2 ms an allreduce of 2 ranks at no bytes
    fitted = auto._fit([Sample("allreduce", 2, b, wire.ring_allreduce(b, 2, link)) for b in auto.SIZES])
    assert fitted.bandwidth == pytest.approx(link.bandwidth) and fitted.alpha == pytest.approx(1e-3)
    jitter = auto._fit([Sample("allreduce", 2, auto.SIZES[0], 2e-3), Sample("allreduce", 2, auto.SIZES[1], 1.5e-3)])
    assert jitter.alpha == pytest.approx(1e-3)
    assert jitter.bandwidth == pytest.approx(auto.SIZES[1] / (1.5e-3 / 50))


@pytest.mark.parametrize("extra, needle", [
    (["--sync", "local_sgd"], "compression: auto chooses how every step's gradients travel"),
    (["--op", "adasum"], "compression: auto chooses among averaging methods"),
])
def test_what_rules_out_auto_is_one_line(extra, needle):
    proc = toolkit("config", "show", "--framework", "torch", "--compression", "auto", *extra)
    one_line_error(proc, needle)


def test_auto_needs_no_method_the_backend_lacks():
    """tf-keras on Horovod runs none and fp16 only: auto is accepted (it picks among those), where bf16 is refused."""
    c = Config.from_dict({"framework": "tensorflow", "keras": "tf_keras", "compression": "auto"})
    assert _labels(auto.candidates(c, (1, 2), gpu=True)) == ["none", "fp16"]
    with pytest.raises(ConfigError):
        Config.from_dict({"framework": "tensorflow", "keras": "tf_keras", "compression": "bf16"})

