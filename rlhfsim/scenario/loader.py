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


MAX_DEPTH = 32          # levels of nesting a scenario document may have (the schema needs 8)
MAX_NODES = 100_000     # values (mappings, lists, scalars) counted with YAML aliases expanded
MAX_ERRORS = 20         # validation errors reported at once
MAX_BYTES = 16 << 20    # a scenario, plan or mixin file (the bundled ones are a few kB)


def check_document(doc: Any, name: str) -> None:
    """Refuse documents no scenario needs before anything recursive reads them: nesting deeper than
    MAX_DEPTH, more than MAX_NODES values (YAML aliases counted each time they are used: a few lines can
    otherwise expand into billions), strings with NUL bytes (no path or name can hold one)."""
    stack = [(doc, "", 0)]
    nodes = 0
    while stack:
        node, path, depth = stack.pop()
        nodes += 1
        if nodes > MAX_NODES:
            raise ScenarioError(path or name, f"expected a document of at most {MAX_NODES:,} values (YAML aliases counted each time they are used), got more")
        if depth > MAX_DEPTH:
            raise ScenarioError(path or name, f"expected at most {MAX_DEPTH} levels of nesting, got deeper")
        if isinstance(node, dict):
            for k, v in node.items():
                if isinstance(k, str) and "\x00" in k:
                    raise ScenarioError(path or name, f"expected keys without NUL bytes, got {k!r}")
                stack.append((v, f"{path}.{_key(k)}" if path else _key(k), depth + 1))
        elif isinstance(node, list):
            for i, v in enumerate(node):
                stack.append((v, f"{path}[{i}]", depth + 1))
        elif isinstance(node, str) and "\x00" in node:
            raise ScenarioError(path or name, f"expected text without NUL bytes, got {_given(node)}")


def read_yaml(path: Path, what: str = "scenario") -> dict:
    try:
        found = path.is_file()
    except (OSError, ValueError) as e:  # a NUL byte or an over-long name
        raise ScenarioError("", f"{what}: expected a readable file name, got {str(path)!r} ({e})") from None
    if not found:
        raise ScenarioError("", f"{what}: expected a YAML file, got {str(path)!r} (no such file)")
    try:
        size = path.stat().st_size
    except OSError as e:
        raise ScenarioError("", f"{what}: expected a readable file, got {str(path)!r} ({e.strerror})") from None
    if size > MAX_BYTES:
        raise ScenarioError("", f"{path.name}: expected a YAML file of at most {MAX_BYTES >> 20} MiB, got {size:,} bytes")
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
    except RecursionError:
        raise ScenarioError("", f"{path.name}: expected at most {MAX_DEPTH} levels of nesting, got a document too deep to parse") from None
    if doc is None:
        doc = {}
    if not isinstance(doc, dict):
        raise ScenarioError("", f"{path.name}: expected a mapping at the top level, got {type(doc).__name__}")
    check_document(doc, path.name)
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
        raise ScenarioError("defaults", f"expected a list of mixin file names, got {_given(defaults)}")
    merged: dict = {}
    for i, name in enumerate(defaults):
        fname = name if name.endswith((".yaml", ".yml")) else f"{name}.yaml"
        if not Path(fname).name.startswith("_"):
            raise ScenarioError(f"defaults[{i}]", f"expected a mixin file name starting with '_', got {name!r}")
        try:
            p = (base_dir / fname).resolve()
            found = p.is_file()
        except (OSError, ValueError) as e:  # a NUL byte or an over-long name
            raise ScenarioError(f"defaults[{i}]", f"expected a mixin file name, got {name!r} ({e})") from None
        if p in seen:
            raise ScenarioError(f"defaults[{i}]", f"expected no cycles, got {name!r} included twice")
        if not found:
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
    if t == "finite_number":
        return f"expected a finite number, got {_given(inp)}"
    if t in ("greater_than_equal", "greater_than", "less_than_equal", "less_than"):
        op = {"greater_than_equal": ">=", "greater_than": ">", "less_than_equal": "<=", "less_than": "<"}[t]
        bound = next(iter(ctx.values()))
        if isinstance(bound, float) and bound.is_integer() and abs(bound) < 1e15:
            bound = int(bound)
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
    """Validate ``data`` as ``cls``. Every error (up to MAX_ERRORS) becomes a ScenarioError with its YAML
    path: the first is raised, the others ride along in its ``more``."""
    try:
        return cls.model_validate(data)
    except ValidationError as e:
        found: list[ScenarioError] = []
        for err in e.errors(include_url=False)[:MAX_ERRORS]:
            loc = err["loc"]
            if err["type"] in ("union_tag_invalid",):
                loc = tuple(loc) + ("kind",)
            path = _fmt_path(tuple(loc), data)
            if prefix:
                path = f"{prefix}.{path}" if path else prefix
            new = ScenarioError(path, _message(err))
            if all(str(new) != str(f) for f in found):
                found.append(new)
        if e.error_count() > MAX_ERRORS:
            found.append(ScenarioError("", f"... and {e.error_count() - MAX_ERRORS} more error(s)"))
        raise ScenarioError(found[0].path, found[0].message, found[1:]) from None


def parse_set(item: str) -> tuple[str, Any]:
    """``--set path=value``: a dotted scenario path (as the planner's axes write them) and a YAML value
    (``56``, ``null``, ``[128, 256]``, ``{kind: sync}``)."""
    path, sep, text = item.partition("=")
    if not sep or not path.strip():
        raise ScenarioError("--set", f"expected path=value (e.g. workload.prompts_per_step=56), got {item!r}")
    try:
        value = yaml.safe_load(text) if text.strip() else None
    except yaml.YAMLError as e:
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ScenarioError(f"--set {path.strip()}", f"expected a YAML value, got {text!r} ({problem})") from None
    return path.strip(), value


def apply_overrides(doc: dict, overrides: list[tuple[str, Any]]) -> dict:
    """Set each (dotted path, value) in the merged document, in order (``rlhfsim.scenario.paths`` rules)."""
    from rlhfsim.scenario.paths import PathError, check_path, parse_path, set_path

    for path, value in overrides:
        try:
            parts = parse_path(path)
            check_path(parts)
            if not set_path(doc, parts, value):
                raise PathError(f"expected a path that applies to this scenario's blocks, got {path!r} "
                                f"(its block is of another kind; set its `kind` first)")
        except PathError as e:
            raise ScenarioError(f"--set {path}", str(e)) from None
        except (AttributeError, TypeError):  # a value where the path needs a mapping or a list
            raise ScenarioError(f"--set {path}", f"expected {path!r} to lead through mappings, got a value on the way") from None
    return doc


def load_scenario(source: str | Path | dict, base_dir: Path | None = None, check: bool = True,
                  overrides: list[tuple[str, Any]] | None = None) -> Scenario:
    """Load and validate a scenario from a YAML path or an already-parsed mapping. ``overrides``:
    (dotted path, value) pairs set after the mixins are merged (``--set``). With ``check`` (the default)
    the cross-field checks of ``rlhfsim.scenario.checks`` run too."""
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
        if "axes" in doc and "base" in doc and "models" not in doc:
            raise ScenarioError("", f"{path.name}: expected a scenario, got a plan file (it has `base:` and `axes:`); "
                                f"run it with `rlhfsim plan {source}`")
    check_document(doc, "scenario")
    doc = resolve_defaults(doc, base_dir)
    if overrides:
        doc = apply_overrides(doc, overrides)
        check_document(doc, "scenario")
    sc = validate_model(Scenario, doc)
    sc._base_dir = base_dir
    if check:
        from rlhfsim.scenario.checks import build_setup

        build_setup(sc)
    return sc
