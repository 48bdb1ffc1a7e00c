"""The profile terms a run's logged phases can identify, and reading and writing them by profile path.

A term is a concept (``engine_host_s``) with candidate profile paths, the first present in the base profile
being the one fitted (``{gen}``: the run's generation runtime, so a profile without ``decode:vllm_eager`` fits
the plain ``decode`` that prices it; a profile with a ``forward`` operation fits its efficiency instead of
``prefill``'s). Nothing here depends on how the cost model uses a key: the fit (``rlhfsim.fromrun.fit``) measures
each term's effect by re-simulating, so a term the cost model stops reading simply drops out as unidentified.

Parameterisation (what the least-squares fit moves): an efficiency e as x = ln e, bounded to (0.001, 1]
(above 1 is not physical); a time in seconds s as x = s / scale, bounded below by 0; a share (the part of the
engine's host work hidden behind the device) as itself, bounded to [0, 1]. ``scale`` is a numerical
unit of the fit, the order of the term's magnitude, not a result: it sets the finite-difference step and the
relevance test (a term is relevant when moving it by one unit, or an efficiency by a factor of 2, moves some
logged phase by 2% or more).

Pooling (``pooled``; ``rlhfsim.fromrun.pool`` fits many runs at once): ``host`` for a term that is time on the host
CPU in the software (the engine's host work per step and its eager launches per layer, the framework's dispatch per
layer and per micro-batch, FSDP's per unit, the advantage on the driver), one value whatever the GPU, stated for the
profile's reference host (``rlhfsim.costs.hostscale`` carries it to each run's server CPU); ``device`` for an
efficiency of the accelerator (and its host link), stated for the profile's GPU and carried to another
(``rlhfsim.costs.model.with_stack_rate``), pooled as ``rlhfsim.fromrun.pool.POOLINGS`` says.

Priority (the order of ``TERMS``): when two terms move the same phases alike (a single run's training phases
cannot tell a per-micro-batch overhead from an efficiency when every micro-batch is the same size), the earlier
one is fitted and the later one reported as confounded with it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from rlhfsim.costs.genruntimes import pricing_names
from rlhfsim.costs.stepcosts import STEP_DEFAULTS

EFF_BOUNDS = (1e-3, 1.0)


@dataclass(frozen=True)
class Term:
    """A fittable concept: its candidate profile paths, kind (``eff`` or ``seconds``), fit unit, meaning and what
    a pooled fit shares it over (``host``: every run; ``device``: the runs of one GPU family)."""

    name: str
    paths: tuple[str, ...]
    kind: str
    scale: float
    meaning: str
    pooled: str = "device"


TERMS: tuple[Term, ...] = (
    Term("engine_host_s", ("operations.decode:{gen}.overhead_s", "operations.decode.overhead_s"), "seconds", 2e-3,
         "engine host time per decode step (scheduling, input preparation, output processing) beyond the roofline",
         "host"),
    Term("engine_step_host_per_seq_s", ("generation.{gen}.step_host_per_seq_s",), "seconds", 1e-5,
         "the engine's host work per step and running sequence (scheduler, sampler bookkeeping, output processing, "
         "detokenizing; rlhfsim.costs.genruntimes.engine_host)", "host"),
    Term("engine_launch_per_layer_s", ("operations.decode:{gen}.overhead_per_layer_s",), "seconds", 1e-4,
         "an eager engine's host time per layer of a decode step (kernel launches without CUDA graphs)", "host"),
    Term("kv_realloc_s", ("step.kv_realloc_s",), "seconds", 0.5,
         "fixed cost of a hybrid engine's generate call beyond its steps: freeing and taking back its KV cache",
         "host"),
    Term("kv_realloc_per_gib_s", ("step.kv_realloc_s_per_gib",), "seconds", 0.01,
         "... plus this per GiB of KV cache per GPU (mapping and clearing the device memory)"),
    Term("engine_step_host_s", ("generation.{gen}.step_host_s",), "seconds", 1e-3,
         "the engine's fixed host work per step (rlhfsim.costs.genruntimes.engine_host); after engine_host_s, which "
         "moves a step alike while none of it is hidden", "host"),
    Term("engine_step_host_overlap", ("generation.{gen}.step_host_overlap",), "share", 1.0,
         "the share of the engine's host work per step hidden behind the device's work", "host"),
    Term("train_eff", ("operations.train.compute_eff",), "eff", 1.0,
         "sustained training efficiency: fraction of the datasheet peak a training pass reaches"),
    Term("host_train_per_layer_s", ("framework.host_train_per_layer_s",), "seconds", 1e-3,
         "host dispatch per layer of a training call (micro-batch), overlapping its device work", "host"),
    Term("microbatch_train_s", ("step.microbatch_train_s",), "seconds", 1e-2,
         "framework time per training micro-batch beyond the fitted pass", "host"),
    Term("forward_eff", ("operations.forward.compute_eff", "operations.prefill.compute_eff"), "eff", 1.0,
         "sustained forward efficiency of the log-prob / value passes"),
    Term("host_forward_per_layer_s", ("framework.host_forward_per_layer_s",), "seconds", 1e-3,
         "host dispatch per layer of a forward call (micro-batch), overlapping its device work", "host"),
    Term("microbatch_forward_s", ("step.microbatch_forward_s",), "seconds", 1e-2,
         "framework time per forward micro-batch beyond the fitted pass", "host"),
    Term("gemm_e_max", ("kernels_by_shape.gemm.e_max",), "eff", 1.0,
         "the GEMM efficiency ceiling of a profile with kernel terms by shape"),
    Term("fsdp_host_per_unit_s", ("framework.fsdp_host_per_unit_s",), "seconds", 1e-3,
         "FSDP's host time per unit and collective (unshard / reshard hooks)", "host"),
    Term("adv_per_element_s", ("step.adv_per_element_s",), "seconds", 2e-9,
         "the driver's advantage step (rlhfsim.costs.driver): per element of [rows, padded width] and element-wise pass",
         "host"),
    Term("adv_per_row_s", ("step.adv_per_row_s",), "seconds", 2e-5,
         "... per row of GRPO's Python loops (group statistics, normalization)", "host"),
    Term("adv_per_op_s", ("step.adv_per_op_s",), "seconds", 5e-6,
         "... fixed dispatch of a tensor op of GAE's reverse loop over positions", "host"),
    Term("adv_per_strided_s", ("step.adv_per_strided_s",), "seconds", 5e-9,
         "... per row and op of that loop (a strided column of [rows, width])", "host"),
    Term("decode_memory_eff", ("operations.decode:{gen}.memory_eff", "operations.decode.memory_eff"), "eff", 1.0,
         "memory efficiency of a decode step (weights and KV streamed per step)"),
    Term("host_copy_eff", ("step.host_copy_eff",), "eff", 1.0,
         "fraction of the host link an offload copy reaches"),
    Term("reshard_eff", ("step.reshard_eff",), "eff", 1.0,
         "memory efficiency of loading gathered weights into the engine (the weight sync)"),
)
TERM_NAMES = tuple(t.name for t in TERMS)


def _walk(profile: dict, path: str):
    """The object holding ``path``'s last key, and that key (None where a step on the way is missing).
    Paths are dotted; operation names hold colons, never dots (``operations.decode:vllm.overhead_s``)."""
    *parents, key = path.split(".")
    node = profile
    for k in parents:
        node = node.get(k) if isinstance(node, dict) else None
    return (node if isinstance(node, dict) else None), key


# a generation runtime's engine host keys, 0 where its entry has none (rlhfsim.costs.genruntimes.engine_host)
ZERO_WHEN_ABSENT = ("step_host_s", "step_host_per_seq_s", "step_host_overlap")


def has_path(profile: dict, path: str) -> bool:
    """Whether ``path`` names a number the profile has (a step scalar always has one: its default; an engine host key
    of a runtime the profile lists: 0 when absent)."""
    section, _, rest = path.partition(".")
    if section == "step":
        return rest in STEP_DEFAULTS
    node, key = _walk(profile, path)
    if section == "generation" and key in ZERO_WHEN_ABSENT and node is not None and node.get(key) is None:
        return True
    v = node.get(key) if node is not None else None
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def get_value(profile: dict, path: str) -> float:
    """The profile's value at ``path`` (a step scalar absent from the profile: its documented default)."""
    section, _, rest = path.partition(".")
    if section == "step":
        v = (profile.get("step") or {}).get(rest)
        return float(STEP_DEFAULTS[rest] if v is None else v)
    node, key = _walk(profile, path)
    if section == "generation" and key in ZERO_WHEN_ABSENT and node.get(key) is None:
        return 0.0
    return float(node[key])


def with_values(profile: dict, values: dict[str, float]) -> dict:
    """A copy of ``profile`` with ``values`` (path -> number) set; only the objects on those paths are copied."""
    out = dict(profile)
    for path, v in values.items():
        *parents, key = path.split(".")
        node = out
        for k in parents:
            node[k] = dict(node.get(k) or {})
            node = node[k]
        node[key] = float(v)
    return out


def resolve(term: Term, profile: dict, gen_runtime: str) -> str | None:
    """The profile path a term fits for a run generating with ``gen_runtime`` (None: the profile has none). ``{gen}``
    takes the runtime, then the one it is priced as where the profile has nothing of its own for it (a vLLM V0 runtime
    and its V1 twin: ``rlhfsim.costs.genruntimes.pricing_names``), as the cost model looks them up."""
    for p in term.paths:
        for name in pricing_names(gen_runtime) if "{gen}" in p else (gen_runtime,):
            path = p.replace("{gen}", name)
            if has_path(profile, path):
                return path
    return None


def to_x(term: Term, value: float) -> float:
    return math.log(value) if term.kind == "eff" else value / term.scale


def from_x(term: Term, x: float) -> float:
    return math.exp(x) if term.kind == "eff" else x * term.scale


def x_bounds(term: Term) -> tuple[float, float]:
    if term.kind == "eff":
        return (math.log(EFF_BOUNDS[0]), math.log(EFF_BOUNDS[1]))
    return (0.0, 1.0) if term.kind == "share" else (0.0, math.inf)


def plausible_dx(term: Term) -> float:
    """One unit of the relevance test: a factor of 2 for an efficiency, half of the range for a share, one ``scale``
    for a time."""
    return math.log(2.0) if term.kind == "eff" else 0.5 if term.kind == "share" else 1.0
