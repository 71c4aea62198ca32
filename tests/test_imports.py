"""The package's import graph has no cycle, counting imports inside functions
too (a lazy import still ties two modules together), and the package imports
with torch and PyG alone."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import networkx as nx

import leangnn

ROOT = Path(leangnn.__file__).parent


def _modules() -> dict[str, Path]:
    out = {}
    for p in ROOT.rglob("*.py"):
        parts = ("leangnn", *p.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = p
    return out


def _targets(name: str, path: Path, node, mods) -> set[str]:
    if isinstance(node, ast.Import):
        found = {a.name for a in node.names}
    else:
        base = node.module or ""
        if node.level:
            pkg = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
            parts = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
            base = ".".join(parts + ([base] if base else []))
        found = {base} | {f"{base}.{a.name}" for a in node.names}
    out = set()
    for dep in found:
        parts = dep.split(".")
        for i in range(2, len(parts) + 1):
            q = ".".join(parts[:i])
            # a module's own ancestor packages are imported before it anyway
            if q in mods and q != name and (q == dep or not name.startswith(q + ".")):
                out.add(q)
    return out


def import_graph() -> nx.DiGraph:
    mods = _modules()
    g = nx.DiGraph()
    for name, path in mods.items():
        g.add_node(name)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import | ast.ImportFrom):
                g.add_edges_from((name, t) for t in _targets(name, path, node, mods))
    return g


def test_no_import_cycle():
    g = import_graph()
    assert g.number_of_nodes() > 40 and g.number_of_edges() > 100
    cycles = [sorted(c) for c in nx.strongly_connected_components(g) if len(c) > 1]
    assert cycles == []


def test_the_graph_sees_a_planted_cycle(tmp_path, monkeypatch):
    # the check can fail: two modules importing each other lazily are found
    pkg = tmp_path / "leangnn"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from .b import g\n")
    (pkg / "b.py").write_text("def g():\n    from leangnn.a import f\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", pkg)
    g = import_graph()
    assert [sorted(c) for c in nx.strongly_connected_components(g) if len(c) > 1] \
        == [["leangnn.a", "leangnn.b"]]


def test_package_imports_without_optional_dependencies():
    code = ("import sys, leangnn, leangnn.cli, leangnn.train, leangnn.circuits\n"
            "bad = [m for m in ('matplotlib', 'yaml', 'pyaig') if m in sys.modules]\n"
            "assert not bad, bad\n")
    subprocess.run([sys.executable, "-c", code], check=True)
