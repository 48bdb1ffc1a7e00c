"""Issue 14's property: 1,000 generated scenarios through ``rlhfsim simulate`` (in-process), with zero
tracebacks and zero hangs. Every run either succeeds or exits 2 with ``error:`` lines on stderr.

Two generators, half the examples each:

- schema mutations: a small valid CPU scenario with 1 to 4 fields set to random values, the fields drawn
  from every path the schema has (``schema_paths``: every block, every kind of every union, every
  registered schedule's config), the values half plausible (right type, in or near the bounds: many
  such scenarios validate and simulate) and half hostile (wrong types, near-limit numbers 1e308, 2**63,
  inf, nan, -0.0, strings with NUL bytes and odd unicode);
- text corruption: the same scenario as YAML text with 1 to 3 random edits (a character deleted,
  inserted or replaced, a line duplicated or dropped, the text cut short, control bytes).

Runs are bounded by ``--max-work`` (a small budget, so a huge-but-valid scenario is refused in
microseconds instead of simulated) and by an alarm: a run over ``HANG_S`` seconds is a failure.
"""

from __future__ import annotations

import copy
import json
import os
import signal
import time
from typing import Literal, get_args, get_origin

import yaml
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from rlhfsim.cli import main
from rlhfsim.scenario.paths import _flatten
from rlhfsim.scenario.schema import Scenario

EXAMPLES = int(os.environ.get("RLHFSIM_PROPERTY_EXAMPLES", "1000"))  # fewer only for sizing it locally
HANG_S = 20
MAX_WORK = "50000"

BASE = {
    "name": "prop",
    "models": {"actor": {"model": "tiny-qwen2", "dtype": "float32"}, "reference": {"model": "tiny-qwen2", "dtype": "float32"},
               "reward": {"model": "tiny-qwen2", "dtype": "float32"}},
    "cluster": {"gpu": "cpu", "nodes": 1, "gpus_per_node": 1},
    "algorithm": {"kind": "grpo", "group_size": 2, "minibatch_size": 4},
    "workload": {"prompts_per_step": 4, "prompt_length": {"kind": "fixed", "value": 16}, "max_prompt_tokens": 64,
                 "response_length": {"kind": "lognormal", "median": 20, "p99": 60}, "max_response_tokens": 64},
    "generation": {"engine": "continuous", "max_batch": 4},
    "schedule": {"kind": "oppo", "intra": {"chunk_tokens": 16}, "inter": {"delta": 2}},
    "steps": 2,
    "warmup_steps": 0,
}


def schema_paths(model: type[BaseModel] = Scenario, prefix: tuple = (), depth: int = 0) -> list[tuple]:
    """Every field path of the schema, through every member of every union (each member's ``kind``
    recorded as a path ending in ``kind`` too); list items as index 0."""
    out = []
    for name, f in model.model_fields.items():
        path = prefix + (name,)
        out.append(path)
        if depth > 6:
            continue
        for t in _flatten(f.annotation):
            if get_origin(t) is list:
                for a in _flatten(get_args(t)[0]):
                    if isinstance(a, type) and issubclass(a, BaseModel):
                        out += schema_paths(a, path + (0,), depth + 1)
            elif isinstance(t, type) and issubclass(t, BaseModel):
                out += schema_paths(t, path, depth + 1)
    return sorted(set(out), key=str)


PATHS = schema_paths()


def _kinds() -> list[str]:
    found = set()

    def walk(model, depth=0):
        for f in model.model_fields.values():
            for t in _flatten(f.annotation):
                args = get_args(t) if get_origin(t) is list else (t,)
                for a in (x for y in args for x in _flatten(y)):
                    if isinstance(a, type) and issubclass(a, BaseModel) and depth < 6:
                        k = a.model_fields.get("kind")
                        if k is not None:
                            found.update(v for v in get_args(k.annotation) if get_origin(k.annotation) is Literal)
                        walk(a, depth + 1)
    walk(Scenario)
    return sorted(found)


KINDS = _kinds()

def _nested(n: int):
    out = 1
    for _ in range(n):
        out = [out]
    return out


VALUES = st.one_of(
    st.none(), st.booleans(),
    st.integers(-3, 70), st.sampled_from([0, -1, 1, 2, 10**6, 10**12, 2**63, -(2**63), 2**64]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([1e308, -1e308, 5e-324, -0.0, float("inf"), float("nan"), 0.5, 1e12]),
    st.sampled_from(KINDS),
    st.text(max_size=10), st.sampled_from(["", "\x00", "a\x00b", "../../etc/passwd", "/dev/zero", "tiny-qwen2",
                                           "qwen2.5-72b", "h200", "_cpu_node", "ü\u202e", "x" * 300]),
    st.lists(st.integers(-2, 300), max_size=4),
    st.dictionaries(st.sampled_from(["kind", "value", "x", "gpus", "roles", "weight"]), st.integers(-2, 5), max_size=3),
    st.just({"kind": "mixture", "components": [{"weight": 1e308, "dist": {"kind": "fixed", "value": 3}}]}),
    st.just(_nested(40)),
)


# Values of the right type, in or near the bounds, so that many mutated scenarios validate and reach the
# simulator (or its work limit) rather than stopping at the schema.
PLAUSIBLE = st.one_of(
    st.booleans(), st.sampled_from([0, 1, 2, 3, 4, 7, 16, 64, 100, 1000, 4096, 10**6]),
    st.sampled_from([0.0, 1e-9, 0.01, 0.5, 0.9, 1.0, 2.5, 100.0, 1e6]), st.sampled_from(KINDS),
    st.sampled_from(["tiny-qwen2", "small-qwen2", "tiny-deberta", "cpu", "float32", "bfloat16", "static",
                     "continuous", "vllm", "hf_generate", "eager"]),
)


def _set(doc: dict, path: tuple, value) -> None:
    node = doc
    for p in path[:-1]:
        if isinstance(p, int):
            if not isinstance(node, list):
                return
            if not node:
                node.append({})
            node = node[0]
        else:
            if not isinstance(node, dict):
                return
            if not isinstance(node.get(p), (dict, list)):
                node[p] = [] if isinstance(path[path.index(p) + 1], int) else {}
            node = node[p]
    last = path[-1]
    if isinstance(node, dict) and not isinstance(last, int):
        node[last] = value
    elif isinstance(node, list):
        node[:] = [value]


def _leaves(node, prefix=()) -> list[tuple]:
    if isinstance(node, dict):
        return [leaf for k, v in node.items() for leaf in _leaves(v, prefix + (k,))]
    if isinstance(node, list):
        return [leaf for i, v in enumerate(node) for leaf in _leaves(v, prefix + (i,))]
    return [(prefix, node)]


@st.composite
def mutated(draw):
    doc = json.loads(json.dumps(BASE))
    for _ in range(draw(st.integers(1, 4))):
        if draw(st.booleans()):  # a field the scenario has, a value of its own type
            path, old = draw(st.sampled_from(_leaves(doc)))
            same = {bool: st.booleans(), int: st.sampled_from([0, 1, 2, 3, 4, 8, 16, 64, 512, 4096, 10**6]),
                    float: st.sampled_from([0.0, 1e-6, 0.5, 1.0, 3.0, 50.0, 1e4])}.get(type(old), PLAUSIBLE)
            _set(doc, path, copy.deepcopy(draw(same)))
        else:  # any field of the schema, any value (a copy: st.just's objects are shared between examples)
            _set(doc, draw(st.sampled_from(PATHS)), copy.deepcopy(draw(st.one_of(PLAUSIBLE, VALUES))))
    return yaml.safe_dump(doc, allow_unicode=True)


@st.composite
def corrupted(draw):
    text = yaml.safe_dump(BASE)
    for _ in range(draw(st.integers(1, 3))):
        op = draw(st.sampled_from(["delete", "insert", "replace", "dup-line", "drop-line", "truncate"]))
        i = draw(st.integers(0, max(len(text) - 1, 0)))
        ch = draw(st.one_of(st.sampled_from(list(":-{}[]&*!|>'\"#%@`,? \t\n0123456789e.") + ["\x00", "\x07", "\ufeff"]),
                            st.characters()))
        lines = text.splitlines(keepends=True)
        j = draw(st.integers(0, max(len(lines) - 1, 0)))
        if op == "delete":
            text = text[:i] + text[i + 1:]
        elif op == "insert":
            text = text[:i] + ch + text[i:]
        elif op == "replace":
            text = text[:i] + ch + text[i + 1:]
        elif op == "dup-line" and lines:
            text = "".join(lines[:j + 1] + lines[j:])
        elif op == "drop-line" and lines:
            text = "".join(lines[:j] + lines[j + 1:])
        elif op == "truncate":
            text = text[:i]
    return text


STATS = {"runs": 0, "ok": 0, "exit2": 0, "slowest_s": 0.0}


def _alarm(signum, frame):
    raise TimeoutError(f"a run took over {HANG_S} s")


@settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much])
@given(text=st.one_of(mutated(), corrupted()))
def test_generated_scenarios_never_trace_back(text, tmp_path_factory):
    path = tmp_path_factory.getbasetemp() / "prop.yaml"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(HANG_S)
    t0 = time.perf_counter()
    try:
        r = CliRunner().invoke(main, ["simulate", str(path), "--format", "json", "--max-work", MAX_WORK])
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    STATS["runs"] += 1
    STATS["slowest_s"] = max(STATS["slowest_s"], time.perf_counter() - t0)
    if r.exception is not None and not isinstance(r.exception, SystemExit):
        raise AssertionError(f"traceback for:\n{text}\n") from r.exception
    assert r.exit_code in (0, 2), (r.exit_code, r.output)
    if r.exit_code == 0:
        STATS["ok"] += 1
        json.loads(r.stdout)  # valid JSON: no NaN, no Infinity
    else:
        STATS["exit2"] += 1
        lines = r.stderr.strip().splitlines()
        assert lines and all(line.startswith("error: ") for line in lines), r.stderr
        kind = ("work limit" if "work limit" in lines[0] else "yaml" if "YAML" in lines[0] or "UTF-8" in lines[0]
                else "scenario")
        STATS[kind] = STATS.get(kind, 0) + 1


def test_report_counts():
    """Runs after the property (same module, in order): at least EXAMPLES scenarios ran."""
    print(f"\nproperty: {STATS}")
    assert STATS["runs"] >= EXAMPLES
