"""Cost terms are named by the registry's constants, never by strings (rlhfsim.costs.terms).

Code names a term by importing its constant (``from rlhfsim.costs.terms import INTERFERENCE``): a misspelt constant
is an ImportError when its module is imported. A string spelt like a term would be a new, silent key instead, so
the source of every module (the packages, the lab, the benchmarks, the scenarios' scripts and the tests) is read
here (``ast``) for two things:

* the name of a term that means nothing else in the code, written as a string anywhere outside the registry;
* any string used as a key of a breakdown (seconds by term: ``x.terms()``, an explanation's ``terms_s``, a
  variable named for its terms), registered or not: a registered name belongs in its constant, any other string is
  a typo or a term that was never registered.

Some term names are also the names of other things (a phase, a profile section, a scenario field, a calibration
point's operation); ``SHARED`` names each and where its other meaning lives, and a test holds that meaning to the
code, so a term cannot be let off by a reason that is not true.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from rlhfsim.contracts import PHASES
from rlhfsim.costs import terms as T
from rlhfsim.costs.cpuhost import KEYS as CPU_KERNEL_KEYS
from rlhfsim.costs.profile import OPERATIONS
from rlhfsim.scenario.schema import Execution

ROOT = Path(__file__).resolve().parents[2]
DIRS = ("rlhfsim", "calibrate", "lab", "benchmarks", "scenarios", "tests")
REGISTRY = ROOT / "rlhfsim" / "costs" / "terms.py"

# Term names that are also the names of other things, with the code that holds the other meaning
# (test_each_shared_name_has_its_other_meaning checks each).
SHARED = {
    T.KERNELS: "the CPU host effects' profile section (profile.kernels, cpuhost.CpuHostEffects.of)",
    T.INTERFERENCE: "the profile section of co-running slowdowns and a calibration point's operation",
    T.PAGE_FAULTS: "a key of the profile's kernels section (cpuhost.KEYS)",
    T.COLD_OVERHEADS: "a key of the profile's kernels section (cpuhost.KEYS)",
    T.OPTIMIZER: "a profile operation (profile.OPERATIONS) and a scenario's offload field",
    T.OFFLOAD: "a field of the scenario's execution block",
    T.ADVANTAGE: "a field of the scenario's execution block",
    T.WEIGHT_SYNC: "a phase (contracts.PHASES) and a field of the scenario's execution block",
    T.RETOKENIZE: "a phase (contracts.PHASES)",
    T.HANDOFF: "a calibration point's operation (calibrate.measuring.genbench)",
    T.WIDTH_RATE: "a calibration point's field (cpuhost.CpuHostEffects.point_fields)",
    T.ENGINE_STEP: "a column of the engine host's timing rows (calibrate.enginehost)",
    T.ENGINE_HOST: "the summary's generation runtime entry (genruntimes.engine_host)",
}
OWN = {t.name for t in T.TERMS} - set(SHARED)
CONSTANTS = {t.name.upper() for t in T.TERMS}


# a file can break neither rule without a quoted term name or the word "terms" (a breakdown's call, entry or
# variable, or the import of a term's constant): only those are parsed
_CANDIDATE = re.compile("|".join([r"terms"] + [f"[\"']{re.escape(t.name)}[\"']" for t in T.TERMS]))


def _sources():
    for d in DIRS:
        for path in sorted((ROOT / d).rglob("*.py")):
            text = path.read_text()
            if path != REGISTRY and _CANDIDATE.search(text):
                yield path, ast.parse(text, str(path))


def _is_breakdown(node: ast.AST) -> bool:
    """Seconds by term: a ``.terms(...)`` call, an explanation's ``...terms_s`` entry, a variable named for terms."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        return node.func.attr == "terms"
    if isinstance(node, ast.Subscript):
        s = node.slice
        return isinstance(s, ast.Constant) and isinstance(s.value, str) and s.value.endswith("terms_s")
    if isinstance(node, ast.Name):
        return "terms" in node.id
    if isinstance(node, ast.Attribute):
        return "terms" in node.attr
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("set", "dict", "list"):
        return bool(node.args) and _is_breakdown(node.args[0])
    return False


def _strings(node: ast.AST) -> list[ast.Constant]:
    """The string constants of ``node``, a string or a literal set, tuple or list of them."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node]
    if isinstance(node, (ast.Set, ast.Tuple, ast.List)):
        return [e for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
    return []


def _keyed(tree: ast.AST) -> list[ast.Constant]:
    """Strings used as keys of a breakdown in ``tree``."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and _is_breakdown(node.value):
            out += _strings(node.slice)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args and \
                node.func.attr in ("get", "pop", "setdefault") and _is_breakdown(node.func.value):
            out += _strings(node.args[0])
        elif isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(_is_breakdown(s) for s in sides):
                out += [c for s in sides for c in _strings(s)]
        elif isinstance(node, ast.Dict):   # a breakdown written out: a term's constant beside a string key
            if any(isinstance(k, (ast.Name, ast.Attribute)) and (k.id if isinstance(k, ast.Name) else k.attr) in CONSTANTS
                   for k in node.keys):
                out += [c for k in node.keys if k is not None for c in _strings(k)]
    return out


def test_no_term_is_named_by_a_string():
    found = []
    for path, tree in _sources():
        where = path.relative_to(ROOT)
        found += [f"{where}:{n.lineno}: {n.value!r} (import its constant from rlhfsim.costs.terms)"
                  for n in ast.walk(tree) if isinstance(n, ast.Constant) and n.value in OWN]
        found += [f"{where}:{n.lineno}: {n.value!r} keys a breakdown ("
                  + ("import its constant" if n.value in T.BY_NAME else "not a registered term") + ")"
                  for n in _keyed(tree)]
    assert not found, "\n".join(sorted(set(found)))


def test_each_shared_name_has_its_other_meaning():
    fields = set(Execution.model_fields)
    assert {T.OFFLOAD, T.ADVANTAGE, T.WEIGHT_SYNC} <= fields
    assert {T.WEIGHT_SYNC, T.RETOKENIZE} <= set(PHASES) and T.OPTIMIZER in OPERATIONS
    assert {T.PAGE_FAULTS, T.COLD_OVERHEADS} <= set(CPU_KERNEL_KEYS)
    text = {p: p.read_text() for p in (ROOT / "rlhfsim" / "costs" / "cpuhost.py", ROOT / "rlhfsim" / "costs" / "model.py",
                                       ROOT / "calibrate" / "measuring" / "genbench.py",
                                       ROOT / "calibrate" / "enginehost" / "fit.py", ROOT / "rlhfsim" / "sim" / "simulation.py")}
    uses = {T.KERNELS: 'profile.get("kernels")', T.INTERFERENCE: 'profile.get("interference"',
            T.HANDOFF: 'point_key("handoff"', T.WIDTH_RATE: 'out["width_rate"]', T.ENGINE_STEP: 'r["engine_step"]',
            T.ENGINE_HOST: '"engine_host": dataclasses.asdict'}
    for name, snippet in uses.items():
        assert any(snippet in s for s in text.values()), (name, snippet)
    assert set(SHARED) <= set(T.TERMS) and all(type(k) is T.CostTerm for k in SHARED)


def test_the_scan_finds_what_it_is_for():
    src = ('terms = p.terms()\nterms["interferense"]\nx = d.terms()["kernels"]\n"gemm_footprint" in doc["terms_s"]\n'
           '{KERNELS: 1.0, "op_overhead": 2.0}\nprofile["kernels"]\n')
    assert sorted(c.value for c in _keyed(ast.parse(src))) == sorted(["interferense", T.KERNELS, T.GEMM_FOOTPRINT,
                                                                      T.OP_OVERHEAD])
