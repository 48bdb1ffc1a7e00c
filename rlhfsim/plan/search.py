"""A plan's search over parallelism (``search: {parallelism: ...}``): Megatron's TP, PP, virtual stages, CP and EP per
trained or forward-only role, the generation engine's TP, and the split of the cluster's GPUs between a generation pool
and a training pool, for one GPU count (the base scenario's cluster).

A plan file::

    search:
      parallelism:
        actor: {tp: [1, 2, 4, 8], pp: [1, 2, 4], vpp: [1, 2], cp: [1, 2], ep: [1, 2, 4, 8, 16, 32]}
        reference: actor          # the actor's layout (default), or a block of its own
        rollout: {tp: [1, 2, 4, 8]}
        pools:                    # default: the base scenario's placement only
          - colocated
          - {generation_gpus: 16, schedule: {kind: async, max_staleness: 1}, weight_sync: nccl}
        refine: 10                # optional: of what the fast path cannot price, simulate the 10 best by a screen

A role left out keeps the base scenario's layout. Candidates are the product of the lists, less the layouts Megatron
cannot build, counted by reason and never simulated: tp x pp x cp dividing the role's pool; TP within one NVLink
domain (the node, an NVL72 rack); pp x vpp dividing the layers and vpp > 1 only with pp > 1; ep > 1 only for a
mixture-of-experts model, dividing its experts and dp x cp; the engine's TP dividing its pool, in one NVLink domain.
The base scenario's own layout is always a candidate (the published one, in the bundled plans), so that the report
can say how the best compares with it. A candidate whose training rank does not fit in memory
(``rlhfsim.plan.memory``) is listed as infeasible with the estimate, not simulated.
"""

from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import dataclass
from typing import Literal, Optional, Union

from pydantic import Field, PositiveInt

from rlhfsim.errors import ScenarioError
from rlhfsim.models.catalog import ModelShape
from rlhfsim.plan import memory as mem
from rlhfsim.scenario.schema import (Colocated, CustomPlacement, Frozen, Megatron, Pool, RoleParallel, Scenario,
                                     TensorParallel)

SEARCHED = ("actor", "critic", "reference")   # the roles Megatron trains or runs forward (placement.tp + execution.megatron)
DEGREES = ("tp", "pp", "vpp", "cp", "ep")


class RoleSearch(Frozen):
    """Candidate degrees of one role (each a list; the product is searched)."""

    tp: list[PositiveInt] = Field([1], min_length=1, description="Tensor-parallel degrees (placement.tp.ROLE).")
    pp: list[PositiveInt] = Field([1], min_length=1, description="Pipeline stages (execution.megatron.ROLE.pp).")
    vpp: list[PositiveInt] = Field([1], min_length=1, description="Virtual stages per pipeline rank (interleaved 1F1B; only with pp > 1).")
    cp: list[PositiveInt] = Field([1], min_length=1, description="Context-parallel degrees.")
    ep: list[PositiveInt] = Field([1], min_length=1, description="Expert-parallel degrees (a mixture-of-experts model only).")


class RolloutSearch(Frozen):
    tp: list[PositiveInt] = Field(min_length=1, description="The generation engine's tensor-parallel degrees (placement.tp.rollout).")


class SplitPools(Frozen):
    """Generation on a pool of its own (the rest trains), as verl's one-step-off and NeMo RL's async recipes run it."""

    generation_gpus: PositiveInt = Field(description="GPUs of the generation pool; the training pool gets the rest.")
    schedule: Optional[dict] = Field(None, description="The schedule block for these configurations (default: the base scenario's; a synchronous schedule leaves one pool idle while the other works).")
    weight_sync: Literal["copy", "nccl"] = Field("nccl", description="How trained weights reach the generation pool (execution.weight_sync.kind).")


class SharedPool(Frozen):
    """Every role on every GPU (``placement.kind: colocated``)."""

    colocated: Literal[True] = True
    schedule: Optional[dict] = Field(None, description="The schedule block for these configurations (default: the base scenario's, or sync where it needs separate pools).")
    weight_sync: Optional[Literal["copy", "reshard"]] = Field(None, description="execution.weight_sync.kind (default: the base scenario's, reshard where it is nccl).")


class MemoryCheck(Frozen):
    check: bool = Field(True, description="Prune candidates whose training rank does not fit (rlhfsim.plan.memory) before simulating them.")
    reserve_gib: float = Field(mem.RESERVE_BYTES / mem.GIB, ge=0, description="GiB per GPU kept for the CUDA context, NCCL and fragmentation.")


class ParallelismSearch(Frozen):
    """What ``search.parallelism`` searches (module docstring)."""

    actor: Optional[RoleSearch] = None
    critic: Union[Literal["actor"], RoleSearch, None] = Field(None, description="`actor` (its layout), a block of its own, or left out: the base scenario's.")
    reference: Union[Literal["actor"], RoleSearch, None] = Field("actor", description="`actor` (its layout: NeMo RL's and verl's reference shares the policy's Megatron settings), a block of its own, or null: the base scenario's.")
    rollout: Optional[RolloutSearch] = None
    pools: list[Union[Literal["colocated"], SplitPools, SharedPool]] = Field([], description="Placements to try: `colocated`, or {generation_gpus: N, schedule: ..., weight_sync: nccl}; default: the base scenario's.")
    memory: MemoryCheck = MemoryCheck()
    refine: Optional[PositiveInt] = Field(None, description="Configurations the fast path cannot price (an async or OPPO schedule, ...): simulate in full only this many, the best by a screen (their synchronous twin priced on the fast path); the rest are listed as screened out. Default: simulate them all.")


class Search(Frozen):
    parallelism: ParallelismSearch


@dataclass(frozen=True)
class Candidate:
    """One point of the search: a layout per searched role, the engine's TP and the placement."""

    layouts: tuple[tuple[str, tuple[int, int, int, int, int]], ...]   # (role, (tp, pp, vpp, cp, ep))
    rollout_tp: int
    pools: int          # index into the search's placements; -1: the base scenario's own
    base: bool = False  # the base scenario's own parallelism

    def layout(self, role: str) -> tuple[int, int, int, int, int]:
        return dict(self.layouts)[role]


def base_layout(sc: Scenario, role: str) -> tuple[int, int, int, int, int]:
    r = getattr(sc.execution.megatron, role)
    return (getattr(sc.placement.tp, role), r.pp, r.vpp, r.cp, r.ep)


def layout_problem(m: ModelShape, lay: tuple, pool_gpus: int, domain: int,
                   base: Optional[RoleParallel] = None) -> Optional[str]:
    """Why Megatron cannot build this layout on a pool of ``pool_gpus`` (None: it can). ``base``: the base scenario's
    block of the role, whose expert tensor parallelism every candidate keeps and whose uneven stage split (first/last
    stage layers) a candidate of the same pp and vpp keeps (``role_block``)."""
    tp, pp, vpp, cp, ep = lay
    g = tp * pp * cp
    if pool_gpus % g:
        return "tp x pp x cp does not divide the pool"
    if tp > domain:
        return "TP beyond one NVLink domain"
    if vpp > 1 and pp == 1:
        return "vpp > 1 without pipeline stages"
    uneven = base is not None and (base.pp, base.vpp) == (pp, vpp) and (
        base.first_stage_layers is not None or base.last_stage_layers is not None)
    if m.layers % (pp * vpp) and not uneven:
        return "pp x vpp does not divide the layers"
    if ep > 1:
        if not m.is_moe:
            return "ep > 1 for a dense model"
        if m.num_experts % ep:
            return "ep does not divide the experts"
        etp = base.etp if base is not None else None
        if etp is None and (pool_gpus // g * cp) % ep:
            return "ep does not divide dp x cp"
        if etp is not None and (pool_gpus // pp) % (ep * etp):
            return "ep x etp does not divide a stage's GPUs"
    return None


def role_block(base: RoleParallel, lay: tuple) -> RoleParallel:
    """The base's ``execution.megatron.ROLE`` with a candidate's degrees: its etp kept, its first/last stage layers kept
    where the candidate has the base's pp and vpp (another pipeline depth splits the layers evenly)."""
    _, pp, vpp, cp, ep = lay
    upd: dict = {"pp": pp, "vpp": vpp, "cp": cp, "ep": ep}
    if (pp, vpp) != (base.pp, base.vpp):
        upd.update(first_stage_layers=None, last_stage_layers=None)
    return base.model_copy(update=upd)


def _label(p) -> str:
    if p == "colocated" or isinstance(p, SharedPool):
        return "colocated"
    return f"split {p.generation_gpus} gen"


class Expansion:
    """The search expanded against a base scenario: candidates, the count excluded by each reason, and the scenario of
    a candidate (built from the base without re-validating the whole mapping: every value set here was checked)."""

    def __init__(self, ps: ParallelismSearch, base: Scenario, shapes: dict[str, ModelShape], gpu_domain: int):
        self.ps, self.base, self.shapes, self.domain = ps, base, shapes, gpu_domain
        self.total = base.cluster.nodes * base.cluster.gpus_per_node
        self.roles = [r for r in SEARCHED if r in shapes]
        self.excluded: Counter = Counter()
        self.placements = list(ps.pools)
        self._schedules: dict[int, object] = {}
        self._check()

    # -- checks of the search block against the base (one-line errors naming the field) -------------------------
    def _check(self) -> None:
        where = "search.parallelism"
        for role in ("critic",):
            if getattr(self.ps, role) is not None and role not in self.shapes:
                raise ScenarioError(f"{where}.{role}", f"expected no {role} search: the base scenario has no {role} model")
        for i, p in enumerate(self.placements):
            if isinstance(p, SplitPools) and p.generation_gpus >= self.total:
                raise ScenarioError(f"{where}.pools[{i}].generation_gpus",
                                    f"expected fewer than the cluster's {self.total} GPUs, got {p.generation_gpus}")
        for role in ("actor", "critic", "reference"):
            block = getattr(self.ps, role)
            if isinstance(block, RoleSearch):
                for k in DEGREES:
                    vals = getattr(block, k)
                    if len(set(vals)) != len(vals):
                        raise ScenarioError(f"{where}.{role}.{k}", f"expected distinct values, got {vals}")
                    if k == "ep" and any(v > 1 for v in vals) and not self.shapes[role].is_moe:
                        raise ScenarioError(f"{where}.{role}.ep", f"expected [1] for the dense model {self.shapes[role].name}, got {vals}")

    def _role_options(self, role: str) -> list[tuple]:
        block = getattr(self.ps, role)
        if role == "actor" and block is None:
            return [base_layout(self.base, role)]
        if block is None or block == "actor":
            return [None]   # the base's (None) or the actor's (resolved per candidate)
        return list(itertools.product(*(getattr(block, k) for k in DEGREES)))

    def _pool_sizes(self, p) -> tuple[int, int]:
        """(training GPUs, generation GPUs) of a placement option (-1: the base's)."""
        if p is None:
            pl = self.base.placement
            if isinstance(pl, CustomPlacement):
                gen = [q for q in pl.pools if q.roles == ["rollout"]]
                if gen:
                    return self.total - gen[0].gpus, gen[0].gpus
            return self.total, self.total
        if p == "colocated" or isinstance(p, SharedPool):
            return self.total, self.total
        return self.total - p.generation_gpus, p.generation_gpus

    def candidates(self) -> list[Candidate]:
        """Every buildable candidate, the base's first; what cannot be built is counted in ``excluded``."""
        out: list[Candidate] = []
        seen = set()
        base = self.base_candidate()
        out.append(base)
        options = {r: self._role_options(r) for r in self.roles}
        rollout = self.ps.rollout.tp if self.ps.rollout is not None else [self.base.placement.tp.rollout or self.base.placement.tp.actor]
        places = list(range(len(self.placements))) or [-1]
        for pi in places:
            train_gpus, gen_gpus = self._pool_sizes(self.placements[pi] if pi >= 0 else None)
            for combo in itertools.product(*(options[r] for r in self.roles)):
                lays = dict(zip(self.roles, combo))
                for r in self.roles:
                    if lays[r] is None:
                        lays[r] = lays["actor"] if getattr(self.ps, r) == "actor" else base_layout(self.base, r)
                bad = next((f"{r}: {why}" for r in self.roles
                            if (why := layout_problem(self.shapes[r], lays[r], train_gpus, self.domain,
                                                      getattr(self.base.execution.megatron, r)))), None)
                if bad:
                    self.excluded[bad] += len(rollout)
                    continue
                for rtp in rollout:
                    if gen_gpus % rtp or rtp > self.domain:
                        self.excluded["rollout: TP does not divide the generation pool or leaves the NVLink domain"] += 1
                        continue
                    key = tuple((r, lays[r]) for r in self.roles) + (rtp, pi)
                    if key in seen:
                        continue
                    seen.add(key)
                    out.append(Candidate(tuple((r, lays[r]) for r in self.roles), rtp, pi))
        return out

    def base_candidate(self) -> Candidate:
        """The base scenario's own parallelism, on its own placement, schedule and weight update (``pools`` -1)."""
        lays = tuple((r, base_layout(self.base, r)) for r in self.roles)
        return Candidate(lays, self.base.placement.tp.rollout or self.base.placement.tp.actor, -1, base=True)

    # -- a candidate's columns and scenario ---------------------------------------------------------------------
    def columns(self) -> list[str]:
        cols = []
        for r in self.roles:
            block = getattr(self.ps, r)
            if r == "actor" or isinstance(block, RoleSearch):
                cols += [f"{r}.{k}" for k in DEGREES]
        return cols + ["rollout.tp", "pools"]

    def values(self, c: Candidate) -> dict:
        lays = dict(c.layouts)
        out = {}
        for col in self.columns()[:-2]:
            role, k = col.split(".")
            out[col] = lays[role][DEGREES.index(k)]
        out["rollout.tp"] = c.rollout_tp
        out["pools"] = "base" if c.pools < 0 else _label(self.placements[c.pools])
        return out

    def scenario(self, c: Candidate) -> Scenario:
        """The base scenario with the candidate's parallelism (frozen models copied with updates: no re-validation of
        the whole mapping; the values were checked above and ``build_setup`` checks the rest)."""
        b = self.base
        lays = dict(c.layouts)
        tp = {r: getattr(b.placement.tp, r) for r in ("actor", "critic", "reference", "reward")}
        tp.update({r: lays[r][0] for r in lays})
        tpb = TensorParallel(**tp, rollout=c.rollout_tp)
        meg = Megatron(**{r: role_block(getattr(b.execution.megatron, r), lays[r]) if r in lays
                          else getattr(b.execution.megatron, r) for r in SEARCHED})
        ex_update: dict = {"megatron": meg}
        upd: dict = {}
        p = self.placements[c.pools] if c.pools >= 0 else None
        if p is None:
            upd["placement"] = b.placement.model_copy(update={"tp": tpb})
        elif p == "colocated" or isinstance(p, SharedPool):
            upd["placement"] = Colocated(tp=tpb)
            ws = p.weight_sync if isinstance(p, SharedPool) else None
            kind = ws or ("reshard" if b.execution.weight_sync.kind == "nccl" else b.execution.weight_sync.kind)
            ex_update["weight_sync"] = b.execution.weight_sync.model_copy(update={"kind": kind, "packed": False})
            sched = p.schedule if isinstance(p, SharedPool) else None
            if sched is not None:
                upd["schedule"] = sched
            elif b.schedule.kind == "async":
                upd["schedule"] = {"kind": "sync"}
        else:
            train_roles = [r for r in ("actor", "critic", "reference", "reward") if r in self.shapes or
                           (r == "reward" and b.models.reward.kind == "model")]
            upd["placement"] = CustomPlacement(pools=[Pool(name="train", gpus=self.total - p.generation_gpus, roles=train_roles),
                                                      Pool(name="rollout", gpus=p.generation_gpus, roles=["rollout"])], tp=tpb)
            # packed is the bucketed form of nccl only (scenario check); a searched copy drops it
            ex_update["weight_sync"] = b.execution.weight_sync.model_copy(
                update={"kind": p.weight_sync, "packed": b.execution.weight_sync.packed and p.weight_sync == "nccl"})
            if p.schedule is not None:
                upd["schedule"] = p.schedule
        upd["execution"] = b.execution.model_copy(update=ex_update)
        if isinstance(upd.get("schedule"), dict):
            if c.pools not in self._schedules:
                from rlhfsim.scenario.loader import validate_model

                try:
                    self._schedules[c.pools] = validate_model(Scenario, {**b.model_dump(mode="json"), "schedule": upd["schedule"]}).schedule
                except ScenarioError as e:
                    raise ScenarioError(f"search.parallelism.pools[{c.pools}].{e.path}", e.message) from None
            upd["schedule"] = self._schedules[c.pools]
        sc = b.model_copy(update=upd)
        sc._base_dir = b.base_dir
        return sc

    def memory(self, c: Candidate, sc: Scenario, gpu_mem: float) -> Optional[str]:
        """Why a candidate's training rank does not fit (None: it fits, or the check is off)."""
        if not self.ps.memory.check:
            return None
        mb = sc.execution.micro_batch
        w = sc.workload
        lays = dict(c.layouts)
        train_gpus, _ = self._pool_sizes(self.placements[c.pools] if c.pools >= 0 else None)
        reserve = self.ps.memory.reserve_gib * mem.GIB
        for role in ("actor", "critic"):
            if role not in lays:
                continue
            tp, pp, vpp, cp, ep = lays[role]
            blk = getattr(sc.execution.megatron, role)   # the candidate's block: the base's etp and stage split kept
            lay = mem.RankLayout(tp, pp, vpp, cp, ep, train_gpus, blk.etp, blk.first_stage_layers, blk.last_stage_layers)
            if mb.use_dynamic_bsz:
                tokens = (mb.critic_ppo_max_token_len_per_gpu if role == "critic" and mb.critic_ppo_max_token_len_per_gpu
                          else mb.ppo_max_token_len_per_gpu) * cp
            else:
                rows = (mb.critic_ppo_micro_batch_size_per_gpu if role == "critic" and mb.critic_ppo_micro_batch_size_per_gpu
                        else mb.ppo_micro_batch_size_per_gpu) or 1
                tokens = rows * (w.max_prompt_tokens + w.max_response_tokens)
            est = mem.training_rank(self.shapes[role], getattr(sc.models, role).dtype, lay, tokens,
                                    sc.execution.gradient_checkpointing)
            est = mem.RankMemory(est.weights, est.grads, est.optimizer, est.activations, est.logits, est.resident, reserve)
            if est.total > gpu_mem:
                return (f"memory: a {role} training rank needs an estimated {est.describe()}, "
                        f"over the GPU's {gpu_mem / mem.GIB:.1f} GiB")
        return None
