"""setup's kept virtualenv (toolkit/install/venvcache.py): a finished virtualenv linked into the cache, linked
back for the next checkout with its paths pointed at the new place, the kept copy never changed by the copy."""
from __future__ import annotations

import subprocess
import sys

import pytest

from toolkit.install import envsetup, venvcache


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TOOLKIT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv(venvcache.ENV, raising=False)
    return tmp_path / "cache" / "venvs"


def _venv(path):
    """A real virtualenv (no pip: fast) with a script whose first line names its python, as pip writes them."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True)
    script = path / "bin" / "where"
    script.write_text(f"#!{path.absolute()}/bin/python\nimport sys\nprint(sys.prefix)\n")
    script.chmod(0o755)
    site = next((path / "lib").glob("python*/site-packages"))
    (site / "data.txt").write_text("kept\n")
    return site


def test_a_kept_virtualenv_is_linked_back_at_a_new_path_and_the_copies_never_change_each_other(tmp_path, cache):
    first = tmp_path / "a" / ".venv"
    _venv(first)
    assert venvcache.save(first, "k1")
    kept = cache / "k1"
    again = tmp_path / "b" / ".venv"
    again.parent.mkdir()
    assert venvcache.restore(again, "k1")
    out = subprocess.run([str(again / "bin" / "where")], capture_output=True, text=True, check=True).stdout
    assert out.strip() == str(again.absolute())                        # its script runs its own python
    assert f"{first.absolute()}/bin/python" in (kept / "bin" / "where").read_text()   # the kept one is untouched
    cfg = (again / "pyvenv.cfg").read_text()
    assert f"-m venv --without-pip {again.absolute()}\n" in cfg and str(first.absolute()) not in cfg, cfg
    assert not (again / venvcache.ORIGIN).exists()
    site = next((again / "lib").glob("python*/site-packages"))
    kept_site = next((kept / "lib").glob("python*/site-packages"))
    assert (site / "data.txt").stat().st_ino == (kept_site / "data.txt").stat().st_ino   # linked, not copied
    venvcache.replace_text(site / "data.txt", "changed\n")
    envsetup.install_numpy_shim(site)                                   # the toolkit's own writes into a venv
    assert (kept_site / "data.txt").read_text() == "kept\n" and not (kept_site / "toolkit_numpy_compat.pth").exists()
    assert not venvcache.restore(again, "k1")                           # never over an existing one
    assert not venvcache.restore(tmp_path / "c", "other")               # nothing kept for another key


def test_the_cache_keeps_the_newest_two_and_can_be_turned_off(tmp_path, cache, monkeypatch):
    venv = tmp_path / "v"
    _venv(venv)
    for name in ("k1", "k2", "k3"):
        assert venvcache.save(venv, name)
    assert sorted(p.name for p in cache.iterdir()) == ["k2", "k3"]
    assert venvcache.key("d", ["spark", "ray"], False) == venvcache.key("d", ["ray", "spark"], False) != \
        venvcache.key("d", ["ray"], False)
    monkeypatch.setenv(venvcache.ENV, "0")
    assert not venvcache.save(venv, "k4") and not venvcache.restore(tmp_path / "w", "k3")


def test_setup_links_a_kept_virtualenv_and_installs_this_checkouts_toolkit_into_it(tmp_path, cache, monkeypatch):
    """setup() of a virtualenv that does not exist, with a kept copy of its key: no pip install of the pins,
    only this checkout's toolkit (the kept copy's is another checkout's), then build-horovod."""
    origin = tmp_path / "old" / ".venv"
    (origin / "bin").mkdir(parents=True)
    (origin / "bin" / "python").write_text("")
    (origin / envsetup.STAMP).write_text(f"{envsetup.pins_digest()}\ntorch,tensorflow,mxnet\n")
    (origin / "pyvenv.cfg").write_text(f"command = python -m venv {origin}\n")
    assert venvcache.save(origin, venvcache.key(envsetup.pins_digest(), [], False))
    ran = []
    monkeypatch.setattr(envsetup, "ensure_system_packages", lambda say, compilers=True: None)
    monkeypatch.setattr(envsetup, "_python_version", lambda python: f"{sys.version_info[0]}.{sys.version_info[1]}")
    monkeypatch.setattr(envsetup, "_run", lambda cmd, what, say=None: ran.append(what))
    real_run = subprocess.run

    def run(cmd, *a, **k):      # build-horovod stubbed; the cache's own `cp -al` runs
        if cmd[0] == "cp":
            return real_run(cmd, *a, **k)
        ran.append("build-horovod")
        return subprocess.CompletedProcess(cmd, 0)
    monkeypatch.setattr(subprocess, "run", run)
    said = []
    venv = tmp_path / "new" / ".venv"
    venv.parent.mkdir()
    envsetup.setup(venv, [], say=said.append)
    assert ran == ["installing the toolkit", "build-horovod"], ran
    assert any("linked from an identical setup's" in s for s in said), said
    assert str(venv.absolute()) in (venv / "pyvenv.cfg").read_text()
