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
    loaded = modules_after("import toolkit, toolkit.config, toolkit.launch, toolkit.registry, toolkit.cli")
    assert not loaded & set(FRAMEWORKS), loaded & set(FRAMEWORKS)


def test_help_is_light():
    code = ("import sys\nfrom toolkit.cli import main\n"
            "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
            "try:\n    main(['train', '--help'])\nexcept SystemExit:\n    pass")
    loaded = modules_after(code)
    assert not loaded & set(FRAMEWORKS), loaded & set(FRAMEWORKS)
