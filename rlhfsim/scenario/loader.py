"""Loading a scenario from YAML: ``defaults:`` mixins merged first, then pydantic validation, then the
cross-field checks. Every failure is one ScenarioError naming the YAML path, what was expected and what
was given."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from rlhfsim.errors import ScenarioError
from rlhfsim.scenario.schema import Scenario


def deep_merge(base: dict, over: dict) -> dict:
    """``over`` wins; nested mappings merge key by key; lists and scalars are replaced."""
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = v
    return out


def read_yaml(path: Path, what: str = "scenario") -> dict:
    if not path.is_file():
        raise ScenarioError("", f"{what}: expected a YAML file, got {str(path)!r} (no such file)")
    try:
        doc = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ScenarioError("", f"{path.name}: expected valid YAML, got a syntax error{where}: {problem}") from None
    except OSError as e:
        raise ScenarioError("", f"{what}: expected a readable file, got {str(path)!r} ({e.strerror})") from None
    except UnicodeDecodeError:
        raise ScenarioError("", f"{path.name}: expected a UTF-8 text YAML file, got undecodable bytes") from None
    if doc is None:
        doc = {}
    if not isinstance(doc, dict):
        raise ScenarioError("", f"{path.name}: expected a mapping at the top level, got {type(doc).__name__}")
    return doc


def resolve_defaults(doc: dict, base_dir: Path, seen: tuple = ()) -> dict:
    """Merge the ``defaults:`` mixins (files whose names start with ``_``, relative to the scenario),
    in order, under the document itself."""
    defaults = doc.pop("defaults", None)
    if defaults is None:
        return doc
    if isinstance(defaults, str):
        defaults = [defaults]
    if not isinstance(defaults, list) or not all(isinstance(d, str) for d in defaults):
        raise ScenarioError("defaults", f"expected a list of mixin file names, got {defaults!r}")
    merged: dict = {}
    for i, name in enumerate(defaults):
        fname = name if name.endswith((".yaml", ".yml")) else f"{name}.yaml"
        if not Path(fname).name.startswith("_"):
            raise ScenarioError(f"defaults[{i}]", f"expected a mixin file name starting with '_', got {name!r}")
        p = (base_dir / fname).resolve()
        if p in seen:
            raise ScenarioError(f"defaults[{i}]", f"expected no cycles, got {name!r} included twice")
        if not p.is_file():
            raise ScenarioError(f"defaults[{i}]", f"expected a mixin file next to the scenario, got {name!r} (no such file: {p})")
        sub = resolve_defaults(read_yaml(p, "mixin"), p.parent, seen + (p,))
        merged = deep_merge(merged, sub)
    return deep_merge(merged, doc)


def _fmt_path(loc: tuple, data: Any) -> str:
    """Turn a pydantic location into a YAML path, dropping the union tags pydantic inserts.

    A tag (``pools`` of ``kind: pools``, ``model`` of a reward whose kind defaults to ``model``) can
    also be a key of the same mapping, so each element is read as a key first unless it equals the
    mapping's ``kind``, and the other reading is used when the rest of the location does not fit the
    document."""
    parts = _resolve(tuple(loc), data, False)
    if parts is None:  # the document does not have this shape at all: keep every element
        parts = [f"[{el}]" if isinstance(el, int) else _key(el) for el in loc]
    return "".join(p if p.startswith("[") or i == 0 else "." + p for i, p in enumerate(parts))


def _resolve(loc: tuple, node: Any, tag_skipped: bool) -> list[str] | None:
    """Path parts for ``loc`` inside ``node``, or None if it does not fit (the last element may be
    missing: that is what a ``missing`` error points at)."""
    if not loc:
        return []
    el, rest = loc[0], loc[1:]
    if isinstance(el, int):
        if isinstance(node, list) and el < len(node):
            sub = _resolve(rest, node[el], False)
            return None if sub is None else [f"[{el}]"] + sub
        return [f"[{el}]"] if not rest else None
    as_key = None
    if isinstance(node, dict) and (el in node or not rest):
        sub = _resolve(rest, node.get(el), False)
        as_key = None if sub is None else [_key(el)] + sub
    as_tag = None
    if isinstance(node, dict) and not tag_skipped and (
            node.get("kind", el) == el or el in ("function-after", "function-before")):
        as_tag = _resolve(rest, node, True)
    if isinstance(node, dict) and node.get("kind") == el:
        return as_tag if as_tag is not None else as_key
    return as_key if as_key is not None else as_tag


def _key(k: Any) -> str:
    """A mapping key as it goes into a path: quoted when empty or not printable on one line."""
    k = str(k)
    return k if k and k.isprintable() and k.strip() == k else repr(k)


def _given(v: Any) -> str:
    if isinstance(v, (dict, list)):
        s = json.dumps(v, default=str)
        return s if len(s) < 60 else s[:57] + "..."
    return repr(v)


# pydantic error types whose message is just "expected <this>, got <the input>".
EXPECTED = {
    **dict.fromkeys(("int_parsing", "int_type", "int_from_float"), "an integer"),
    **dict.fromkeys(("float_parsing", "float_type"), "a number"),
    **dict.fromkeys(("bool_parsing", "bool_type"), "true or false"),
    "string_type": "a string",
    **dict.fromkeys(("model_type", "model_attributes_type", "dict_type"), "a mapping"),
    "list_type": "a list",
}


def _message(err: dict) -> str:
    t, ctx, inp = err["type"], err.get("ctx") or {}, err.get("input")
    msg = err["msg"]
    if t == "extra_forbidden":
        return f"expected a known key, got unknown key (value {_given(inp)})"
    if t == "missing":
        return "expected a value, got nothing (required)"
    if t in ("greater_than_equal", "greater_than", "less_than_equal", "less_than"):
        op = {"greater_than_equal": ">=", "greater_than": ">", "less_than_equal": "<=", "less_than": "<"}[t]
        bound = next(iter(ctx.values()))
        return f"expected a number {op} {bound}, got {_given(inp)}"
    if t in EXPECTED:
        return f"expected {EXPECTED[t]}, got {_given(inp)}"
    if t == "literal_error":
        return f"expected one of {ctx.get('expected')}, got {_given(inp)}"
    if t == "union_tag_invalid":
        return f"expected kind one of {ctx.get('expected_tags')}, got {ctx.get('tag')!r}"
    if t == "union_tag_not_found":
        return f"expected a mapping with a `kind:` key, got {_given(inp)}"
    if t == "too_short":
        return f"expected at least {ctx.get('min_length')} item(s), got {_given(inp)}"
    if t == "value_error":
        return msg.removeprefix("Value error, ")
    return f"expected {msg[0].lower() + msg[1:]}, got {_given(inp)}"


def validate_model(cls: type[BaseModel], data: dict, prefix: str = "") -> BaseModel:
    """Validate ``data`` as ``cls``; the first error becomes a ScenarioError with its YAML path."""
    try:
        return cls.model_validate(data)
    except ValidationError as e:
        err = e.errors(include_url=False)[0]
        loc = err["loc"]
        if err["type"] in ("union_tag_invalid",):
            loc = tuple(loc) + ("kind",)
        path = _fmt_path(tuple(loc), data)
        if prefix:
            path = f"{prefix}.{path}" if path else prefix
        raise ScenarioError(path, _message(err)) from None


def load_scenario(source: str | Path | dict, base_dir: Path | None = None, check: bool = True) -> Scenario:
    """Load and validate a scenario from a YAML path or an already-parsed mapping. With ``check`` (the
    default) the cross-field checks of ``rlhfsim.scenario.checks`` run too."""
    if isinstance(source, dict):
        try:
            doc = json.loads(json.dumps(source))  # a deep copy that also rejects non-JSON values early
        except (TypeError, ValueError) as e:
            raise ScenarioError("", f"scenario: expected a mapping of YAML/JSON values, got {e}") from None
        base_dir = base_dir or Path.cwd()
    else:
        path = Path(source)
        doc = read_yaml(path)
        base_dir = path.resolve().parent
    doc = resolve_defaults(doc, base_dir)
    sc = validate_model(Scenario, doc)
    sc._base_dir = base_dir
    if check:
        from rlhfsim.scenario.checks import build_setup

        build_setup(sc)
    return sc
