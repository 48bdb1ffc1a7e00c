"""The executor's decode steps inside a real step against the same decoder's steps alone, one process.

``python lab/diagnostics/gpu_instep.py --device cuda --out DIR``

On the H200 the first validation's ``kv_decoder`` decode calls took 46-53 ms in the step where the same
decode step alone took 26 ms (``lab/diagnostics/gpu_parts.py``). This runs, in one process: (1) two real steps
of a GPU-sized scenario (``--scenario``, by default ``scenarios/validate/h200/sync-continuous.yaml`` with
shorter responses), keeping every decode call's seconds, rows and KV positions; (2) right after, a fresh
``StaticKVDecoder`` decoding ``--alone`` steps back to back at the step's typical rows and context, each
step timed; (3) about 3 s of large matrix products, then the same decode steps again. With ``nvidia-smi``
on the path, the SM clock, utilization and power are sampled every 200 ms into ``smi.csv`` beside
``instep.json``, so each phase's timing can be read against the clock the GPU ran at.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from calibrate.measuring.decoder import StaticKVDecoder, sample_next  # noqa: E402
from calibrate.executor import run_steps  # noqa: E402
from calibrate.executor.timing import Clock  # noqa: E402
from calibrate.measuring.models import torch_dtype  # noqa: E402
from calibrate.validation.scenario import prepare  # noqa: E402
from rlhfsim.scenario.loader import parse_set  # noqa: E402


def q(xs: list[float]) -> dict:
    xs = sorted(xs)
    return {"n": len(xs), "median_ms": 1e3 * statistics.median(xs), "p10_ms": 1e3 * xs[len(xs) // 10],
            "p90_ms": 1e3 * xs[9 * len(xs) // 10], "mean_ms": 1e3 * sum(xs) / len(xs)} if xs else {"n": 0}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--scenario", default="scenarios/validate/h200/sync-continuous.yaml")
    ap.add_argument("--set", dest="sets", action="append",
                    default=["workload.max_response_tokens=256", "workload.prompts_per_step=16"])
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--alone", type=int, default=300)
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    dev = torch.device(a.device)
    now = Clock(dev).now   # the executor's clock, as its in-step decode calls were timed
    t0 = time.perf_counter()
    res: dict = {"args": vars(a), "torch": torch.__version__}
    smi = None
    if dev.type == "cuda" and shutil.which("nvidia-smi"):
        smi = subprocess.Popen(["nvidia-smi", "--query-gpu=timestamp,clocks.sm,clocks.mem,utilization.gpu,power.draw,pstate",
                                "--format=csv", "-lms", "200"], stdout=open(out / "smi.csv", "w"), stderr=subprocess.STDOUT)
    marks = []

    def mark(name):
        marks.append((name, time.time()))
        print(f"[{time.perf_counter() - t0:6.1f} s] {name}", flush=True)

    def save():
        res["marks_unix"] = marks
        (out / "instep.json").write_text(json.dumps(res, indent=1))

    try:
        sc, setup, cfg, _ = prepare(Path(a.scenario), a.device, a.steps, None, [parse_set(s) for s in a.sets])
        mark("steps start")
        results = run_steps(cfg)
        mark("steps end")
        steps = []
        for r in results:
            dec = [(s, sh) for name, s, sh in r.ops if name == "decode"]
            steps.append({"step": r.step, "step_time_s": r.step_time_s, "decode": q([s for s, _ in dec]),
                          "decode_by_rows": {str(n): q([s for s, sh in dec if sh["batch"] == n])
                                             for n in sorted({sh["batch"] for _, sh in dec})},
                          "decode_series_ms": [round(1e3 * s, 2) for s, _ in dec][::5],
                          "phases_s": {p: b - a_ for p, (a_, b) in r.phases.items()}})
        res["steps"] = steps
        rows = max(int(k) for k in steps[-1]["decode_by_rows"]) if steps[-1]["decode_by_rows"] else 1
        ctx = 384
        res["alone_shape"] = {"rows": rows, "context": ctx}
        save()
        print(json.dumps({s["step"]: s["decode"] for s in steps}), flush=True)

        shape = cfg.actor
        dt = torch_dtype(cfg.dtype)
        d = StaticKVDecoder(shape, dtype=dt, device=str(dev), max_slots=rows, max_len=ctx + 8, seed=1)
        slots = torch.arange(rows)
        d.reset(slots)
        d.extend(slots, torch.randint(1, shape.vocab, (rows, ctx), device=dev))
        nxt = torch.ones((rows, 1), dtype=torch.long, device=dev)
        gen = torch.Generator(device=dev).manual_seed(0)

        def series(n):
            ts = []
            for _ in range(n):
                d.positions[slots] = ctx
                s = now()
                sample_next(d.extend(slots, nxt), gen)
                ts.append(now() - s)
            return ts

        mark("alone start")
        alone = series(a.alone)
        mark("alone end")
        n = 8192 if dev.type == "cuda" else 256   # about 3 s of large products, the GPU at full load
        x = torch.randn(n, n, device=dev, dtype=dt)
        end = time.perf_counter() + 3.0
        while time.perf_counter() < end:
            for _ in range(20):
                x @ x
            now()
        mark("after burst start")
        hot = series(50)
        mark("after burst end")
        res["alone"] = {"all": q(alone), "first_50": q(alone[:50]), "last_50": q(alone[-50:]),
                        "series_ms": [round(1e3 * s, 2) for s in alone][::5]}
        res["after_burst"] = {"all": q(hot), "series_ms": [round(1e3 * s, 2) for s in hot]}
        print(json.dumps({"alone": res["alone"]["all"], "first_50": res["alone"]["first_50"],
                          "last_50": res["alone"]["last_50"], "after_burst": res["after_burst"]["all"]}), flush=True)
        save()
    finally:
        if smi is not None:
            smi.terminate()
    return 0


if __name__ == "__main__":
    sys.exit(main())
