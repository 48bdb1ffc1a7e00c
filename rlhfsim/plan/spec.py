"""The plan file and its expansion into configurations.

A plan is a base scenario, optional fixed overrides (``set:``), and axes: dotted scenario paths with
lists of values. Configurations are the Cartesian product of the axes (first axis slowest), each one
the base scenario with its axis values set (see ``rlhfsim.scenario.paths`` for the setting rules) and
validated. Everything that can be wrong with the plan itself is reported here, before anything runs:
an unknown path, a value the scenario schema rejects, an unknown GPU type or model, a scoring runtime
the profile does not have. What makes one configuration unable to run (the model does not fit, more
GPUs placed than exist) is not a plan error: that configuration is listed as infeasible with the
reason from ``rlhfsim.scenario.checks.build_setup``.

Special values:
  ``placement``: a mapping (``{kind: colocated}``), ``colocated``, or ``"N+M"`` (OPPO's ``7+1``):
      dedicated_reward with M reward GPUs, infeasible unless N + M equals the cluster's GPUs. A
      placement without ``tp:`` keeps the ``tp`` block it replaces.
  ``schedule.kind``: a variant name of ``rlhfsim.sim.schedules.VARIANTS`` (the registry's): the block
      ``rlhfsim.sim.run.variant`` builds from the base scenario (``partial``: a token budget of the
      base's max_response_tokens / 4; sweep ``schedule.token_budget`` to change it).
Axes are applied shallowest first, so ``schedule.intra.chunk_tokens`` refines the block that a
``schedule.kind`` value put in place, whatever the order of the axes in the file.
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Literal, Optional, Union

from pydantic import Field

from rlhfsim.costs.model import CostModel
from rlhfsim.errors import RlhfsimError, ScenarioError
from rlhfsim.hardware.catalog import get_gpu
from rlhfsim.models.catalog import load_model
from rlhfsim.scenario.paths import PathError, check_path, format_path, parse_path, set_path
from rlhfsim.scenario.checks import build_setup
from rlhfsim.scenario.loader import load_scenario, read_yaml, validate_model
from rlhfsim.scenario.schema import Frozen, Scenario
from rlhfsim.sim.run import VARIANTS, variant
from rlhfsim.words import count
from rlhfsim.plan.search import Expansion, Search

OBJECTIVES = {"min_step_time": "step_time_s", "min_cost": "cost_per_1000_steps", "min_gpus": "gpus"}


class Heatmap(Frozen):
    x: str = Field(description="Axis path on the heatmap's x axis.")
    y: str = Field(description="Axis path on the heatmap's y axis.")


class PlanFile(Frozen):
    """A what-if sweep over a base scenario (the YAML given to ``rlhfsim plan``)."""

    name: Optional[str] = Field(None, description="Name used in outputs; default: the file name without a leading `plan-`.")
    description: str = Field("", description="Free text.")
    base: Union[str, dict] = Field(description="The base scenario: a YAML path relative to the plan file, or an inline mapping.")
    set: dict[str, Any] = Field({}, description="Dotted scenario path -> value, applied to the base before the axes.")
    axes: dict[str, list[Any]] = Field({}, description="Dotted scenario path -> list of values; configurations are their Cartesian product (a plan has axes or a search, not both).")
    search: Optional[Search] = Field(None, description="A search over parallelism (rlhfsim.plan.search): Megatron's TP/PP/VPP/CP/EP per role, the engine's TP and the split of GPUs between pools, memory-pruned; in place of axes.")
    objective: Literal["min_step_time", "min_cost", "min_gpus"] = Field(
        "min_step_time", description="What the best configuration minimizes (cost: dollars per 1,000 steps).")
    max_step_time_s: Optional[float] = Field(None, gt=0, description="Only configurations at or under this steady-state step time qualify as best (required for min_gpus).")
    prices: dict[str, float] = Field({}, description="Dollars per GPU-hour by GPU type, over the catalog defaults (`rlhfsim gpus`).")
    steps: Optional[int] = Field(None, ge=1, description="Steps simulated per configuration; default: the base scenario's.")
    profile: Optional[str] = Field(None, description="Calibration profile name or JSON path (relative to the plan file); default: bundled.")
    heatmap: Optional[Heatmap] = Field(None, description="Two axes for the report's heatmap; default: the first two axes with several values.")


@dataclass(frozen=True)
class Config:
    """One point of the sweep: its axis values and the scenario they make (or why it cannot run)."""

    index: int
    id: str                     # stable hash of the axis values (what --resume matches on)
    values: dict[str, Any]      # axis path -> value as written in the plan
    doc: Optional[dict]         # the validated scenario mapping; None when infeasible
    reason: str                 # why it cannot run ("" when feasible so far)
    gpu_type: str
    gpus: int
    pools: tuple[str, ...]
    scenario: Optional[Scenario] = None   # a search's configuration: the scenario itself (its doc is made on demand)
    base: bool = False                    # a search's configuration with the base scenario's own parallelism


@dataclass
class Plan:
    """A loaded, checked plan with all its configurations."""

    name: str
    path: Path
    base_dir: Path
    axes: dict[str, list]
    objective: str
    max_step_time_s: Optional[float]
    prices: dict[str, float]
    profiles: dict[str, dict]   # GPU type -> profile document the configurations on it use
    heatmap: Optional[dict]
    configs: list[Config] = field(default_factory=list)
    search: Optional[Expansion] = None   # a parallelism search (rlhfsim.plan.search), its candidates in ``configs``

    @cached_property
    def pools(self) -> list[str]:
        """Pool names over all configurations (``util_<pool>`` and ``active_<pool>`` columns each); read once loaded."""
        return list(dict.fromkeys(p for c in self.configs for p in c.pools))


def config_id(values: dict[str, Any]) -> str:
    """Identity of a configuration: a hash of its axis values (independent of order and position)."""
    text = json.dumps(values, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha1(text.encode()).hexdigest()[:12]


def _placement_value(value: Any, current: Any, where: str) -> tuple[dict, Optional[int]]:
    """A placement axis value as a mapping, and the cluster size an ``N+M`` preset needs."""
    need = None
    if isinstance(value, str):
        v = value.strip().lower()
        if v == "colocated":
            value = {"kind": "colocated"}
        elif "+" in v and all(s.strip().isdigit() for s in v.split("+")) and len(v.split("+")) == 2:
            n, m = (int(s) for s in v.split("+"))
            if n < 1 or m < 1:
                raise ScenarioError(where, f"expected 'N+M' with N, M >= 1, got {value!r}")
            value, need = {"kind": "dedicated_reward", "reward_gpus": m}, n + m
        else:
            raise ScenarioError(where, f"expected a placement mapping, 'colocated' or 'N+M' (e.g. '7+1'), got {value!r}")
    if not isinstance(value, dict):
        raise ScenarioError(where, f"expected a placement mapping, 'colocated' or 'N+M' (e.g. '7+1'), got {value!r}")
    value = copy.deepcopy(value)
    if "tp" not in value and isinstance(current, dict) and "tp" in current:
        value["tp"] = copy.deepcopy(current["tp"])
    return value, need


def _check_lookup(parts: tuple, value: Any, where: str, base_dir: Path) -> None:
    """Values looked up in a catalog are checked here, not left to fail as 'infeasible'."""
    try:
        if parts == ("cluster", "gpu"):
            get_gpu(str(value))
        elif len(parts) == 3 and parts[0] == "models" and parts[2] == "model":
            load_model(str(value), format_path(parts), base_dir)
    except ScenarioError as e:
        raise ScenarioError(where, e.message) from None


class _Applier:
    """Applies (path, value) pairs to scenario mappings, with the special values of the docstring."""

    def __init__(self, base_sc: Scenario):
        self.base_sc = base_sc
        self.schedules: dict[str, dict] = {}

    def apply(self, doc: dict, parts: tuple, value: Any, where: str) -> Optional[int]:
        """Set one value; returns the cluster size an N+M placement needs (else None)."""
        need = None
        if parts == ("placement",):
            value, need = _placement_value(value, doc.get("placement"), where)
        if parts == ("schedule", "kind"):
            if value not in VARIANTS:
                raise ScenarioError(where, f"expected one of {', '.join(VARIANTS)}, got {value!r}")
            if value not in self.schedules:
                self.schedules[value] = variant(self.base_sc, value).schedule.model_dump(mode="json")
            doc["schedule"] = copy.deepcopy(self.schedules[value])
            return None
        try:
            set_path(doc, parts, copy.deepcopy(value))
        except PathError as e:
            raise ScenarioError(where, str(e)) from None
        return need


def _depth(parts: tuple) -> int:
    return len(parts) - (1 if parts[-1] == "kind" else 0)


def _block(path: str) -> str:
    return path[: -len(".kind")] if path.endswith(".kind") else path


def _attribute(e: ScenarioError, values: dict, axes: dict) -> ScenarioError:
    """Turn a schema error of one configuration into a plan error naming the axis value at fault."""
    hits = [a for a in axes if e.path == _block(a) or e.path.startswith(_block(a) + ".")
            or e.path.startswith(_block(a) + "[") or e.path == a]
    if not hits:
        shown = ", ".join(f"{a}={json.dumps(v, default=str)}" for a, v in values.items())
        return ScenarioError("axes", f"configuration {{{shown}}} is not a valid scenario: {e}")
    axis = max(hits, key=len)
    i = next(k for k, v in enumerate(axes[axis]) if v == values[axis])
    return ScenarioError(f"axes.{axis}[{i}]", e.message if e.path == axis else str(e))


def _load_base(pf: PlanFile, plan_dir: Path) -> tuple[Scenario, Path]:
    try:
        if isinstance(pf.base, str):
            path = (plan_dir / pf.base).resolve()
            if not path.is_file():
                raise ScenarioError("base", f"expected a scenario YAML path relative to the plan file, got {pf.base!r} (no such file: {path})")
            return load_scenario(path, check=False), path.parent
        return load_scenario(pf.base, base_dir=plan_dir, check=False), plan_dir
    except ScenarioError as e:
        if e.path == "base":
            raise
        raise ScenarioError(f"base.{e.path}" if e.path else "base", e.message) from None


def _profiles(profile_ref: Optional[str], plan_dir: Path):
    """GPU type -> profile document, loaded once per type (the default differs for the CPU)."""
    ref = profile_ref
    if ref is not None and ref.endswith(".json") and not Path(ref).is_absolute():
        ref = str((plan_dir / ref).resolve())
    cache: dict[str, dict] = {}

    def get(gpu_name: str) -> dict:
        if gpu_name not in cache:
            cache[gpu_name] = CostModel.load(get_gpu(gpu_name), ref).profile
        return cache[gpu_name]

    return get, cache


def _axes(pf: PlanFile, base_dir: Path) -> tuple[dict[str, list], dict[str, tuple]]:
    axes: dict[str, list] = {}
    parsed: dict[str, tuple] = {}
    for key, values in pf.axes.items():
        try:
            parsed[key] = parse_path(key)
            check_path(parsed[key])
        except PathError as e:
            raise ScenarioError(f"axes.{key}", str(e)) from None
        if not values:
            raise ScenarioError(f"axes.{key}", "expected a non-empty list of values, got []")
        for i, v in enumerate(values):
            _check_lookup(parsed[key], v, f"axes.{key}[{i}]", base_dir)
            if values.index(v) != i:
                raise ScenarioError(f"axes.{key}[{i}]", f"expected distinct values, got {v!r} twice")
        axes[key] = values
    return axes, parsed


def _prices(pf: PlanFile) -> dict[str, float]:
    prices = {}
    for key, price in pf.prices.items():
        try:
            name = get_gpu(key).name
        except ScenarioError as e:
            raise ScenarioError(f"prices.{key}", e.message) from None
        if not price > 0:
            raise ScenarioError(f"prices.{key}", f"expected dollars per GPU-hour > 0, got {price!r}")
        prices[name] = float(price)
    return prices


def _heatmap(pf: PlanFile, axes: dict) -> Optional[dict]:
    if pf.heatmap is None:
        several = [a for a, v in axes.items() if len(v) > 1]
        return {"x": several[0], "y": several[1]} if len(several) >= 2 else None
    for k in ("x", "y"):
        if getattr(pf.heatmap, k) not in axes:
            raise ScenarioError(f"heatmap.{k}", f"expected an axis ({', '.join(axes)}), got {getattr(pf.heatmap, k)!r}")
    if pf.heatmap.x == pf.heatmap.y:
        raise ScenarioError("heatmap.y", f"expected an axis other than x, got {pf.heatmap.y!r}")
    return {"x": pf.heatmap.x, "y": pf.heatmap.y}


def load_plan(source: Union[str, Path], overrides: Optional[list[tuple[str, Any]]] = None,
              profile: Optional[str] = None) -> Plan:
    """Read a plan YAML, check it and expand it into configurations (nothing is simulated).
    ``overrides``: (dotted path, value) pairs added to the plan's ``set:`` (``rlhfsim plan --set``);
    ``profile``: a profile name or JSON path (relative to the working directory) in place of the plan's
    ``profile:`` (``rlhfsim plan --profile``)."""
    path = Path(source)
    plan_dir = path.resolve().parent
    doc = read_yaml(path, "plan")
    if profile is not None:
        doc["profile"] = str(Path(profile).resolve()) if profile.endswith(".json") else profile
    if overrides:
        if not isinstance(doc.get("set", {}), dict):
            raise ScenarioError("set", f"expected a mapping of dotted paths to values, got {doc['set']!r}")
        doc["set"] = {**(doc.get("set") or {}), **dict(overrides)}
    pf = validate_model(PlanFile, doc)
    base_sc, base_dir = _load_base(pf, plan_dir)
    base = base_sc.model_dump(mode="json")
    if pf.steps is not None:
        base["steps"], base["warmup_steps"] = pf.steps, min(base["warmup_steps"], pf.steps - 1)
    applier = _Applier(base_sc)
    need_all = None
    for key, value in pf.set.items():
        where = f"set.{key}"
        try:
            parts = parse_path(key)
            check_path(parts)
        except PathError as e:
            raise ScenarioError(where, str(e)) from None
        _check_lookup(parts, value, where, base_dir)
        need_all = applier.apply(base, parts, value, where) or need_all
    try:
        base_sc = load_scenario(base, base_dir=base_dir, check=False)
    except ScenarioError as e:
        raise ScenarioError(f"set.{e.path}" if any(e.path.startswith(k) for k in pf.set) else f"base.{e.path}", e.message) from None
    applier.base_sc = base_sc
    base = base_sc.model_dump(mode="json")

    if pf.search is not None and pf.axes:
        raise ScenarioError("axes", f"expected axes or search, not both (search.parallelism searches its own), got axes {', '.join(pf.axes)}")
    if pf.search is None and not pf.axes:
        raise ScenarioError("axes", "expected axes (dotted scenario paths with lists of values) or search.parallelism, got neither")
    if pf.search is not None:
        return _search_plan(pf, path, base_sc, base_dir, plan_dir)
    axes, parsed = _axes(pf, base_dir)
    if pf.objective == "min_gpus" and pf.max_step_time_s is None:
        raise ScenarioError("max_step_time_s", "expected a step-time bound in seconds for objective min_gpus, got nothing")
    prices, heatmap = _prices(pf), _heatmap(pf, axes)
    profile_of, profiles = _profiles(pf.profile, plan_dir)
    plan = Plan(name=pf.name or path.stem.removeprefix("plan-"), path=path, base_dir=base_dir, axes=axes,
                objective=pf.objective, max_step_time_s=pf.max_step_time_s, prices=prices,
                profiles=profiles, heatmap=heatmap)
    for index, combo in enumerate(itertools.product(*axes.values())):
        values = dict(zip(axes, combo))
        doc, need = copy.deepcopy(base), need_all
        for key in sorted(axes, key=lambda k: _depth(parsed[k])):
            i = axes[key].index(values[key])
            need = applier.apply(doc, parsed[key], values[key], f"axes.{key}[{i}]") or need
        plan.configs.append(_config(index, values, doc, need, plan, profile_of))
    return plan


def _config(index: int, values: dict, doc: dict, need: Optional[int], plan: Plan, profile_of) -> Config:
    """Validate one configuration's mapping (schema errors are plan errors naming the axis value),
    then check it can run (it is infeasible, with the reason, if not)."""
    try:
        sc = load_scenario(doc, base_dir=plan.base_dir, check=False)
    except ScenarioError as e:
        raise _attribute(e, values, plan.axes) from None
    gpu = get_gpu(sc.cluster.gpu)
    gpus = sc.cluster.nodes * sc.cluster.gpus_per_node
    common = dict(index=index, id=config_id(values), values=values, gpu_type=gpu.name, gpus=gpus)
    if need is not None and need != gpus:
        n, m = need - sc.placement.reward_gpus, sc.placement.reward_gpus
        return Config(doc=None, pools=(), **common, reason=(
            f"placement {n}+{m} needs {count(need, 'GPU')}, but the cluster has {gpus} "
            f"({sc.cluster.nodes} node(s) x {sc.cluster.gpus_per_node})"))
    try:
        setup = build_setup(sc)
    except ScenarioError as e:
        return Config(doc=None, pools=(), reason=str(e), **common)
    try:
        prof = profile_of(gpu.name)  # loaded here so a bad profile is a plan error, not N infeasible rows
    except RlhfsimError as e:
        raise ScenarioError("profile", str(e)) from None
    runtime = None if sc.models.reward.kind == "rule" else sc.models.reward.runtime
    if runtime is not None:
        have = sorted(op.split(":", 1)[1] for op in prof["operations"] if op.startswith("score:"))
        if runtime not in have:
            err = ScenarioError("models.reward.runtime", f"expected a scoring runtime of profile {prof['name']!r} "
                                f"on {gpu.name} ({', '.join(have) or 'it has none'}), got {runtime!r}")
            raise _attribute(err, values, plan.axes)
    return Config(doc=sc.model_dump(mode="json"), pools=tuple(p.name for p in setup.pools), reason="", **common)


def _search_plan(pf: PlanFile, path: Path, base_sc: Scenario, base_dir: Path, plan_dir: Path) -> Plan:
    """A plan whose configurations are a parallelism search's candidates (``rlhfsim.plan.search``): the buildable ones,
    each checked by the memory estimate and by ``build_setup`` (infeasible with the reason if either refuses it)."""
    if pf.objective == "min_gpus":
        raise ScenarioError("objective", "expected min_step_time or min_cost with search.parallelism (it searches one GPU count), got 'min_gpus'")
    if pf.heatmap is not None:
        raise ScenarioError("heatmap", "expected no heatmap with search.parallelism (its columns are the roles' degrees), got one")
    try:
        base_setup = build_setup(base_sc)
    except ScenarioError as e:
        raise ScenarioError(f"base.{e.path}" if e.path else "base", e.message) from None
    gpu = base_setup.gpu
    exp = Expansion(pf.search.parallelism, base_sc, base_setup.shapes, gpu.link_domain(base_sc.cluster.gpus_per_node))
    cands = exp.candidates()
    profile_of, profiles = _profiles(pf.profile, plan_dir)
    try:
        profile_of(gpu.name)
    except RlhfsimError as e:
        raise ScenarioError("profile", str(e)) from None
    cols = exp.columns()
    rows = [exp.values(c) for c in cands]
    axes = {c: list(dict.fromkeys(r[c] for r in rows)) for c in cols}
    plan = Plan(name=pf.name or path.stem.removeprefix("plan-"), path=path, base_dir=base_dir, axes=axes,
                objective=pf.objective, max_step_time_s=pf.max_step_time_s, prices=_prices(pf), profiles=profiles,
                heatmap=None, search=exp)
    gpus = base_sc.cluster.nodes * base_sc.cluster.gpus_per_node
    for index, (c, values) in enumerate(zip(cands, rows)):
        sc = exp.scenario(c)
        common = dict(index=index, id=config_id(values), values=values, gpu_type=gpu.name, gpus=gpus, base=c.base)
        why = exp.memory(c, sc, gpu.mem_bytes)
        if why is None:
            try:
                setup = build_setup(sc)
            except ScenarioError as e:
                why = str(e)
        if why is not None:
            plan.configs.append(Config(doc=None, pools=(), reason=why, **common))
        else:
            plan.configs.append(Config(doc=None, pools=tuple(p.name for p in setup.pools), reason="", scenario=sc, **common))
    return plan
