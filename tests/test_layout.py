"""The product's structure, as docs/ARCHITECTURE.md states it: no import circle (imports inside functions
included), no arrow upward between the packages it names, no product module over 450 lines unless it is a
facade that says why at its top, and every module path that page names exists."""
from __future__ import annotations

import re

from tests import import_graph
from tests.import_graph import ROOT

LIMIT = 450
# (importer prefix, imported prefix): arrows that must not exist
UPWARD = [("toolkit.exchange", "toolkit.planner"), ("toolkit.adapters", "toolkit.launch"),
          ("toolkit.config", "toolkit.run"), ("toolkit.data", "toolkit.run"), ("toolkit.launch", "toolkit.adapters")]


def test_no_import_circle():
    assert import_graph.circles(import_graph.edges(import_graph.modules())) == []


def test_no_import_arrow_runs_upward():
    graph = import_graph.edges(import_graph.modules())
    found = [(a, b) for a, targets in graph.items() for b in targets for low, high in UPWARD
             if a.startswith(low) and b.startswith(high)]
    assert found == []


def test_no_product_module_over_the_limit_unless_a_facade_says_why():
    over = []
    for module, path in import_graph.modules().items():
        text = path.read_text()
        if text.count("\n") > LIMIT and f"Over the {LIMIT}-line rule on purpose" not in text[:600]:
            over.append((module, text.count("\n")))
    assert over == []


def test_every_module_path_the_architecture_page_names_exists():
    page = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    named = set(re.findall(r"\b((?:toolkit|adapters|tests|benchmarks)/[\w/]+\.py)\b", page))
    assert len(named) > 40, named
    missing = sorted(p for p in named if "<fw>" not in p and not (ROOT / p).is_file())
    assert missing == []
