"""One time-boxed calibration session on a lent GPU (``python lab/gpu/gpu_session.py --out DIR``).

A lent GPU machine comes for minutes, starts bare, and gives back only what lies under one directory
when the command ends (or is killed at its limit). This runs the calibration in stages, each a child
process with its own deadline inside ``--budget-s``, so that a stage that runs long costs only itself:

1. ``env``: ``nvidia-smi``, package versions, and the two ceilings measured here (a device-to-device
   copy, counting bytes read and written; an 8192^3 bf16 matrix product on random data), ``env.json``.
2. ``calibrate``: ``python -m calibrate calibrate --gpu GPU --quick`` over ``--models`` with the plan's
   grid (``PLANS``; compiled generation runtimes left out), journal and profile in DIR. Cut at its
   deadline by SIGTERM (the calibrator keeps its journal; SIGKILL 20 s later if it does not stop).
3. ``step``: ``python -m calibrate.measuring.stepbench`` (the framework step scalars of issue 17) on a copy of
   the profile, ``step.json``, merged into the final profile at the end.
4. ``compiled``: the compiled generation runtimes (``hf_static``) on the first model, ``--resume`` on the
   same journal, so only their points are measured.
5. ``assemble``: ``--from-journal``: the profile from every point the journal holds, whichever stages
   finished (points a cut stage did not reach are absent; their operations fall back as in any profile).
6. ``validate`` (with ``--validate``, only if at least ``VALIDATE_MIN_S`` remain): ``rlhfsim validate
   --device cuda`` on the GPU-sized scenarios with the fresh profile, two steps, ``validation.json``.

``session.json`` records every stage's command, exit code, seconds and whether its deadline cut it;
``session.log`` has every stage's output. At most 8 files are written to DIR (what the device tool
brings back). Needs torch and transformers (and simpy + pydantic for stage 6 only).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

# Run as a script from a checkout (``python lab/gpu/NAME.py``): the repository root on the import path, so a
# bare device image needs no install; children get it through PYTHONPATH (Session.run).
ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [p for p in (str(ROOT), str(Path(__file__).resolve().parent)) if p not in sys.path]

# Stage deadlines as fractions of the budget (cumulative ends); what a stage leaves unused goes to the next.
ENDS = {"env": 0.04, "calibrate": 0.56, "step": 0.66, "compiled": 0.9, "assemble": 0.97}
VALIDATE_MIN_S = 120.0
KILL_GRACE_S = 20.0

# Grid overrides on calibrate.running.grid.QUICK_GPU: one sample discipline fit for a GPU's low jitter, with the
# long points shortened so that two decoders (a small one and a 7B) fit in minutes. Handoff: N = 32 new
# tokens in chunks of 4 or 8 (7 or 3 boundaries), so a point costs two ~32-step generate() calls.
PLANS = {
    "quick-session": {
        "warmup": 1, "min_iters": 3, "max_iters": 15, "point_budget_s": 0.25, "rounds": 4, "per_round": 3,
        "strategies": [[32, 512]],
        "chunk_batches": [8, 32], "chunk_prefixes": [0, 2048], "chunk_sizes": [128, 512],
        "gen_decode_steps": 15, "gen_point_budget_s": 0.5,
        "handoff": [[8, 128, 32, 4], [64, 128, 32, 4], [64, 128, 32, 8]],
        "interference_s": 2.0, "step_iters": 0,
    },
}
UNCOMPILED = ["hf_generate", "kv_decoder", "vllm", "sglang"]
COMPILED = ["hf_static"]


def _ceilings() -> dict:
    """Copy bandwidth (bytes read + written per second) and bf16 matmul FLOP/s on random data, the
    medians of 10 timed calls after 3 warm-ups, with CUDA events."""
    import torch

    def timed(fn, n=10):
        for _ in range(3):
            fn()
        out = []
        for _ in range(n):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            torch.cuda.synchronize()
            out.append(a.elapsed_time(b) / 1e3)
        return sorted(out)[len(out) // 2]

    src = torch.randn(2**30 // 2, dtype=torch.bfloat16, device="cuda")   # 1 GiB
    dst = torch.empty_like(src)
    copy_s = timed(lambda: dst.copy_(src))
    n = 8192
    x = torch.randn(n, n, dtype=torch.bfloat16, device="cuda")
    y = torch.randn(n, n, dtype=torch.bfloat16, device="cuda")
    mm_s = timed(lambda: x @ y)
    return {"copy_bytes_per_s": 2 * src.numel() * 2 / copy_s, "bf16_matmul_flops": 2 * n**3 / mm_s,
            "copy_s": copy_s, "matmul_s": mm_s, "method": "median of 10 CUDA-event timings after 3 warm-ups; "
            "copy of 1 GiB counts read + written bytes; 8192^3 bf16 matmul on torch.randn data"}


def _env() -> dict:
    import importlib.metadata as md

    import torch

    out = {"python": sys.version.split()[0], "packages": {}}
    for p in ("torch", "transformers", "tokenizers", "onnxruntime", "numpy", "scipy", "simpy", "pydantic",
              "vllm", "sglang"):
        try:
            out["packages"][p] = md.version(p)
        except md.PackageNotFoundError:
            out["packages"][p] = None
    try:
        out["nvidia_smi"] = subprocess.run(["nvidia-smi"], capture_output=True, text=True, timeout=30).stdout
        out["nvidia_smi_query"] = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm,power.limit",
             "--format=csv"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError) as e:
        out["nvidia_smi"] = f"unavailable: {e}"
    out["cuda"] = torch.cuda.is_available()
    if out["cuda"]:
        p = torch.cuda.get_device_properties(0)
        out["device"] = {"name": p.name, "memory_bytes": p.total_memory, "sms": p.multi_processor_count,
                         "capability": f"{p.major}.{p.minor}"}
        out["ceilings"] = _ceilings()
        from calibrate.measuring.devstate import host_probe

        out["host_probe"] = host_probe("cuda")   # the host's dispatch rate, CPU and CUDA (calibrate.measuring.devstate)
    out["cpu_count"] = os.cpu_count()
    return out


class Session:
    def __init__(self, out: Path, budget_s: float):
        self.out, self.budget_s, self.t0 = out, budget_s, time.monotonic()
        self.log = open(out / "session.log", "a", encoding="utf-8")
        self.stages: list[dict] = []

    def left(self) -> float:
        return self.budget_s - (time.monotonic() - self.t0)

    def deadline(self, stage: str) -> float:
        """Seconds this stage may run: to its end mark, never past the budget."""
        return max(0.0, min(ENDS.get(stage, 1.0) * self.budget_s - (time.monotonic() - self.t0), self.left()))

    def run(self, stage: str, cmd: list[str], limit_s: float, env: dict | None = None) -> dict:
        rec = {"stage": stage, "command": shlex.join(cmd), "limit_s": round(limit_s, 1)}
        if limit_s < 5:
            rec.update(rc=None, seconds=0.0, cut=False, skipped="no time left")
            return self._done(rec)
        self.say(f"== {stage} (limit {limit_s:.0f} s): {rec['command']}")
        t = time.monotonic()
        proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, "PYTHONUNBUFFERED": "1",
                                     "PYTHONPATH": os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH")))),
                                     **(env or {})})
        cut = False
        try:
            proc.wait(timeout=limit_s)
        except subprocess.TimeoutExpired:
            cut = True
            self._signal(proc, signal.SIGTERM)
            try:
                proc.wait(timeout=KILL_GRACE_S)
            except subprocess.TimeoutExpired:
                self._signal(proc, signal.SIGKILL)
                proc.wait()
        rec.update(rc=proc.returncode, seconds=round(time.monotonic() - t, 1), cut=cut)
        return self._done(rec)

    @staticmethod
    def _signal(proc, sig) -> None:
        try:
            os.killpg(proc.pid, sig)         # the stage and its workers (inductor compiles in subprocesses)
        except ProcessLookupError:
            pass

    def _done(self, rec: dict) -> dict:
        self.stages.append(rec)
        self.say(f"== {rec['stage']}: rc {rec['rc']}, {rec['seconds']} s" + (" (cut at its deadline)" if rec["cut"] else "")
                  + (f" ({rec['skipped']})" if rec.get("skipped") else ""))
        (self.out / "session.json").write_text(json.dumps({"budget_s": self.budget_s, "stages": self.stages}, indent=1))
        return rec

    def say(self, text: str) -> None:
        line = f"[{time.monotonic() - self.t0:6.1f} s] {text}"
        print(line, flush=True)
        self.log.write(line + "\n")
        self.log.flush()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python lab/gpu/gpu_session.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="Directory for the session's files (at most 8).")
    ap.add_argument("--budget-s", type=float, default=500.0, help="Wall time for all stages together.")
    ap.add_argument("--gpu", default="h200", help="Catalog GPU the device must be (the profile's name).")
    ap.add_argument("--models", default="qwen2.5-0.5b,qwen2.5-7b,deberta-v3-large")
    ap.add_argument("--critic-models", default="qwen2.5-0.5b", help="Decoders also measured with the value head.")
    ap.add_argument("--plan", default="quick-session", choices=sorted(PLANS))
    ap.add_argument("--device", default="cuda", help="cuda (the session's purpose) or cpu (to rehearse it).")
    ap.add_argument("--grid-extra", default="{}", help="JSON grid fields over the plan's (rehearsals use tiny shapes).")
    ap.add_argument("--validate", action="store_true", help="Stage 6: validate on --scenarios if time is left.")
    ap.add_argument("--scenarios", default="scenarios/validate/h200/sync-static.yaml,scenarios/validate/h200/oppo-intra.yaml",
                    help="Validation scenarios (paths relative to the repository root), comma-separated.")
    ap.add_argument("--resume", action="store_true", help="Continue the journal already in --out (a second session).")
    ap.add_argument("--skip", default="", help="Stages to leave out, comma-separated (step, compiled).")
    ap.add_argument("--env-only", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.env_only:
        (out / "env.json").write_text(json.dumps(_env(), indent=1))
        return 0
    s = Session(out, args.budget_s)
    py = sys.executable
    s.run("env", [py, str(Path(__file__).resolve().parent / "gpu_session.py"), "--out", str(out), "--env-only"], s.deadline("env"))

    profile = out / f"{args.gpu if args.device == 'cuda' else 'rehearsal'}.json"
    grid = {**PLANS[args.plan], "critic_models": [m for m in args.critic_models.split(",") if m],
            **json.loads(args.grid_extra)}
    target = ["--gpu", args.gpu] if args.device == "cuda" else ["--device", "cpu", "--name", "rehearsal"]

    def calibrate(models: str, *extra: str, progress: bool = True) -> list[str]:
        """A calibrate command over ``models`` writing ``profile`` (per-point progress lines unless not
        ``progress``: stderr is not a terminal, so they come as lines)."""
        return [py, "-m", "calibrate", "calibrate", *target, "--quick", "--models", models, "--runtimes", "eager",
                "--out", str(profile), *([] if progress else ["--no-progress"]), *extra]

    skip = set(args.skip.split(","))
    s.run("calibrate", calibrate(args.models, *(["--resume"] if args.resume else []),
                                 "--grid", json.dumps({**grid, "gen_runtimes": UNCOMPILED})),
          s.left() - 40 if {"step", "compiled"} <= skip else s.deadline("calibrate"))

    step_file = out / "step.json"
    first = args.models.split(",")[0]
    if "step" not in skip and (profile.is_file() or s.run(
            "assemble", calibrate(args.models, "--from-journal", "--grid", json.dumps(grid), progress=False),
            min(60.0, s.left()))["rc"] == 0):
        step_file.write_bytes(profile.read_bytes())
        s.run("step", [py, "-m", "calibrate.measuring.stepbench", str(step_file), "--device", args.device, "--model", first],
              s.deadline("step"))
    if "compiled" not in skip:    # the first model only: nothing else is rebuilt
        s.run("compiled", calibrate(first, "--resume", "--grid", json.dumps({**grid, "gen_runtimes": COMPILED,
                                                                             "gen_compiled_models": 1})),
              s.deadline("compiled"))
    every = {**grid, "gen_runtimes": UNCOMPILED + COMPILED, "gen_compiled_models": 1}
    s.run("assemble", calibrate(args.models, "--from-journal", "--grid", json.dumps(every), progress=False),
          s.deadline("assemble"))
    _merge_step(s, profile, step_file)
    if args.validate and s.left() >= VALIDATE_MIN_S and profile.is_file():
        root = ROOT
        scen = [a for p in args.scenarios.split(",") if p for a in ("--scenario", str(root / p))]
        s.run("validate", [py, "-m", "rlhfsim.cli", "validate", "--device", args.device, "--sequential",
                           "--steps", "2", "--profile", str(profile), "--format", "json",
                           "--out", str(out / "validation.json"), *scen], s.left() - 5)
    s.say("== files: " + ", ".join(sorted(p.name for p in out.iterdir())))
    return 0 if profile.is_file() else 1


def _merge_step(s: Session, profile: Path, step_file: Path) -> None:
    """The step scalars measured on the stage-2 profile's copy, put into the final profile."""
    from rlhfsim.files import write_json_atomic

    try:
        step = json.loads(step_file.read_text()).get("step")
        if not (step and profile.is_file()):
            s.say("== merge: no step scalars to merge" if profile.is_file() else "== merge: no profile")
            return
        write_json_atomic(profile, {**json.loads(profile.read_text()), "step": step})
        s.say("== merge: step scalars merged into " + profile.name)
    except (OSError, ValueError) as e:
        s.say(f"== merge failed: {e}")


if __name__ == "__main__":
    sys.exit(main())
