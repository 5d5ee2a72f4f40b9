"""Config precedence and validation (no framework, no MPI)."""
import dataclasses
import re

import pytest

from toolkit import config
from toolkit.config import Config, Optimizer, Sync
from toolkit.errors import ToolkitError


def write(tmp_path, text, name="cfg.yaml"):
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def test_defaults_are_valid():
    c = config.resolve({}, environ={})
    assert c == Config()
    assert c.framework == "torch" and c.accumulation_steps == 1


def test_precedence_yaml_then_env_then_flags(tmp_path):
    path = write(tmp_path, "lr: 0.2\nepochs: 7\nbatch_size: 16\noptimizer: adam\n")
    env = {"TOOLKIT_EPOCHS": "9", "TOOLKIT_BATCH_SIZE": "8"}
    c = config.resolve({"config": path, "batch_size": "4"}, environ=env)
    assert c.lr == 0.2               # YAML beats the default
    assert c.epochs == 9             # environment beats YAML
    assert c.batch_size == 4         # flag beats environment
    assert c.optimizer is Optimizer.ADAM
    assert c.momentum == Config().momentum   # untouched keys keep the default


def test_every_field_is_a_flag():
    import argparse
    parser = argparse.ArgumentParser()
    config.add_arguments(parser)
    args = parser.parse_args(["--accumulation-steps", "4", "--no-resume", "--fusion-threshold-mb", "32"])
    assert vars(args) == {"accumulation_steps": "4", "resume": False, "fusion_threshold_mb": "32"}
    c = config.resolve(args, environ={})
    assert c.accumulation_steps == 4 and c.fusion_threshold_mb == 32.0
    empty = parser.parse_args([])
    assert vars(empty) == {}, "unset flags must not override lower sources"


def test_yaml_types_and_scientific_notation(tmp_path):
    # PyYAML reads `1e-3` as a string (YAML 1.1); it must still work as a float.
    c = config.resolve({"config": write(tmp_path, "lr: 1e-3\nresume: false\ncheckpoint_dir: null\n")}, environ={})
    assert c.lr == 0.001 and c.resume is False and c.checkpoint_dir is None


@pytest.mark.parametrize("values", [{"lr": "0.3", "compression": "fp16", "checkpoint_dir": "x"},
                                    {"compression": "topk", "sync": "local_sgd", "sync_warmup_steps": "5"}])
def test_roundtrip_through_yaml(tmp_path, values):
    c = config.resolve(values, environ={})
    again = config.resolve({"config": write(tmp_path, c.to_yaml())}, environ={})
    assert again == c


BAD_VALUES = [
    ({"lr": "abc"}, ["lr='abc'", "--lr", "must be a number"]),
    ({"batch_size": "0"}, ["batch_size=0", "positive integer", "--batch-size"]),
    ({"batch_size": "-4"}, ["batch_size=-4"]),
    ({"epochs": "0"}, ["epochs=0"]),
    ({"accumulation_steps": "0"}, ["accumulation_steps=0"]),
    ({"lr": "0"}, ["lr=0.0", "> 0"]),
    ({"lr": "-0.1"}, ["lr=-0.1"]),
    ({"batch_size": "2.5"}, ["batch_size='2.5'", "integer"]),
    ({"framework": "jax"}, ["framework='jax'", "not found. Available: torch, tensorflow, mxnet"]),
    ({"framework": "mxnet", "op": "adasum"}, ["op='adasum'", "framework='mxnet'", "no Adasum", "average or sum"]),
    ({"optimizer": "rmsprop"}, ["optimizer='rmsprop'", "sgd, adam"]),
    ({"compression": "zip"}, ["compression='zip'", "none, fp16, bf16, int8, topk"]),
    ({"resume": "maybe"}, ["resume='maybe'", "true or false"]),
    ({"resume": "true"}, ["checkpoint_dir", "--checkpoint-dir"]),
    ({"framework": "mxnet", "backend": "native"}, ["backend='native'", "framework='mxnet'"]),
    ({"backend": "native", "sync": "ssp"}, ["sync='ssp'", "backend: horovod"]),
    ({"backend": "native", "elastic_min_np": "2"}, ["torchrun restarts the workers", "--min-np"]),
    ({"backend": "horovod", "sharding": "fsdp"}, ["sharding='fsdp'", "backend: native"]),
    ({"momentum": "1.5"}, ["momentum=1.5"]),
    # TensorFlow paths
    ({"framework": "tensorflow", "strategy": "mirrored"}, ["strategy='mirrored'", "--backend native"]),
    ({"framework": "tensorflow", "backend": "native", "strategy": "parameter_server"},
     ["strategy='parameter_server'", "mirrored, multi_worker_mirrored"]),
    ({"framework": "tensorflow", "backend": "native", "compression": "fp16"},
     ["compression='fp16'", "backend='native'", "backend: horovod", "compression: none"]),
    ({"framework": "tensorflow", "backend": "native", "op": "adasum"}, ["op='adasum'", "average or sum"]),
    ({"framework": "torch", "keras": "tf_keras"}, ["keras='tf_keras'", "tensorflow only"]),
    ({"framework": "tensorflow", "backend": "native", "keras": "tf_keras"}, ["keras='tf_keras'", "backend: horovod"]),
    ({"framework": "tensorflow", "num_devices": "2"}, ["num_devices", "strategy: mirrored", "-np"]),
    ({"framework": "tensorflow", "backend": "native", "strategy": "multi_worker_mirrored", "num_devices": "2"},
     ["num_devices", "-np"]),
    ({"framework": "tensorflow", "backend": "native", "num_devices": "0"}, ["num_devices=0", "--num-devices"]),
    ({"stall_check_seconds": "-1"}, ["stall_check_seconds=-1.0", ">= 0", "--stall-check-seconds"]),
    ({"fusion_threshold_mb": "-1"}, ["fusion_threshold_mb=-1.0", "0 turns fusion off"]),
    ({"cycle_time_ms": "0"}, ["cycle_time_ms=0.0", "must be > 0"]),
    ({"framework": "tensorflow", "backend": "native", "timeline_file": "t.json"},
     ["timeline_file is a Horovod setting", "backend=native", "--backend horovod"]),
    # communication (issue 5)
    ({"compression": "topk", "topk_ratio": "0"}, ["topk_ratio=0.0", "(0, 1]", "--topk-ratio 0.01"]),
    ({"compression": "topk", "topk_ratio": "1.5"}, ["topk_ratio=1.5", "(0, 1]"]),
    ({"compression": "topk", "topk_ratio": "-0.1"}, ["topk_ratio=-0.1"]),
    ({"topk_ratio": "0.01"}, ["topk_ratio applies to compression: topk", "--compression topk"]),
    ({"compression": "fp16", "error_feedback": "true"}, ["error_feedback", "bf16, int8, topk or powersgd", "'fp16'"]),
    ({"error_feedback": "true"}, ["error_feedback", "compression='none'"]),
    ({"sync": "local_sgd", "local_steps": "0"}, ["local_steps=0", "positive integer", "--local-steps"]),
    ({"sync": "sometimes"}, ["sync='sometimes'", "every_step, local_sgd"]),
    ({"local_steps": "4"}, ["local_steps applies to sync: local_sgd", "--sync local_sgd"]),
    ({"sync_warmup_steps": "10"}, ["sync_warmup_steps applies to sync: local_sgd"]),
    ({"sync": "local_sgd", "sync_warmup_steps": "-1"}, ["sync_warmup_steps=-1", ">= 0"]),
    ({"sync": "local_sgd", "compression": "fp16"}, ["compression=fp16", "local_sgd", "bf16, int8, topk or none"]),
    ({"sync": "local_sgd", "op": "sum"}, ["op='sum'", "op: average"]),
    ({"op": "adasum", "compression": "int8"}, ["op=adasum", "compression='int8'", "op: average"]),
    ({"framework": "tensorflow", "backend": "native", "compression": "topk"},
     ["compression='topk'", "backend='native'", "compression: none"]),
    ({"framework": "tensorflow", "backend": "native", "sync": "local_sgd"}, ["sync='local_sgd'", "every_step"]),
    ({"framework": "tensorflow", "keras": "tf_keras", "compression": "int8"},
     ["compression='int8'", "keras='tf_keras'", "keras: keras3", "none or fp16"]),
    ({"elastic_min_np": "0"}, ["elastic_min_np=0", "positive integer"]),
    ({"elastic_min_np": "3", "elastic_max_np": "2"}, ["elastic_max_np=2", "below elastic_min_np=3"]),
    ({"elastic_min_np": "1", "compression": "topk"}, ["elastic", "compression='topk'", "compression none or fp16"]),
    ({"elastic_min_np": "1", "framework": "mxnet"}, ["elastic", "framework='mxnet'", "horovod.mxnet.elastic"]),
    ({"elastic_min_np": "1", "framework": "tensorflow", "keras": "tf_keras"}, ["elastic", "keras: keras3"]),
    ({"elastic_min_np": "1", "framework": "tensorflow", "backend": "native"}, ["elastic", "backend=native"]),
    ({"sync": "ssp", "staleness": "-1"}, ["staleness=-1", ">= 0", "--staleness"]),
    ({"sync": "async_ps", "staleness": "2"}, ["staleness bounds sync: ssp", "--sync ssp"]),
    ({"sync": "async_ps", "ps_servers": "0"}, ["ps_servers=0", "needs a server rank"]),
    ({"staleness": "2"}, ["staleness applies to sync: ssp or async_ps", "--sync ssp"]),
    ({"ps_servers": "2"}, ["ps_servers applies to sync: ssp or async_ps"]),
    ({"staleness_lr_damping": "true"}, ["staleness_lr_damping applies to sync: ssp or async_ps"]),
    ({"sync": "ssp", "compression": "int8"}, ["compression='int8'", "sync=ssp", "compression: none"]),
    ({"sync": "ssp", "op": "sum"}, ["op='sum'", "sync=ssp", "op: average"]),
    ({"sync": "ssp", "framework": "tensorflow", "keras": "tf_keras"}, ["sync='ssp'", "keras: keras3"]),
    ({"sync": "ssp", "elastic_min_np": "1"}, ["elastic", "sync='ssp'"]),
    ({"uneven_data": "1:1.5"}, ["uneven_data='1:1.5'", "RANK:FRACTION", "[0, 1]"]),
    ({"uneven_data": "1:0.5", "framework": "mxnet"}, ["uneven_data", "framework='mxnet'", "sync ssp"]),
    ({"uneven_data": "1:0.5", "compression": "topk"}, ["uneven_data", "join", "compression bf16/int8/topk/powersgd"]),
    ({"powersgd_rank": "2"}, ["powersgd_rank applies to compression: powersgd", "--compression powersgd"]),
    ({"compression": "powersgd", "powersgd_rank": "0"}, ["powersgd_rank", "positive integer"]),
    ({"dgc": "true"}, ["dgc applies to compression: topk"]),
    ({"powersgd_warmup_steps": "10"}, ["powersgd_warmup_steps applies to compression: powersgd"]),
    ({"dgc": "true", "compression": "topk", "optimizer": "adam"}, ["dgc", "optimizer: sgd"]),
    ({"dgc": "true", "compression": "topk", "error_feedback": "false"}, ["dgc", "error_feedback: false"]),
    ({"dgc_warmup_epochs": "2", "compression": "topk"}, ["dgc_warmup_epochs applies with dgc: true"]),
    ({"straggler": "1"}, ["straggler='1'", "RANK:MS"]),
    ({"straggler": "1:-5"}, ["straggler='1:-5'", "MS >= 0"]),
    ({"straggler": "x:5"}, ["straggler='x:5'"]),
    # the learning-rate schedule (issue 33)
    ({"lr_schedule": "linear"}, ["lr_schedule='linear'", "constant, cosine, step"]),
    ({"lr_step_epochs": "2"}, ["lr_step_epochs applies to lr_schedule: step", "--lr-schedule step"]),
    ({"lr_schedule": "cosine", "lr_step_gamma": "0.5"}, ["lr_step_gamma applies to lr_schedule: step"]),
    ({"lr_schedule": "step", "lr_step_epochs": "0"}, ["lr_step_epochs=0.0", "> 0", "--lr-step-epochs"]),
    ({"lr_schedule": "step", "lr_step_gamma": "0"}, ["lr_step_gamma=0.0", "(0, 1]"]),
    ({"lr_schedule": "step", "lr_step_gamma": "1.5"}, ["lr_step_gamma=1.5", "(0, 1]"]),
]


@pytest.mark.parametrize("values, needles", BAD_VALUES)
def test_bad_values_name_the_field(values, needles):
    with pytest.raises(ToolkitError) as e:
        config.resolve(values, environ={})
    message = str(e.value)
    assert "\n" not in message
    for needle in needles:
        assert needle in message


@pytest.mark.parametrize("text, needles", [
    ("lr: [1, 2\n", ["invalid YAML", "line"]),
    ("", ["empty"]),
    ("# only a comment\n", ["no keys"]),
    ("- a\n- b\n", ["key: value"]),
    ("batchsize: 3\n", ["unknown key 'batchsize'", "did you mean 'batch_size'"]),
    ("lr: abc\n", ["lr='abc'", "must be a number"]),
    ("elastic: 2\n", ["`elastic` is a group of keys", "min_np"]),
    ("elastic: {min_nps: 2}\n", ["unknown key elastic.min_nps", "did you mean 'min_np'"]),
])
def test_bad_yaml(tmp_path, text, needles):
    path = write(tmp_path, text)
    with pytest.raises(ToolkitError) as e:
        config.resolve({"config": path}, environ={})
    for needle in needles:
        assert needle in str(e.value)
    assert path in str(e.value)


def test_communication_defaults_follow_the_method():
    topk = config.resolve({"compression": "topk"}, environ={})
    assert topk.topk_ratio == 0.01 and topk.error_feedback is True and topk.toolkit_exchange
    assert config.resolve({"compression": "int8", "error_feedback": "false"}, environ={}).error_feedback is False
    plain = config.resolve({"compression": "fp16"}, environ={})
    assert plain.topk_ratio is None and plain.error_feedback is None and not plain.toolkit_exchange
    local = config.resolve({"sync": "local_sgd"}, environ={})
    assert local.local_steps == 4 and local.toolkit_exchange and local.compression.value == "none"
    assert config.resolve({"sync": "local_sgd", "local_steps": "1"}, environ={}).local_steps == 1


def test_missing_file(tmp_path):
    with pytest.raises(ToolkitError, match="file not found"):
        config.resolve({"config": str(tmp_path / "nope.yaml")}, environ={})


def test_unknown_environment_variable():
    with pytest.raises(ToolkitError, match="TOOLKIT_BATCHSIZE; did you mean TOOLKIT_BATCH_SIZE"):
        config.resolve({}, environ={"TOOLKIT_BATCHSIZE": "3"})
    # reserved names are not config fields and are left alone
    assert config.resolve({}, environ={"TOOLKIT_CACHE_DIR": "/tmp/x"}) == Config()


def test_env_value_error_names_the_variable():
    with pytest.raises(ToolkitError, match="from TOOLKIT_LR"):
        config.resolve({}, environ={"TOOLKIT_LR": "fast"})


def _error(**resolve) -> str:
    with pytest.raises(ToolkitError) as e:
        config.resolve(**resolve)
    assert "\n" not in str(e.value)
    return str(e.value)


def test_a_range_error_names_the_flag_variable_or_yaml_file_and_key_it_came_from(tmp_path):
    """Issue 33: `TOOLKIT_LR=-1` said `lr=-1.0 must be > 0; e.g. --lr 0.05`, naming neither the
    variable nor, for YAML, the file."""
    assert _error(args={}, environ={"TOOLKIT_LR": "-1"}).endswith("(lr from TOOLKIT_LR)")
    assert _error(args={"lr": "-1"}, environ={}).endswith("(lr from --lr)")
    path = write(tmp_path, "lr: -1\n")
    assert _error(args={"config": path}, environ={}).endswith(f"(lr from {path}, key lr)")
    path = write(tmp_path, "elastic: {min_np: 0}\n", name="el.yaml")
    assert f"(elastic_min_np from {path}, key elastic.min_np)" in _error(args={"config": path}, environ={})
    # the highest source is the one named: the flag beats the file's value
    assert _error(args={"config": write(tmp_path, "lr: 0.1\n", name="ok.yaml"), "lr": "0"},
                  environ={}).endswith("(lr from --lr)")
    with pytest.raises(ToolkitError, match=r"\(lr from start\(\)\)$"):
        config.load({"lr": -1})
    with pytest.raises(ToolkitError, match=r"\(lr from start\(\)\)$"):
        config.load(Config(), lr=-1)
    with pytest.raises(ToolkitError, match=r"\(lr from start\(\)\)$"):     # toolkit.start(lr=-1)'s keywords
        config.load(None, lr=-1)
    with pytest.raises(ToolkitError) as e:      # built directly: no source to name, the message alone
        Config(lr=-1)
    assert str(e.value) == "lr=-1 must be > 0; e.g. --lr 0.05 or `lr: 0.05` in YAML"


def test_a_cross_key_error_names_the_source_of_each_key_set(tmp_path):
    path = write(tmp_path, "compression: fp16\n")
    message = _error(args={"config": path, "topk_ratio": "0.5"}, environ={})
    assert message.startswith("topk_ratio applies to compression: topk (got compression='fp16')")
    assert message.endswith(f"(topk_ratio from --topk-ratio; compression from {path}, key compression)")
    # a key at its default is not named (it came from nowhere)
    assert _error(args={}, environ={"TOOLKIT_TOPK_RATIO": "0.5"}).endswith("(topk_ratio from TOOLKIT_TOPK_RATIO)")
    # TensorFlow's own switch for legacy Keras is named when it chose keras
    message = _error(args={"framework": "tensorflow", "compression": "int8"}, environ={"TF_USE_LEGACY_KERAS": "1"})
    assert "keras from TF_USE_LEGACY_KERAS=1" in message and "compression from --compression" in message


@pytest.mark.parametrize("values, needles", BAD_VALUES)
def test_every_rule_error_names_where_its_values_came_from(tmp_path, values, needles):
    """Every bad config of the table above (types, choices, ranges, keys across groups, what a
    framework implements), its keys given as TOOLKIT_* variables and then as a YAML file: the one line
    still says what is wrong, and names a variable / the file and key of a value it is about."""
    env = {f"TOOLKIT_{k.upper()}": v for k, v in values.items()}
    message = _error(args={}, environ=env)
    assert all(needle in message for needle in needles), message
    named = re.findall(r"(\w+) from (TOOLKIT_\w+)", message)
    assert named and all(f"TOOLKIT_{key.upper()}" == var and key in values for key, var in named), message
    import yaml
    path = write(tmp_path, yaml.safe_dump(values))
    message = _error(args={"config": path}, environ={})
    named = re.findall(rf"(\w+) from {re.escape(path)}, key (\w+)", message)
    assert named and all(key == spelled and key in values for key, spelled in named), message


def test_tf_use_legacy_keras_selects_tf_keras_for_horovod_only():
    legacy = {"TF_USE_LEGACY_KERAS": "1"}
    assert config.resolve({"framework": "tensorflow"}, environ=legacy).keras is config.Keras.TF_KERAS
    assert config.resolve({"framework": "tensorflow", "keras": "keras3"}, environ=legacy).keras is config.Keras.KERAS3
    assert config.resolve({"framework": "tensorflow", "backend": "native"}, environ=legacy).keras is config.Keras.KERAS3
    assert config.resolve({"framework": "torch"}, environ=legacy).keras is config.Keras.KERAS3
    assert config.resolve({"framework": "tensorflow"}, environ={}).keras is config.Keras.KERAS3


def test_elastic_block_and_straggler(tmp_path):
    path = write(tmp_path, "elastic:\n  min_np: 1\n  max_np: 4\n  discovery: ./hosts.sh\nstraggler: 1:50, 0:5\n")
    c = config.resolve({"config": path}, environ={})
    assert c.elastic and (c.elastic_min_np, c.elastic_max_np, c.elastic_discovery) == (1, 4, "./hosts.sh")
    assert c.elastic_commit_every == 10       # the default, filled in when elastic is on
    assert c.straggler_delays() == {1: 0.05, 0: 0.005}
    assert config.resolve({"config": path}, environ={"TOOLKIT_ELASTIC_MAX_NP": "2"}).elastic_max_np == 2
    assert not Config().elastic and Config().elastic_commit_every is None and Config().straggler_delays() == {}


def test_parameter_server_defaults():
    c = config.resolve({"sync": "ssp"}, environ={})
    assert (c.staleness, c.ps_servers, c.toolkit_exchange) == (4, 1, True)
    c = config.resolve({"sync": "async_ps", "ps_servers": "2"}, environ={})
    assert (c.staleness, c.ps_servers) == (None, 2)


def test_config_show_writes_the_readme_form_and_reads_back(tmp_path):
    """`toolkit config show` (and config.yaml beside checkpoints): the `elastic:` block as the README
    writes it, and each unset key whose value depends on others says what it becomes."""
    for made in (Config(elastic_min_np=2), Config(sync=Sync.SSP)):
        text = made.to_yaml()
        (tmp_path / "c.yaml").write_text(text)
        assert config.resolve({"config": str(tmp_path / "c.yaml")}, environ={}) == made
    assert "\nelastic:\n  min_np: 2\n  max_np: null  # unset: no limit\n" in Config(elastic_min_np=2).to_yaml()
    assert "elastic_" not in text and "\nstaleness: 4\n" in text and "\nlocal_steps: null  # unset: 4\n" in text


def test_docs_config_md_is_generated_from_the_fields():
    """docs/CONFIG.md lists every key (YAML, flag, TOOLKIT_*, default, help) as the fields define them."""
    from pathlib import Path

    from toolkit.config import docs
    path = Path(__file__).resolve().parent.parent / "docs" / "CONFIG.md"
    assert path.read_text() == docs.render(), \
        "docs/CONFIG.md is stale: run `python -m toolkit config docs > docs/CONFIG.md`"
    assert all(f"| `{f.name}` |" in docs.render() for f in dataclasses.fields(Config))


def test_config_declares_its_keys_as_the_groups_write_them():
    """Config's class body declares every key with groups.py's type and field (what editors and type checkers
    read), generated by docs.declarations(); the TensorFlow enum keeps its earlier name too."""
    import inspect

    from toolkit.config import Strategy, TfStrategy, docs, schema
    assert docs.declarations() in inspect.getsource(schema), \
        "toolkit/config/schema.py is stale: paste what `docs.declarations()` returns into Config's class body"
    tf = Config.from_dict({"framework": "tensorflow", "backend": "native", "strategy": "mirrored"})
    assert Strategy is TfStrategy and tf.strategy is TfStrategy.MIRRORED


def test_config_is_composed_from_the_groups_and_complete_on_construction():
    """Each key is written once, in a group's dataclass; the flat Config keeps the interface's order;
    a derived default is filled in by a step that returns a new Config (also through replace)."""
    from toolkit.config import GROUP_CLASSES, ORDER
    assert [f.name for f in dataclasses.fields(Config)] == list(ORDER)
    groups = {f.name: cls.group for cls in GROUP_CLASSES for f in dataclasses.fields(cls)}
    assert {f.name: f.metadata["group"] for f in dataclasses.fields(Config)} == groups
    topk = dataclasses.replace(Config(), compression=config.Compression.TOPK)
    assert topk.topk_ratio == config.unset_default("topk_ratio") == 0.01
    assert Config(sync=Sync.LOCAL_SGD).local_steps == config.unset_default("local_steps")


def test_overlap_is_refused_in_one_line_where_it_cannot_run():
    """overlap: true needs torch's gradient hooks and an exchange that splits at any block; bucket_mb > 0."""
    assert "overlap: true is torch's" in _error(args={"framework": "mxnet", "compression": "int8", "overlap": "true"},
                                                environ={})
    assert "got compression='topk'" in _error(args={"compression": "topk", "overlap": "true"}, environ={})
    assert "got compression='none'" in _error(args={"overlap": "true"}, environ={})
    assert "bucket_mb=0.0" in _error(args={"bucket_mb": "0"}, environ={})
    ok = config.resolve(args={"compression": "int8", "overlap": "true", "bucket_mb": "0.5"}, environ={})
    assert ok.overlap is True and ok.overlap_capable
