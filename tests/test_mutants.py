"""The mutants of tests/break_claims.py still mutate: each target text occurs exactly once in its file,
and each test a mutant names exists. A mutant whose text moved would silently change nothing."""
from __future__ import annotations

import pytest

from tests.break_claims import MUTANTS, ROOT


@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda m: m.id)
def test_every_mutant_still_has_its_target_text_once_and_its_tests(mutant):
    for file, old, new in mutant.edits:
        found = (ROOT / file).read_text().count(old)
        assert found == 1, f"{mutant.id}: the text to change occurs {found} times in {file}; update the mutant"
        assert old != new, f"{mutant.id}: an edit that changes nothing"
    for test in mutant.tests:
        path, _, name = test.partition("::")
        assert (ROOT / path).is_file(), f"{mutant.id}: no test file {path}"
        function = name.split("[")[0].split("::")[-1]
        if function:
            assert f"def {function}(" in (ROOT / path).read_text(), f"{mutant.id}: no test {test}"


def test_mutant_ids_are_unique():
    ids = [m.id for m in MUTANTS]
    assert len(ids) == len(set(ids))


def test_every_test_a_mutant_names_is_collected():
    """Each mutant's test ids, parametrized ones included, name tests pytest collects (a wrong id would run
    nothing, and the mutant would look caught)."""
    import subprocess
    import sys
    ids = sorted({t for m in MUTANTS for t in m.tests})
    proc = subprocess.run([sys.executable, "-m", "pytest", "--co", "-q", "-p", "no:cacheprovider", *ids], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
