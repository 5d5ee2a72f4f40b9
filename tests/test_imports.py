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
