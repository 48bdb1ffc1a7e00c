"""Chrome trace event format (JSON object form) for a run, to open in Perfetto (ui.perfetto.dev) or
chrome://tracing.

Every busy interval becomes one complete event {"ph": "X", "name": phase, "cat": role, "ts": start_us,
"dur": (end - start)_us, "pid": pool index + 1, "tid": gpu, "args": {"step": step[, "active_s": kernel
seconds, when intervals.csv has them]}}; timestamps are
simulated seconds x 1e6 (microseconds, the format's unit). Metadata events ("ph": "M") name each process
after its pool and each thread after its GPU. Complete events on one thread must nest or be disjoint, so
intervals that overlap on a GPU go to extra lanes: lane k of GPU g has tid g + k x gpus, named
"gpu g (overlap k)". One more process, "steps", holds one event per step (start to end of the step, also
laned because consecutive steps can overlap under streaming/overlapping schedules). Every interval is
written; nothing is merged (the HTML timeline merges, the trace does not).
"""

from __future__ import annotations

import json
import numpy as np

from rlhfsim.report.load import RunRecords
from rlhfsim.report.timeline import assign_lanes
from rlhfsim.words import count

US_PER_S = 1e6


def _meta(name: str, pid: int, tid: int, args: dict) -> dict:
    return {"ph": "M", "name": name, "pid": pid, "tid": tid, "args": args}


def _complete(name: str, cat: str, start_s: float, end_s: float, pid: int, tid: int, args: dict) -> dict:
    # ts and dur from the same rounded endpoints, so back-to-back events never overlap after rounding.
    ts = round(start_s * US_PER_S, 3)
    return {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": max(round(end_s * US_PER_S, 3) - ts, 0.0),
            "pid": pid, "tid": tid, "args": args}


def chrome_trace(run: RunRecords) -> dict:
    """The whole run as a Chrome trace document ({"traceEvents": [...], ...})."""
    iv = run.intervals
    pools = run.summary["pools"]
    events: list[dict] = []
    steps_pid = len(pools) + 1
    events.append(_meta("process_name", steps_pid, 0, {"name": "steps"}))
    events.append(_meta("process_sort_index", steps_pid, 0, {"sort_index": 0}))
    for index, (pool, spec) in enumerate(pools.items()):
        pid = index + 1
        events.append(_meta("process_name", pid, 0, {"name": f"{pool} ({count(spec['gpus'], 'GPU')}: {', '.join(spec['roles'])})"}))
        events.append(_meta("process_sort_index", pid, 0, {"sort_index": pid}))
        in_pool = np.flatnonzero(iv.pool == pool)
        gpus = spec["gpus"]
        for gpu in range(gpus):
            rows = in_pool[iv.gpu[in_pool] == gpu]
            lanes = assign_lanes(iv.start_s[rows], iv.end_s[rows])
            for lane in range(int(lanes.max()) + 1 if rows.size else 1):
                tid = gpu + lane * gpus
                label = f"gpu {gpu}" if lane == 0 else f"gpu {gpu} (overlap {lane})"
                events.append(_meta("thread_name", pid, tid, {"name": label}))
                events.append(_meta("thread_sort_index", pid, tid, {"sort_index": gpu * 1000 + lane}))
            # Vectorised form of _complete for the bulk of the events.
            ts = np.round(iv.start_s[rows] * US_PER_S, 3)
            dur = np.maximum(np.round(iv.end_s[rows] * US_PER_S, 3) - ts, 0.0)
            tids = gpu + lanes * gpus
            args = [{"step": step} for step in iv.step[rows].tolist()]
            if iv.active_s is not None:
                for a, active in zip(args, iv.active_s[rows].tolist()):
                    a["active_s"] = active
            events.extend({"ph": "X", "name": name, "cat": cat, "ts": t, "dur": d, "pid": pid, "tid": tid,
                           "args": a}
                          for name, cat, t, d, tid, a in zip(iv.phase[rows].tolist(), iv.role[rows].tolist(),
                                                             ts.tolist(), dur.tolist(), tids.tolist(), args))
    s = run.steps
    lanes = assign_lanes(s["start_s"], s["end_s"])
    for lane in range(int(lanes.max()) + 1 if lanes.size else 1):
        events.append(_meta("thread_name", steps_pid, lane, {"name": "step" if lane == 0 else f"step (overlap {lane})"}))
    for i, lane in enumerate(lanes):
        step = int(s["step"][i])
        args = {"step": step, "step_time_s": float(s["step_time_s"][i])}
        args.update({c: float(s[c][i]) for c in ("generated_tokens", "trained_rollouts", "deferred",
                                                   "off_policy_token_frac") if np.isfinite(s[c][i])})
        events.append(_complete(f"step {step}", "step", float(s["start_s"][i]), float(s["end_s"][i]),
                                steps_pid, int(lane), args))
    summary = run.summary
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {"scenario": summary["scenario"], "schedule": summary["schedule"],
                      "profile": summary["profile"], "step_time_s": str(summary["step_time_s"]),
                      "time": "simulated seconds x 1e6 (microseconds)"},
    }


def trace_json(run: RunRecords) -> str:
    """chrome_trace(run) as compact JSON text."""
    return json.dumps(chrome_trace(run), separators=(",", ":"))
