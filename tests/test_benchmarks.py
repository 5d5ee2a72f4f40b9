"""benchmarks/: the one writer of docs blocks and its one marker syntax, and the docs naming benchmark
scripts that exist (fast: no framework, no job; the benchmarks themselves take minutes, docs hold their runs)."""
import re

import pytest

from benchmarks import common
from tests.conftest import ROOT

DOCS = [ROOT / "README.md", ROOT / "benchmarks" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_a_table_is_written_between_its_markers_and_nothing_else_changes(tmp_path):
    doc = tmp_path / "PAGE.md"
    doc.write_text("head\n<!-- t:begin -->\nold\ntable\n<!-- t:end -->\ntail\n<!-- u:begin -->\nkept\n<!-- u:end -->\n")
    common.write_between(doc, "t", "Made by X.\n\n" + common.table(["a", "b"], [[1, ""], "| x | failed: y | |"]))
    assert doc.read_text() == ("head\n<!-- t:begin -->\nMade by X.\n\n| a | b |\n|---|---|\n| 1 |  |\n"
                               "| x | failed: y | |\n<!-- t:end -->\ntail\n<!-- u:begin -->\nkept\n<!-- u:end -->\n")
    with pytest.raises(SystemExit, match="no <!-- v:begin --> ... <!-- v:end --> markers"):
        common.write_between(doc, "v", "text")


def test_every_block_a_benchmark_writes_has_its_markers_and_every_marker_one_syntax():
    written = set()
    for script in (ROOT / "benchmarks").glob("*.py"):
        written |= set(re.findall(r'write_between\("(\w+\.md)", "(\w+)"', script.read_text()))
    written |= {("COMMUNICATION.md", "bench"), ("COMMUNICATION.md", "resnet18")}      # chosen by --workload
    written |= {("BENCHMARKS.md", suite) for suite in ("peers", "tuning", "fusion", "resnet50", "engines")}
    for page, name in sorted(written):
        text = (ROOT / "docs" / page).read_text()
        begin, end = common.markers(name)
        assert text.count(begin) == 1 and text.count(end) == 1 and text.index(begin) < text.index(end), \
            f"docs/{page}: {begin} ... {end}"
    for page in (ROOT / "docs").glob("*.md"):
        other = re.findall(r"<!-- \w+:? +(?:begin|end) -->", page.read_text())
        assert not other, f"{page.name}: markers not in the `<!-- NAME:begin -->` syntax: {other}"


@pytest.mark.parametrize("page", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_the_benchmarks_the_docs_name_exist(page):
    text = page.read_text()
    missing = [m for m in re.findall(r"-m benchmarks\.(\w+)", text) if not (ROOT / "benchmarks" / f"{m}.py").is_file()]
    missing += [p for p in re.findall(r"\b((?:benchmarks|examples)/[\w/]+\.py)\b", text) if not (ROOT / p).is_file()]
    assert not missing, f"{page.name} names benchmark scripts that do not exist: {missing}"

