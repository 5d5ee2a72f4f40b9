"""`import toolkit` and `toolkit --help` load no framework."""
import json
import subprocess
import sys

FRAMEWORKS = ("torch", "tensorflow", "mxnet", "horovod", "numpy", "keras", "yaml")


def modules_after(code: str) -> set:
    out = subprocess.run([sys.executable, "-c", code + "\nimport sys, json; print(json.dumps(sorted(sys.modules)))"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


def test_import_toolkit_is_light():
    loaded = modules_after("import toolkit, toolkit.config, toolkit.launch.launcher, toolkit.registry, toolkit.cli")
    assert not loaded & set(FRAMEWORKS), loaded & set(FRAMEWORKS)


def test_help_is_light():
    """`toolkit --help` and `toolkit train --help` print their help and exit 0, importing no framework."""
    code = ("import contextlib, io, sys\nfrom toolkit.cli import main\ncodes, texts = [], []\n"
            "for argv in (['--help'], ['train', '--help']):\n"
            "    out = io.StringIO()\n"
            "    with contextlib.redirect_stdout(out):\n"
            "        try:\n            main(argv)\n"
            "        except SystemExit as e:\n            codes.append(e.code)\n"
            "    texts.append(out.getvalue())\n"
            "assert codes == [0, 0], codes\n"
            "assert 'usage: toolkit' in texts[0] and 'examples:' in texts[0] and 'toolkit launch -np 2' in texts[0]\n"
            "assert 'usage: toolkit train' in texts[1] and '--batch-size' in texts[1], texts[1]")
    loaded = modules_after(code)
    assert not loaded & set(FRAMEWORKS), loaded & set(FRAMEWORKS)


START_PROBE = """
import gc, json, sys, toolkit
seen = []
gc.callbacks.append(lambda phase, info: phase == "start" and seen.append("torch" in sys.modules))
session = toolkit.start(framework="torch", quiet=True)
gc.callbacks.clear()
print(json.dumps({"collections": sum(seen), "enabled": gc.isenabled(), "frozen": gc.get_freeze_count()}))
"""


def test_a_rank_imports_its_framework_without_the_collector_and_freezes_what_it_made():
    """toolkit.start (pipeline.start) imports torch and Horovod with Python's cyclic collector paused: no
    collection once torch is importing (without the pause: about 400), the collector on again after, and
    what the imports made frozen, so the collections during training skip it."""
    out = subprocess.run([sys.executable, "-c", START_PROBE], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["collections"] == 0 and got["enabled"] and got["frozen"] > 100_000, got


def test_a_collector_turned_off_stays_off_and_nothing_is_frozen():
    import gc

    from toolkit.startup import collector_paused
    frozen = gc.get_freeze_count()
    gc.disable()
    try:
        with collector_paused():
            pass
        assert not gc.isenabled() and gc.get_freeze_count() == frozen
    finally:
        gc.enable()
