"""Cost-model properties: non-negative, monotone in tokens and cached context, the O(1) decode sum equal
to the step-by-step sum and additive over splits; length samplers stay within [1, cap]."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rlhfsim.costs import flops as fl
from rlhfsim.costs.cpuhost import footprint_passes
from rlhfsim.costs.genruntimes import sample_tail
from rlhfsim.costs.model import CostModel, _sum_max_linear, roofline
from rlhfsim.hardware.catalog import GPUS
from rlhfsim.models.catalog import CATALOG
from rlhfsim.scenario.loader import validate_model
from rlhfsim.scenario.schema import Workload
from rlhfsim.workload.lengths import sampler_for

MODELS = st.sampled_from(sorted(n for n, m in CATALOG.items() if m.arch == "decoder"))
# a GPU's datasheet-derived profile by name (the plain roofline the hand sums below are written for; a GPU scenario's
# default is now its fitted bundled profile, whose kernels go by shape); the CPU's bundled profile
COSTS = {g: CostModel.load(GPUS[g], None if g == "cpu" else "default") for g in ("a100-80gb", "h200", "l40s", "cpu")}
DEVICES = st.sampled_from(sorted(COSTS))
DTYPES = st.sampled_from(["bfloat16", "float16", "float32"])
TP = st.sampled_from([1, 2, 4, 8])


@given(a1=st.floats(-1e3, 1e3), s1=st.floats(-10, 10), a2=st.floats(-1e3, 1e3), s2=st.floats(-10, 10),
       n=st.integers(0, 400))
def test_sum_max_linear_equals_brute_force(a1, s1, a2, s2, n):
    i = np.arange(n, dtype=np.float64)
    want = float(np.maximum(a1 + s1 * i, a2 + s2 * i).sum())
    scale = float(np.abs(a1) + np.abs(a2) + (np.abs(s1) + np.abs(s2)) * n) * max(n, 1)
    assert _sum_max_linear(a1, s1, a2, s2, n) == pytest.approx(want, rel=1e-9, abs=1e-9 * scale + 1e-12)


@given(model=MODELS, dev=DEVICES, dtype=DTYPES, tp=TP, batch=st.integers(1, 512),
       ctx=st.integers(0, 8192), n=st.integers(1, 3000), cut=st.integers(0, 3000))
def test_decode_sum_is_additive_and_matches_steps(model, dev, dtype, tp, batch, ctx, n, cut):
    cm, m = COSTS[dev], CATALOG[model]
    kv0 = batch * ctx
    whole = cm.decode_steps(m, dtype, batch, kv0, n, tp).total_s
    assert whole > 0
    k = min(cut, n)
    split = cm.decode_steps(m, dtype, batch, kv0, k, tp).total_s + cm.decode_steps(m, dtype, batch, kv0 + batch * k, n - k, tp).total_s
    assert split == pytest.approx(whole, rel=1e-9)
    if n <= 64:
        p = cm.ops["decode"]
        # each step: the roofline (weights counted gemm_weight_passes times at >= 2 rows), the measured
        # sampling tail of the plain decoder (0 in profiles without one) and the TP communication
        a, b = sample_tail(None, cm.generation, False)
        passes = 1.0 if cm.cpu is None else footprint_passes(cm.cpu.by_footprint, cm.cpu.weight_passes or 1.0,
                                                              fl.ShapeCoeffs.of(m, dtype, "lm").decode_weight_bytes)
        steps = sum(roofline(fl.decode_step_work(m, dtype, batch, kv0 + batch * i, 1.0, passes), p,
                             cm.gpu.peak(dtype), cm.gpu.mem_bw, tp).total_s
                    + a + b * batch * m.vocab + cm._tp_comm_s(m, dtype, batch, tp) for i in range(n))
        assert whole == pytest.approx(steps, rel=1e-9)


@given(model=MODELS, dev=DEVICES, dtype=DTYPES, tp=TP, batch=st.integers(1, 256), ctx=st.integers(0, 8192),
       n=st.integers(1, 2000), more_ctx=st.integers(0, 4096), more_n=st.integers(0, 500), more_b=st.integers(0, 64))
def test_decode_monotone(model, dev, dtype, tp, batch, ctx, n, more_ctx, more_n, more_b):
    cm, m = COSTS[dev], CATALOG[model]
    t = cm.decode_steps(m, dtype, batch, batch * ctx, n, tp).total_s
    assert cm.decode_steps(m, dtype, batch, batch * (ctx + more_ctx), n, tp).total_s >= t * (1 - 1e-12)
    assert cm.decode_steps(m, dtype, batch, batch * ctx, n + more_n, tp).total_s >= t * (1 - 1e-12)
    b2 = batch + more_b
    assert cm.decode_steps(m, dtype, b2, b2 * ctx, n, tp).total_s >= t * (1 - 1e-12)


@given(model=st.sampled_from(sorted(CATALOG)), dev=DEVICES, dtype=DTYPES, tp=TP, seqs=st.integers(1, 64),
       per_seq=st.integers(1, 4096), extra=st.integers(0, 4096), cached=st.integers(0, 8192),
       head=st.sampled_from(["lm", "value"]), op=st.sampled_from(["prefill", "chunk_prefill"]))
def test_forward_monotone_and_non_negative(model, dev, dtype, tp, seqs, per_seq, extra, cached, head, op):
    cm, m = COSTS[dev], CATALOG[model]
    n = seqs * per_seq
    t = cm.forward(m, dtype, n, seqs, tp, cached_tokens=seqs * cached, op=op, head=head).total_s
    assert t > 0
    assert cm.forward(m, dtype, n + seqs * extra, seqs, tp, cached_tokens=seqs * cached, op=op, head=head).total_s >= t
    assert cm.forward(m, dtype, n, seqs, tp, cached_tokens=seqs * (cached + extra), op=op, head=head).total_s >= t


@given(model=MODELS, dev=DEVICES, dtype=DTYPES, tp=TP, seqs=st.integers(1, 64), per_seq=st.integers(1, 4096),
       extra=st.integers(0, 4096), dp=st.integers(1, 64), inter=st.booleans())
def test_train_and_optimizer_monotone_and_non_negative(model, dev, dtype, tp, seqs, per_seq, extra, dp, inter):
    cm, m = COSTS[dev], CATALOG[model]
    t = cm.train(m, dtype, seqs * per_seq, seqs, tp).total_s
    assert t > 0
    assert cm.train(m, dtype, seqs * (per_seq + extra), seqs, tp).total_s >= t
    assert cm.optimizer(m, dtype, tp, dp, inter_node=inter).total_s > 0
    assert cm.weight_sync_s(m, dtype, tp, inter) > 0


@st.composite
def dists(draw):
    kind = draw(st.sampled_from(["fixed", "normal", "lognormal", "pareto", "mixture"]))
    pos = st.floats(1e-3, 1e7, allow_nan=False)
    if kind == "fixed":
        return {"kind": "fixed", "value": draw(st.integers(1, 4_194_304))}   # the schema's bound on a token count
    if kind == "normal":
        return {"kind": "normal", "mean": draw(pos), "std": draw(st.floats(0, 1e7))}
    if kind == "lognormal":
        med = draw(pos)
        return {"kind": "lognormal", "median": med, "p99": med * draw(st.floats(1.0001, 1e4))}
    if kind == "pareto":
        return {"kind": "pareto", "scale": draw(pos), "alpha": draw(st.floats(0.05, 20))}
    return {"kind": "mixture", "components": [{"weight": draw(st.floats(1e-3, 10)), "dist": {"kind": "fixed", "value": 5}},
                                              {"weight": draw(st.floats(1e-3, 10)), "dist": {"kind": "pareto", "scale": 2, "alpha": 0.3}}]}


@given(d=dists(), cap=st.integers(1, 100_000), n=st.integers(0, 500), seed=st.integers(0, 2**32 - 1))
def test_samplers_stay_within_one_and_cap(d, cap, n, seed):
    w = validate_model(Workload, {"prompts_per_step": 1, "response_length": d, "max_response_tokens": cap})
    s = sampler_for(w.response_length, cap)
    x = s(np.random.default_rng(seed), n)
    assert x.dtype == np.int64 and x.shape == (n,)
    if n:
        assert x.min() >= 1 and x.max() <= cap
    assert np.array_equal(x, s(np.random.default_rng(seed), n))
