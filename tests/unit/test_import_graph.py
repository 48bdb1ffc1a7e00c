"""The import graph of rlhfsim has no circle, and the scenario side stands below the simulator.

The same holds for calibrate/ (over rlhfsim and calibrate together) and for benchmarks/ (scripts that import each
other by bare name); rlhfsim imports nothing of calibrate/ (its CLI names calibrate's commands by path, loaded on
use), and calibrate/'s root holds only its entry points, every other module in the group of its role.

The graph is read from the source (``ast``), not from a run: an edge A -> B for every ``import`` of B
anywhere in A (module level, inside functions, under ``if TYPE_CHECKING``), plus A -> each package
above B (Python runs a package's ``__init__`` before its modules), minus A -> A's own packages (they
are always loaded before A). A lazy import inside a function still runs when the function does, so it
counts: a circle hidden in a function body is still a circle."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from rlhfsim.contracts import DEFAULT_STREAMING, STREAMING_ARCHS

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "rlhfsim"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported(name: str, path: Path, known: set[str]) -> set[str]:
    """Modules of ``known`` that module ``name`` (file ``path``) imports, with the packages above them."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from .x import y
                up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(up + ([node.module] if node.module else []))
            for a in node.names:  # `from pkg import module` imports the module
                targets.add(f"{base}.{a.name}" if f"{base}.{a.name}" in known else base)
    edges = set()
    for t in targets:
        parts = t.split(".")
        for i in range(1, len(parts) + 1):
            m = ".".join(parts[:i])
            if m in known and m != name and not name.startswith(m + "."):
                edges.add(m)
    return edges


def import_graph(*roots: Path) -> dict[str, set[str]]:
    """The graph of the modules under ``roots`` (default: rlhfsim/); a root that is no package (benchmarks/: scripts
    run with their folder on the import path) names its modules by their bare names."""
    files = {}
    for root in roots or (PKG,):
        package = (root / "__init__.py").is_file()
        files.update({_module_name(p) if package else p.stem: p for p in sorted(root.rglob("*.py"))})
    known = set(files)
    return {name: _imported(name, path, known) for name, path in files.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative), plus self-loops."""
    index, low, on, stack, out = {}, {}, set(), [], []
    counter = 0
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1 or v in graph.get(v, ()):
                        out.append(sorted(comp))
    return out


def test_the_cycle_finder_finds_cycles():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_graph_sees_lazy_type_checking_and_package_imports(tmp_path):
    pkg = tmp_path / "rlhfsim"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from rlhfsim.sub.a import A\n")
    (pkg / "sub" / "a.py").write_text("from rlhfsim.sub import b\nA = 1\n")
    (pkg / "sub" / "b.py").write_text("def f():\n    from rlhfsim import c\n")
    (pkg / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from rlhfsim.sub.a import A\n")
    files = {".".join(p.relative_to(tmp_path).with_suffix("").parts).removesuffix(".__init__"): p
             for p in pkg.rglob("*.py")}
    g = {n: _imported(n, p, set(files)) for n, p in files.items()}
    assert g["rlhfsim.sub"] == {"rlhfsim.sub.a"}
    assert g["rlhfsim.sub.a"] == {"rlhfsim.sub.b"}   # its own package is not an edge
    assert g["rlhfsim.sub.b"] == {"rlhfsim.c"}       # lazy import counts
    assert g["rlhfsim.c"] == {"rlhfsim.sub", "rlhfsim.sub.a"}  # TYPE_CHECKING counts, with the package
    assert cycles(g) == [["rlhfsim.c", "rlhfsim.sub", "rlhfsim.sub.a", "rlhfsim.sub.b"]]


def test_rlhfsim_has_no_import_circle():
    graph = import_graph()
    assert "rlhfsim.scenario.checks" in graph["rlhfsim.sim.simulation"] or \
        "rlhfsim.scenario" in graph["rlhfsim.sim.simulation"]  # the graph is read, not empty
    found = cycles(graph)
    assert not found, "import circles: " + "; ".join(" -> ".join(c) for c in found)


def test_the_scenario_side_imports_nothing_of_the_simulator():
    graph = import_graph()
    bad = {m: sorted(t for t in ts if t == "rlhfsim.sim" or t.startswith("rlhfsim.sim."))
           for m, ts in graph.items() if m.startswith("rlhfsim.scenario")}
    assert not {m: ts for m, ts in bad.items() if ts}


def test_loading_a_scenario_loads_no_simulator():
    """Loading and checking a bundled scenario, with a --set override, imports neither simpy nor
    rlhfsim.sim."""
    code = ("import sys\nfrom rlhfsim.scenario.loader import load_scenario\n"
            f"load_scenario({str(ROOT / 'scenarios' / 'oppo.yaml')!r}, overrides=[('steps', 3)])\n"
            "print(sorted(m for m in sys.modules if m == 'simpy' or m.startswith(('simpy.', 'rlhfsim.sim'))))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]", r.stdout


def test_the_streaming_names_the_schema_reads_are_the_registry():
    from rlhfsim.sim import streaming

    assert {n: tuple(sorted(c.ARCHS)) for n, c in streaming.STREAMING.items()} == \
        {n: tuple(sorted(a)) for n, a in STREAMING_ARCHS.items()}
    assert list(streaming.STREAMING) == list(STREAMING_ARCHS)
    assert streaming.DEFAULT_STREAMING == DEFAULT_STREAMING


def test_calibrate_has_no_import_circle_and_rlhfsim_imports_nothing_of_it():
    graph = import_graph(PKG, ROOT / "calibrate")
    assert "calibrate.measuring.scoring" in graph["calibrate.running.run"] or \
        "calibrate.measuring" in graph["calibrate.running.run"]   # the graph is read, not empty
    found = cycles(graph)
    assert not found, "import circles: " + "; ".join(" -> ".join(c) for c in found)
    into = {m: sorted(t for t in ts if t.split(".")[0] == "calibrate") for m, ts in graph.items() if m.startswith("rlhfsim")}
    assert not {m: ts for m, ts in into.items() if ts}


def test_rlhfsim_names_calibrate_entry_points_only_in_its_cli():
    """An entry point ``calibrate.X:NAME`` written anywhere else in rlhfsim would be an import of calibrate/ in
    disguise."""
    import re

    entry = re.compile(r"calibrate(\.\w+)+:\w+")
    where = {str(p.relative_to(ROOT)) for p in PKG.rglob("*.py")
             for node in ast.walk(ast.parse(p.read_text())) if isinstance(node, ast.Constant)
             and isinstance(node.value, str) and entry.fullmatch(node.value)}
    assert where == {"rlhfsim/cli.py"}


def test_calibrate_root_holds_its_entry_points_only():
    root = {p.stem for p in (ROOT / "calibrate").glob("*.py")}
    assert root == {"__init__", "__main__", "cli"}, "a module of calibrate/ belongs in the group of its role: " \
        "measuring/, fitting/, running/ (or cpu/, runtimes/, genruntimes/, executor/, validation/, ...)"


def test_the_benchmarks_have_no_import_circle():
    graph = import_graph(ROOT / "benchmarks")
    assert "speed_workload" in graph["sim_speed"] and "speed_workload" in graph["periter_peer"]
    assert not cycles(graph), cycles(graph)
