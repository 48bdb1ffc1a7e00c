"""Synthetic run and plan directories in the exact on-disk format that ``rlhfsim simulate --out`` and
``rlhfsim plan --out`` write (see load.py). For tests and for trying the report; the numbers are made up
(seeded random durations) and mean nothing about any hardware.

The synthetic run is a PPO step on three pools: "rollout" (generate; GPUs finish at different times),
"train" (reference and critic_fwd scored in chunks while generation runs, then actor_train and
critic_train running concurrently on the same GPUs, so the timeline needs overlap lanes; all train GPUs
identical), "reward" (chunked scoring). Step k+1 starts when step k's weight_sync ends; with
``overlap_steps`` step k's critic_train runs on past that, so consecutive steps overlap. Summary numbers are computed from the
intervals with the same definitions the simulator uses (span = last end - first start; utilization =
busy GPU-seconds / (GPUs x wall seconds); active utilization from each interval's active_s, a fixed
kernel share per phase in ``ACTIVE_SHARE``, through ``rlhfsim.sim.simulation.gpu_busy_active``).
"""

from __future__ import annotations

import csv
import itertools
import json
from pathlib import Path

import numpy as np

from rlhfsim.contracts import (INTERVAL_COLUMNS, INTERVALS_FILE, LENGTH_COLUMNS, LENGTHS_FILE, PHASES, PLAN_FILE,
                               RESULTS_FILE, STEP_REQUIRED_COLUMNS as STEP_COLUMNS, STEPS_FILE, SUMMARY_FILE)
from rlhfsim.sim.simulation import gpu_busy_active

POOLS = {"rollout": {"gpus": 4, "roles": ["rollout"]},
         "train": {"gpus": 4, "roles": ["actor", "critic", "reference"]},
         "reward": {"gpus": 1, "roles": ["reward"]}}


# Kernel share of each phase's intervals (decode pays per-step host overhead; a weight copy is all device work).
ACTIVE_SHARE = {"generate": 0.6, "reward": 0.85, "reference": 0.85, "critic_fwd": 0.85, "actor_train": 0.9,
                "critic_train": 0.9, "weight_sync": 1.0}


def _write_csv(path: Path, header: list[str], rows: list[list]) -> None:
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows(rows)


def write_run_dir(out: Path, *, steps: int = 6, warmup_steps: int = 1, chunks: int = 4, rollouts: int = 16,
                  seed: int = 0, variants: bool = True, overlap_steps: bool = True) -> Path:
    """Write summary.json, steps.csv, intervals.csv and lengths.csv under ``out``; returns ``out``.

    About (4 x chunks + 12 + 3 x chunks x 3) intervals per step: chunks=200, steps=40 gives ~100k rows."""
    rng = np.random.default_rng(seed)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    intervals: list[list] = []   # step,pool,gpu,role,phase,start_s,end_s
    step_rows, length_rows = [], []
    t0 = 0.0
    for step in range(steps):
        rows_before = len(intervals)
        gen_s = float(rng.lognormal(np.log(6.0), 0.2))
        gen_end = [t0 + gen_s * float(rng.uniform(0.8, 1.0)) for _ in range(POOLS["rollout"]["gpus"])]
        for gpu, end in enumerate(gen_end):  # contiguous decode chunks
            edges = np.linspace(t0, end, chunks + 1)
            intervals += [[step, "rollout", gpu, "rollout", "generate", a, b] for a, b in zip(edges[:-1], edges[1:])]
        # Streamed scoring: chunks arrive from 30% of generation to its end.
        arrivals = np.sort(rng.uniform(t0 + 0.3 * gen_s, max(gen_end), chunks))
        reward_free = ref_free = 0.0
        for at in arrivals:
            r0 = max(at, reward_free)
            reward_free = r0 + float(rng.uniform(0.02, 0.06))
            intervals.append([step, "reward", 0, "reward", "reward", r0, reward_free])
            a = max(at, ref_free)
            b = a + float(rng.uniform(0.02, 0.05))
            ref_free = b + float(rng.uniform(0.01, 0.03))
            for gpu in range(POOLS["train"]["gpus"]):
                intervals.append([step, "train", gpu, "reference", "reference", a, b])
                intervals.append([step, "train", gpu, "critic", "critic_fwd", b, ref_free])
        train0 = max(reward_free, ref_free, max(gen_end))
        actor_s, critic_s, sync_s = (float(rng.uniform(lo, hi)) for lo, hi in ((2.0, 2.6), (1.2, 1.8), (0.2, 0.3)))
        sync_end = train0 + actor_s + sync_s
        if overlap_steps:  # the critic trains on while the next step already generates
            critic_s = actor_s + sync_s + float(rng.uniform(0.5, 1.0))
        for gpu in range(POOLS["train"]["gpus"]):
            intervals.append([step, "train", gpu, "actor", "actor_train", train0, train0 + actor_s])
            intervals.append([step, "train", gpu, "critic", "critic_train", train0, train0 + critic_s])
            intervals.append([step, "train", gpu, "actor", "weight_sync", train0 + actor_s, sync_end])
        for gpu in range(POOLS["rollout"]["gpus"]):
            intervals.append([step, "rollout", gpu, "rollout", "weight_sync", train0 + actor_s, sync_end])
        end = max(sync_end, train0 + critic_s)
        resp = np.clip(rng.lognormal(np.log(300), 0.6, rollouts), 1, 2048).astype(int)
        prompt = rng.integers(32, 256, rollouts)
        length_rows += [[step, step * rollouts + i, int(p), int(r)] for i, (p, r) in enumerate(zip(prompt, resp))]
        mine = intervals[rows_before:]
        spans = {p: max(r[6] for r in mine if r[4] == p) - min(r[5] for r in mine if r[4] == p) for p in PHASES
                 if any(r[4] == p for r in mine)}
        step_rows.append({"step": step, "start_s": t0, "end_s": end, "step_time_s": end - t0,
                          "generated_tokens": int(resp.sum()), "trained_rollouts": rollouts,
                          "deferred": int(rng.integers(0, 3)), "off_policy_token_frac": float(rng.uniform(0, 0.1)),
                          "chunk_tokens": 256, "delta": 2, **{f"{p}_s": s for p, s in spans.items()}})
        t0 = sync_end

    phase_cols = [f"{p}_s" for p in PHASES if f"{p}_s" in step_rows[0]]
    _write_csv(out / STEPS_FILE, [*STEP_COLUMNS, *phase_cols],
               [[row.get(c, "") for c in (*STEP_COLUMNS, *phase_cols)] for row in step_rows])
    _write_csv(out / INTERVALS_FILE, INTERVAL_COLUMNS,
               [[s, pool, g, role, ph, f"{a:.9g}", f"{b:.9g}", f"{ACTIVE_SHARE[ph] * (b - a):.9g}"]
                for s, pool, g, role, ph, a, b in intervals])
    _write_csv(out / LENGTHS_FILE, LENGTH_COLUMNS, length_rows)

    steady = step_rows[warmup_steps:]
    times = np.array([r["step_time_s"] for r in steady])
    window = (steady[0]["start_s"], steady[-1]["end_s"])
    util, active = {}, {}
    for pool, spec in POOLS.items():
        per_gpu = [gpu_busy_active([(max(a, window[0]), min(b, window[1]),
                                     ACTIVE_SHARE[ph] * (min(b, window[1]) - max(a, window[0])))
                                    for s, p, g, _, ph, a, b in intervals
                                    if p == pool and g == gpu and b > window[0] and a < window[1]])
                   for gpu in range(spec["gpus"])]
        util[pool] = sum(b for b, _ in per_gpu) / (spec["gpus"] * (window[1] - window[0]))
        active[pool] = sum(a for _, a in per_gpu) / (spec["gpus"] * (window[1] - window[0]))
    phases_s = {p: float(np.mean([r[f"{p}_s"] for r in steady])) for p in PHASES if f"{p}_s" in steady[0]}
    summary = {
        "scenario": "synthetic-ppo", "schedule": "oppo", "steps": steps, "warmup_steps": warmup_steps,
        "step_time_s": float(times.mean()), "step_time_p50_s": float(np.percentile(times, 50)),
        "step_time_p90_s": float(np.percentile(times, 90)), "phases_s": phases_s, "gpu_utilization": util,
        "gpu_busy": util, "gpu_active": active,
        "tokens_per_s": float(sum(r["generated_tokens"] for r in steady) / (window[1] - window[0])),
        "profile": "synthetic", "pools": POOLS,
        "schedule_stats": {"chunk_tokens": 256, "delta": 2, "deferred_mean": 1.0, "note": "synthetic"},
    }
    if variants:
        summary["variants"] = {
            "sync": {"step_time_s": summary["step_time_s"] * 1.4, "speedup": 1.0,
                     "gpu_utilization": {p: u / 1.4 for p, u in util.items()},
                     "gpu_busy": {p: u / 1.4 for p, u in util.items()},
                     "gpu_active": {p: u / 1.4 for p, u in active.items()},
                     "phases_s": {p: s * (0.8 if p in ("reward", "reference", "critic_fwd") else 1.0)
                                  for p, s in phases_s.items()}},
            "oppo": {"step_time_s": summary["step_time_s"], "speedup": 1.4, "gpu_utilization": util,
                     "gpu_busy": util, "gpu_active": active,
                     "phases_s": phases_s},
        }
    (out / SUMMARY_FILE).write_text(json.dumps(summary, indent=1))
    return out


def write_plan_dir(out: Path, *, seed: int = 0, heatmap: dict | None = None) -> Path:
    """Write plan.json and results.csv for a 3-axis sweep (gpu type x train GPUs x schedule)."""
    rng = np.random.default_rng(seed)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    axes = {"cluster.gpu": ["h100", "a100"], "placement.train_gpus": [2, 4, 8], "schedule.kind": ["sync", "oppo"]}
    price = {"h100": 4.0, "a100": 2.0}
    speed = {"h100": 1.0, "a100": 1.9}
    rows = []
    for index, (gpu, train, kind) in enumerate(itertools.product(*axes.values())):
        gpus = train + 4
        feasible = not (gpu == "a100" and train == 2)
        phase = {"generate_s": 6.0 * speed[gpu], "reward_s": 0.8 * speed[gpu],
                 "actor_train_s": 16.0 * speed[gpu] / train, "weight_sync_s": 0.25}
        step = sum(phase.values()) * (0.75 if kind == "oppo" else 1.0) * float(rng.uniform(0.97, 1.03))
        row = {"config": f"c{index:03d}", "cluster.gpu": gpu, "placement.train_gpus": train, "schedule.kind": kind,
               "step_time_s": step if feasible else "", "gpus": gpus, "gpu_type": gpu,
               "cost_per_1000_steps": step * 1000 / 3600 * gpus * price[gpu] if feasible else "",
               "feasible": "true" if feasible else "false",
               "reason": "" if feasible else "actor_train: 93.1 GB needed > 80 GB per GPU",
               **phase, "util_rollout": 0.6, "util_train": 0.5, "active_rollout": 0.4, "active_train": 0.45}
        rows.append(row)
    header = list(rows[0])
    _write_csv(out / RESULTS_FILE, header, [[r[c] for c in header] for r in rows])
    ok = [r for r in rows if r["feasible"] == "true"]
    pareto = [r for r in ok if not any(o["step_time_s"] <= r["step_time_s"] and o["cost_per_1000_steps"]
                                       <= r["cost_per_1000_steps"] and o is not r and
                                       (o["step_time_s"], o["cost_per_1000_steps"]) != (r["step_time_s"], r["cost_per_1000_steps"])
                                       for o in ok)]
    as_json = [{**r, "feasible": True} for r in pareto]
    best = min(as_json, key=lambda r: r["step_time_s"])
    plan = {"name": "synthetic-sweep", "axes": axes, "objective": {"kind": "min_step_time", "metric": "step_time_s"},
            "max_step_time_s": 18.0, "best": {**best, "why": "generate dominates the step (synthetic)"},
            "pareto": as_json}
    if heatmap is not None:
        plan["heatmap"] = heatmap
    (out / PLAN_FILE).write_text(json.dumps(plan, indent=1))
    return out
