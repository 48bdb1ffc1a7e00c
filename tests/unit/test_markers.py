"""The fast loop (``python -m pytest -q -m "not hw"``) stays the simulator's: a test module that loads the
hardware side's stack when it is imported (torch, transformers, onnxruntime, trl: directly, through a
module-level ``pytest.importorskip``, or through a ``calibrate`` module that imports one at its top,
followed transitively) carries the ``hw`` marker for the whole module (``pytestmark``). Read from the
source (``ast``), so it costs nothing to run."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "transformers", "onnxruntime", "trl")


def _top_imports(path: Path) -> set[str]:
    """Modules imported at module level (not inside functions; ``if``/``try`` blocks count), plus
    ``pytest.importorskip("X")`` calls at module level."""
    names: set[str] = set()
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])

    def visit(body):
        for node in body:
            if isinstance(node, ast.Import):
                names.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join(up + ([base] if base else []))
                names.add(base)
                names.update(f"{base}.{a.name}" for a in node.names)
            elif isinstance(node, (ast.If, ast.Try)):
                visit(node.body)
                visit(getattr(node, "orelse", []))
                for h in getattr(node, "handlers", []):
                    visit(h.body)
            for call in ast.walk(node) if isinstance(node, (ast.Expr, ast.Assign)) else ():
                if (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
                        and call.func.attr == "importorskip" and call.args and isinstance(call.args[0], ast.Constant)):
                    names.add(str(call.args[0].value))

    visit(ast.parse(path.read_text(), str(path)).body)
    return names


def _file_of(module: str) -> Path | None:
    p = ROOT / Path(*module.split("."))
    for f in (p.with_suffix(".py"), p / "__init__.py"):
        if f.is_file():
            return f
    return None


_MEMO: dict[str, str | None] = {}


def heavy_via(module: str) -> str | None:
    """The heavy package ``module`` loads when imported (its chain as 'a -> b -> torch'), or None. Each
    module is looked at once (a module on the current path counts as None while it is being looked at)."""
    top = module.split(".")[0]
    if top in HEAVY:
        return module
    if top not in ("calibrate", "rlhfsim"):
        return None
    if module in _MEMO:
        return _MEMO[module]
    _MEMO[module] = None
    f = _file_of(module)
    if f is not None:
        parents = [".".join(module.split(".")[:i]) for i in range(1, module.count(".") + 1)]
        for dep in sorted(_top_imports(f)) + parents:
            chain = heavy_via(dep)
            if chain:
                _MEMO[module] = f"{module} -> {chain}"
                break
    return _MEMO[module]


def _marked_hw(path: Path) -> bool:
    tree = ast.parse(path.read_text(), str(path))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets):
            return "hw" in ast.unparse(node.value)
    return False


def test_the_finder_follows_calibrate_modules_to_torch():
    assert heavy_via("calibrate.executor") and heavy_via("calibrate.executor").endswith("torch")
    assert heavy_via("rlhfsim.scenario.loader") is None and heavy_via("calibrate.fitting.stats") is None


def test_every_module_that_loads_the_hardware_stack_on_import_is_marked_hw():
    offenders = []
    for f in sorted((ROOT / "tests").rglob("test_*.py")):
        if _marked_hw(f):
            continue
        for name in sorted(_top_imports(f)):
            chain = heavy_via(name)
            if chain:
                offenders.append(f"{f.relative_to(ROOT)}: imports {chain}")
                break
    assert not offenders, "mark these modules `pytestmark = pytest.mark.hw`:\n" + "\n".join(offenders)
