"""verl's advantage computation on the driver, timed on this CPU: the host costs of ``rlhfsim.costs.driver``
(profile ``step.adv_per_op_s``, ``adv_per_strided_s``, ``adv_per_element_s``, ``adv_per_row_s``).

verl runs its advantage estimators on the driver's CPU tensors (``DataProto``: R rows, every response padded to the
response cap W) in one Ray task of one CPU, so torch computes on one thread; the timings here are taken the same way
(``torch.set_num_threads(1)``). The code paths are verl's, written out with the same tensor operations in the same
order (``verl/trainer/ppo/core_algos.py`` and ``verl/utils/torch_functional.py``):

* ``gae_loop``: ``compute_gae_advantage_return``'s reverse loop over positions, ``plain`` as in verl <= 0.4 (five
  operations per position on [R] column slices) or ``masked`` as from verl 0.5 (thirteen: the observation-token
  masks of multi-turn rollouts);
* ``whiten``: what follows the loop (the stacked advantages, ``returns = advantages + values``, ``masked_whiten``),
  ``masked_sum`` with the ``torch.where`` of verl >= 0.5 or without;
* ``grpo``: ``compute_grpo_outcome_advantage`` (the score sum, the Python loops over rows and groups, the mask
  product), its group statistics by ``torch.tensor`` of a list (verl <= 0.4) or ``torch.stack`` (later);
* ``rollout_metrics``: verl 0.9's rollout-correction metrics on the adv timer (``compute_offpolicy_metrics`` and
  the log-ratio, mask checks and copy around it), which run when the rollout returns its log-probs
  (``rollout.calculate_log_probs``, the default from verl 0.9).

Each timing is the fastest of ``--iters`` calls (this VM is shared: other processes only add time); each scalar
the median over its points (``measure()`` keeps every point):

* ``adv_per_op_s``: the loop's time per position and operation at R = 8 (the dispatch of a small tensor op),
  over the plain and the masked loop;
* ``adv_per_strided_s``: at R of 2,048 to 8,192 rows (beyond the caches, as a step's batch is), the loop's time per
  position less the dispatch, per row and operation (a column of a row-major [R, W] tensor is strided: a cache line
  per row);
* ``adv_per_element_s``: ``whiten``'s time per element of [R, W] and per pass (``rlhfsim.costs.driver``'s count);
* ``adv_per_row_s``: ``grpo`` at W = 8 (its element-wise passes negligible) per row, groups of 5 and 8.

``python -m calibrate.measuring.advbench [--quick] [--out FILE]`` prints the scalars and the check: each code path's time at
the shapes of the field table's dev runs against the price ``rlhfsim.costs.driver`` composes from the scalars.
"""

from __future__ import annotations

import statistics
import time
from collections import defaultdict

import numpy as np
import torch

from rlhfsim.costs import driver


def _fastest_s(fn, iters: int) -> float:
    """The fastest of ``iters`` calls after a first one apart (allocations): on a shared VM another process only
    adds time, so the quickest call is the code's own cost."""
    fn()
    samples = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return float(min(samples))


def batch(rows: int, width: int, seed: int = 0) -> dict:
    """The driver's tensors as verl holds them: fp32 token-level rewards (the score on the last token), the
    critic's values in bf16 (its FSDP mixed-precision output), an int64 response mask (a slice of the attention
    mask), fp32 old and rollout log-probs."""
    g = torch.Generator().manual_seed(seed)
    r = torch.zeros(rows, width)
    r[:, -1] = torch.rand(rows, generator=g)
    return {"rewards": r, "values": torch.randn(rows, width, generator=g).to(torch.bfloat16),
            "mask": torch.ones(rows, width, dtype=torch.int64),
            "old": -torch.rand(rows, width, generator=g), "rollout": -torch.rand(rows, width, generator=g)}


def gae_loop(r: torch.Tensor, v: torch.Tensor, m: torch.Tensor, masked: bool, gamma: float = 1.0, lam: float = 1.0):
    """verl's GAE reverse loop: one entry per position, newest first."""
    out = []
    last = 0
    nxt = 0
    w = r.shape[-1]
    for t in reversed(range(w)):
        if masked:   # verl >= 0.5: observation tokens skipped through the mask
            delta = r[:, t] + gamma * nxt - v[:, t]
            cur = delta + gamma * lam * last
            nxt = v[:, t] * m[:, t] + (1 - m[:, t]) * nxt
            last = cur * m[:, t] + (1 - m[:, t]) * last
        else:        # verl <= 0.4
            nv = v[:, t + 1] if t < w - 1 else 0.0
            delta = r[:, t] + gamma * nv - v[:, t]
            last = delta + gamma * lam * last
        out.append(last)
    return out


def _masked_sum(x, m, where: bool, axis=None):
    return ((torch.where(m.bool(), x, 0.0) if where else x) * m).sum(axis=axis)


def _masked_mean(x, m, where: bool, axis=None):
    return _masked_sum(x, m, where, axis) / (m.sum(axis=axis) + 1e-8)


def _masked_var(x, m, where: bool):
    mean = _masked_mean(x, m, where)
    var = _masked_mean((x - mean) ** 2, m, where)
    n = m.sum()
    return var * (n / (n - 1))


def whiten(rev: list, v: torch.Tensor, m: torch.Tensor, where: bool):
    """What follows GAE's loop: the stacked advantages, the returns, masked_whiten (its mean, then masked_var, which
    takes the mean again, as verl's does)."""
    adv = torch.stack(rev[::-1], dim=1)
    ret = adv + v
    mean, var = _masked_mean(adv, m, where), _masked_var(adv, m, where)
    return (adv - mean) * torch.rsqrt(var + 1e-8), ret


def grpo(r: torch.Tensor, m: torch.Tensor, index, stack: bool, eps: float = 1e-6):
    """verl's compute_grpo_outcome_advantage (normalized by the group's std)."""
    scores = r.sum(dim=-1)
    by_id, mean, std = defaultdict(list), {}, {}
    for i in range(scores.shape[0]):
        by_id[index[i]].append(scores[i])
    for k, v in by_id.items():
        if len(v) == 1:
            mean[k], std[k] = torch.tensor(0.0), torch.tensor(1.0)
            continue
        t = torch.stack(v) if stack else torch.tensor(v)
        mean[k] = torch.mean(t)
        std[k] = torch.std(t if stack else torch.tensor([v]))
    for i in range(scores.shape[0]):
        scores[i] = (scores[i] - mean[index[i]]) / (std[index[i]] + eps)
    return scores.unsqueeze(-1) * m


def rollout_metrics(old: torch.Tensor, roll: torch.Tensor, m: torch.Tensor) -> dict:
    """verl 0.9's compute_rollout_correction_and_rejection_mask with neither IS weights nor rejection set: the
    checks, the log-ratio, the mask's copy and compute_offpolicy_metrics (each metric read with .item())."""
    bound = 20.0
    assert m.any()
    log_ratio = old - roll
    kept = m.clone()
    assert m.any()
    out = {}
    lp_train = _masked_mean(old, m, True, axis=-1)
    out["training_ppl"] = torch.exp(-lp_train).mean().item()
    out["training_log_ppl"] = (-lp_train).mean().item()
    out["kl"] = _masked_mean(roll - old, m, True).item()
    lr = old - roll
    out["k3_kl"] = _masked_mean(torch.exp(lr) - lr - 1, m, True).item()
    lp_roll = _masked_mean(roll, m, True, axis=-1)
    out["rollout_ppl"] = torch.exp(-lp_roll).mean().item()
    out["rollout_log_ppl"] = (-lp_roll).mean().item()
    d = lp_roll - lp_train
    out.update(log_ppl_diff=d.mean().item(), log_ppl_abs_diff=d.abs().mean().item(), log_ppl_diff_max=d.max().item(),
               log_ppl_diff_min=d.min().item(), ppl_ratio=torch.exp(d).mean().item())
    rho = torch.exp(torch.clamp(lr, min=-bound, max=bound))
    out["chi2_token"] = (_masked_mean(rho.square(), m, True) - 1.0).item()
    s = torch.clamp(_masked_sum(lr, m, True, axis=-1), min=-bound, max=bound)
    out["chi2_seq"] = (torch.exp(2.0 * s).mean() - 1.0).item()
    del log_ratio, kept
    return out


def _index(rows: int, group: int) -> np.ndarray:
    return np.array([f"uid-{i // group}" for i in range(rows)], dtype=object)


# The field table's dev runs that log timing_s/adv (scenarios/examples/field/runs*.yaml): (id, estimator, rows,
# padded width, group, verl form, rollout metrics, logged seconds): the check's shapes.
DEV_SHAPES = (
    ("F5", "grpo", 512, 192, 8, "plain", False, 0.015),
    ("F6", "gae", 2048, 256, 1, "plain", False, 0.023),
    ("F7", "gae", 512, 1024, 1, "plain", False, 0.042),
    ("F8", "gae", 5120, 1024, 1, "plain", False, 0.248),
    ("F9", "grpo", 5120, 1024, 5, "plain", False, 0.130),
    ("J1", "grpo", 128, 8192, 8, "masked", True, 0.122),
)


def measure(iters: int = 5, quick: bool = False) -> dict:
    """Every timing and the four scalars (module docstring)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _measure(iters, quick)
    finally:
        torch.set_num_threads(threads)


def _measure(iters: int, quick: bool) -> dict:
    width_small = 512 if quick else 2048
    per_op = {}
    for form in ("plain", "masked"):
        b = batch(8, width_small)
        t = _fastest_s(lambda b=b, form=form: gae_loop(b["rewards"], b["values"], b["mask"], form == "masked"), iters)
        per_op[form] = t / width_small / driver.GAE_LOOP_OPS[form]
    op_s = statistics.median(per_op.values())
    strided = {}
    for rows, width in (((2048, 256),) if quick else ((2048, 1024), (4096, 1024), (8192, 512), (2048, 4096))):
        b = batch(rows, width)
        for form in ("plain", "masked"):
            t = _fastest_s(lambda b=b, form=form: gae_loop(b["rewards"], b["values"], b["mask"], form == "masked"),
                          max(iters // 2, 1))
            ops = driver.GAE_LOOP_OPS[form]
            strided[f"{form}:{rows}x{width}"] = max(t / width / ops - op_s, 0.0) / rows
    per_elem = {}
    for rows, width in (((1024, 256),) if quick else ((2048, 1024), (4096, 1024), (1024, 4096))):
        b = batch(rows, width)
        for form in ("plain", "masked"):
            # the whole estimator less its loop: the passes with the fresh allocations they make in a real step
            # (timed apart on a list computed once, the passes can run several times faster)
            m = form == "masked"
            full = _fastest_s(lambda b=b, m=m: whiten(gae_loop(b["rewards"], b["values"], b["mask"], m), b["values"],
                                                      b["mask"], m), max(iters // 2, 1))
            loop = _fastest_s(lambda b=b, m=m: gae_loop(b["rewards"], b["values"], b["mask"], m), max(iters // 2, 1))
            per_elem[f"{form}:{rows}x{width}"] = max(full - loop, 0.0) / (rows * width * driver.GAE_PASSES[form])
    per_row = {}
    for group in (5, 8):
        rows = 1024 if quick else 4096
        b = batch(rows, 8)
        for form in ("plain", "masked"):
            idx = _index(rows, group)
            t = _fastest_s(lambda b=b, idx=idx, form=form: grpo(b["rewards"].clone(), b["mask"], idx, form == "masked"),
                          iters)
            per_row[f"{form}:g{group}"] = t / rows
    scalars = {"adv_per_op_s": op_s, "adv_per_strided_s": statistics.median(strided.values()),
               "adv_per_element_s": statistics.median(per_elem.values()),
               "adv_per_row_s": statistics.median(per_row.values())}
    out = {"scalars": scalars, "per_op_s": per_op, "strided_s": strided, "per_element_s": per_elem,
           "per_row_s": per_row, "threads": 1}
    if not quick:
        out["check"] = check(scalars, iters)
    return out


def check(scalars: dict, iters: int) -> list[dict]:
    """Each dev run's code path timed here at its shape beside the price composed from ``scalars``
    (``rlhfsim.costs.driver.advantage_parts``, no host factor: both on this CPU)."""
    rows_out = []
    for rid, est, rows, width, group, form, metrics, logged in DEV_SHAPES:
        b = batch(rows, width)
        masked = form == "masked"
        if est == "gae":
            def fn(b=b, masked=masked):
                rev = gae_loop(b["rewards"], b["values"], b["mask"], masked)
                return whiten(rev, b["values"], b["mask"], masked)
        else:
            idx = _index(rows, group)

            def fn(b=b, idx=idx, masked=masked, metrics=metrics):
                if metrics:
                    rollout_metrics(b["old"], b["rollout"], b["mask"])
                return grpo(b["rewards"].clone(), b["mask"], idx, masked)
        measured = _fastest_s(fn, max(iters // 2, 1))
        code = driver.AdvantageCode(gae_loop=form, rollout_metrics=metrics)
        parts = driver.advantage_parts(driver.AdvantageCosts(**scalars), code, rows, width, gae=est == "gae")
        rows_out.append({"run": rid, "estimator": est, "rows": rows, "width": width, "form": form,
                         "rollout_metrics": metrics, "measured_here_s": measured, "priced_here_s": sum(parts.values()),
                         "parts_s": parts, "logged_s": logged})
    return rows_out


def main(argv: list[str] | None = None) -> None:
    import argparse
    import json

    ap = argparse.ArgumentParser(prog="python -m calibrate.measuring.advbench", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small shapes, no check (seconds)")
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--out", help="write every timing here (JSON)")
    args = ap.parse_args(argv)
    res = measure(args.iters, args.quick)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)
    print(json.dumps(res["scalars"], indent=1))
    for r in res.get("check", []):
        print(f"{r['run']:3} {r['estimator']:4} {r['rows']:5} x {r['width']:5} {r['form']:6} metrics={r['rollout_metrics']!s:5} "
              f"here {r['measured_here_s'] * 1e3:7.1f} ms  priced {r['priced_here_s'] * 1e3:7.1f} ms  "
              f"({100 * (r['priced_here_s'] / r['measured_here_s'] - 1):+.0f}%)  logged {r['logged_s'] * 1e3:6.0f} ms")


if __name__ == "__main__":
    main()
