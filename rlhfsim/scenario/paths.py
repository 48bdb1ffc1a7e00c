"""Dotted scenario paths (``cluster.gpu``, ``placement.pools[1].gpus``): parsing, checking against the
scenario schema, and setting a value in a scenario mapping (``--set`` and the planner's axes).

Setting rules (applied to the fully dumped scenario, so every defaulted block exists):

- A value replaces what is at the path; a mapping replaces the whole block.
- ``X.kind: K`` on a block of another kind switches the block to kind K and keeps only the keys that
  K accepts (``placement.kind: colocated`` keeps ``tp``; ``schedule.kind: sync`` drops ``intra``).
- A path below a block whose current kind has no such key does not apply to that configuration and
  is skipped (``schedule.intra.chunk_tokens`` when the schedule is ``sync``): the configuration then
  repeats another one and is simulated once.
"""

from __future__ import annotations

import re
import types
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel

from rlhfsim.scenario.schema import Scenario

_PART = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)((?:\[\d+\])*)")
_INDEX = re.compile(r"\[(\d+)\]")


class PathError(ValueError):
    """A path that names nothing in the scenario schema, or an index that is out of range."""


def parse_path(path: str) -> tuple[str | int, ...]:
    """``"placement.pools[1].gpus"`` -> ``("placement", "pools", 1, "gpus")``."""
    if not isinstance(path, str) or not path:
        raise PathError(f"expected a dotted scenario path like 'cluster.gpu', got {path!r}")
    parts: list[str | int] = []
    for piece in path.split("."):
        m = _PART.fullmatch(piece)
        if m is None:
            raise PathError(f"expected a dotted scenario path like 'placement.pools[1].gpus', got {path!r}")
        parts.append(m.group(1))
        parts.extend(int(i) for i in _INDEX.findall(m.group(2)))
    return tuple(parts)


def format_path(parts: tuple[str | int, ...]) -> str:
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (("." if out else "") + p)
    return out


def _flatten(tp: Any) -> list:
    """The concrete alternatives of an annotation: Annotated and Optional/Union unwrapped."""
    origin = get_origin(tp)
    if origin is Annotated:
        return _flatten(get_args(tp)[0])
    if origin is Union or origin is types.UnionType:
        return [m for a in get_args(tp) for m in _flatten(a)]
    return [tp]


def _models(cands: list) -> list[type[BaseModel]]:
    return [t for t in cands if isinstance(t, type) and issubclass(t, BaseModel)]


def _kinds(model: type[BaseModel]) -> tuple:
    f = model.model_fields.get("kind")
    if f is None:
        return ()
    return tuple(a for t in _flatten(f.annotation) if get_origin(t) is Literal for a in get_args(t))


def check_path(parts: tuple[str | int, ...]) -> None:
    """Raise PathError unless the path names a field of the scenario schema (through any kind)."""
    cands: list = [Scenario]
    for i, p in enumerate(parts):
        where = format_path(parts[:i]) or "the scenario"
        nxt: list = []
        if isinstance(p, int):
            for t in cands:
                if get_origin(t) is list:
                    nxt += _flatten(get_args(t)[0])
            if not nxt:
                raise PathError(f"expected {where} to be a list for index [{p}], but it is not one")
        else:
            models = _models(cands)
            for m in models:
                if p in m.model_fields:
                    nxt += _flatten(m.model_fields[p].annotation)
            if not nxt:
                keys = sorted({k for m in models for k in m.model_fields})
                if not keys:
                    raise PathError(f"expected {where} to be a mapping for key {p!r}, but it is a value")
                raise PathError(f"expected a key of {where} ({', '.join(keys)}), got unknown key {p!r}")
        cands = nxt


def _member(cands: list, node: dict) -> list[type[BaseModel]]:
    """The schema classes a mapping can be: narrowed by its ``kind`` when the block is a union."""
    models = _models(cands)
    if len(models) > 1 and isinstance(node, dict) and "kind" in node:
        chosen = [m for m in models if node["kind"] in _kinds(m)]
        return chosen or models
    return models


def set_path(doc: dict, parts: tuple[str | int, ...], value: Any) -> bool:
    """Set ``value`` at ``parts`` in ``doc`` in place, following the rules of the module docstring.
    Returns False when the path does not apply to this configuration (nothing changed)."""
    cands: list = [Scenario]
    node: Any = doc
    for i, p in enumerate(parts[:-1]):
        if isinstance(p, int):
            if not isinstance(node, list) or p >= len(node):
                size = len(node) if isinstance(node, list) else 0
                raise PathError(f"expected an index below {size} for {format_path(parts[:i]) or 'the scenario'}, got [{p}]")
            cands = [a for t in cands if get_origin(t) is list for a in _flatten(get_args(t)[0])]
            node = node[p]
            continue
        models = _member(cands, node)
        if models and not any(p in m.model_fields for m in models):
            return False  # e.g. schedule.intra.* while the schedule is sync
        cands = [a for m in models if p in m.model_fields for a in _flatten(m.model_fields[p].annotation)]
        if not isinstance(node.get(p), (dict, list)):
            node[p] = {}  # an absent optional block (models.critic: null) is created
        node = node[p]
    last = parts[-1]
    if isinstance(last, int):
        if not isinstance(node, list) or last >= len(node):
            size = len(node) if isinstance(node, list) else 0
            raise PathError(f"expected an index below {size} for {format_path(parts[:-1])}, got [{last}]")
        node[last] = value
        return True
    models = _member(cands, node)
    if models and not any(last in m.model_fields for m in models):
        return False
    if last == "kind" and isinstance(node, dict) and node.get("kind") != value:
        target = [m for m in _models(cands) if value in _kinds(m)]
        if target:
            keep = {k: v for k, v in node.items() if k != "kind" and k in target[0].model_fields}
            node.clear()
            node.update(keep)
    node[last] = value
    return True


def get_path(doc: dict, parts: tuple[str | int, ...]) -> Any:
    node: Any = doc
    for p in parts:
        if isinstance(p, int):
            if not isinstance(node, list) or p >= len(node):
                return None
            node = node[p]
        else:
            if not isinstance(node, dict):
                return None
            node = node.get(p)
    return node
