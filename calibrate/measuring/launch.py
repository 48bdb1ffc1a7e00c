"""Repeated process launches (``Grid.launches`` > 1, ``calibrate --launches N``): each launch of one
scoring operating point is a fresh Python process (``python -m calibrate.measuring.launch SPEC OUT``) that builds
the reward model again (same seed, so the same weights; a checkpoint is reloaded), prepares every
runtime (exports and AOTInductor packages come from the on-disk cache; ``torch.compile`` compiles
again) and runs the interleaved rounds (``calibrate.measuring.scoring.interleaved_point``). Launch-level effects
(allocator state, memory layout, which cores the threads land on, a one-off slow process) then show up
as spread between launches instead of being frozen into one measurement, which is what the study's
repeated launches guard against.

The parent pools the launches: samples and their round indices concatenated (round indices offset per
launch, ``launch_of`` per sample), ``first_call_s``/``setup_s`` of the first launch, the worst
``max_abs_diff``, the highest peak memory; a runtime that failed in any launch is an error.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

from rlhfsim.errors import RlhfsimError

LAUNCH_TIMEOUT_S = 3600


def run_launches(s, names: list[str], shape, batch: int, n: int, launches: int) -> dict[str, dict]:
    """``launches`` child processes of one operating point, pooled (see the module docstring)."""
    import torch

    g = s.grid
    per: list[dict] = []
    for k in range(launches):
        spec = {"shape": shape.to_dict(), "checkpoint": str(s.checkpoints[shape.name]) if shape.name in s.checkpoints else None,
                "runtimes": names, "batch": batch, "seq_len": n, "device": s.device, "dtype": s.dtype,
                "threads": torch.get_num_threads(), "warmup": g.warmup, "rounds": g.rounds,
                "per_round": g.per_round, "cache_dir": str(s.cache_dir), "round_offset": k * g.rounds}
        with tempfile.TemporaryDirectory(prefix="rlhfsim-launch-") as td:
            sp, op = Path(td) / "spec.json", Path(td) / "out.json"
            sp.write_text(json.dumps(spec))
            proc = subprocess.run([sys.executable, "-m", "calibrate.measuring.launch", str(sp), str(op)], capture_output=True,
                                  text=True, timeout=LAUNCH_TIMEOUT_S)
            if proc.returncode != 0:
                last = ([ln for ln in proc.stderr.splitlines() if ln.strip()] or ["no message"])[-1]
                raise RlhfsimError(f"launch {k + 1}/{launches} of {shape.name} b={batch} n={n} failed: {last}")
            per.append(json.loads(op.read_text()))
    out: dict[str, dict] = {}
    for name in names:
        runs = [p[name] for p in per]
        err = next((r["error"] for r in runs if "error" in r), None)
        if err is not None:
            out[name] = {"error": err}
            continue
        first = runs[0]
        rec = {k: first[k] for k in ("first_call_s", "tolerance")}
        rec["max_abs_diff"] = max(r["max_abs_diff"] for r in runs)
        rec["valid"] = all(r["valid"] for r in runs)
        peaks = [r["peak_mem_mb"] for r in runs if r.get("peak_mem_mb") is not None]
        rec["peak_mem_mb"] = max(peaks) if peaks else None
        extra = [r["peak_mem_extra_mb"] for r in runs if r.get("peak_mem_extra_mb") is not None]
        rec["peak_mem_extra_mb"] = max(extra) if extra else None
        if rec["valid"]:
            rec["samples_s"] = [x for r in runs for x in r["samples_s"]]
            rec["rounds_of"] = [x for r in runs for x in r["rounds_of"]]
            rec["launch_of"] = [k for k, r in enumerate(runs) for _ in r["samples_s"]]
            rec["setup_s"] = first["setup_s"]
            rec["first_call_s_by_launch"] = [r["first_call_s"] for r in runs]
        out[name] = rec
    return out


def main(spec_path: str, out_path: str) -> None:
    import torch

    from calibrate.measuring.models import build_hf_model, load_hf_checkpoint, random_batch
    from calibrate.runtimes import RUNTIMES
    from calibrate.measuring.scoring import _seed, interleaved_point
    from calibrate.running.session import SEED
    from rlhfsim.models.catalog import ModelShape

    spec = json.loads(Path(spec_path).read_text())
    torch.set_num_threads(spec["threads"])
    shape = ModelShape(**spec["shape"])
    if spec["checkpoint"]:
        model = load_hf_checkpoint(spec["checkpoint"], "value", spec["dtype"], spec["device"])
    else:
        model = build_hf_model(shape, "value", spec["dtype"], spec["device"], seed=SEED)
    b, n = spec["batch"], spec["seq_len"]
    ids, mask = random_batch(shape.vocab, [n] * b, spec["device"], _seed(b, n))
    rts = {name: RUNTIMES[name]() for name in spec["runtimes"]}
    res = interleaved_point(model, rts, ids, mask, device=spec["device"], dtype=spec["dtype"], warmup=spec["warmup"],
                            rounds=spec["rounds"], per_round=spec["per_round"], cache_dir=Path(spec["cache_dir"]),
                            round_offset=spec["round_offset"])
    Path(out_path).write_text(json.dumps(res))


if __name__ == "__main__":
    main(*sys.argv[1:3])
