"""Which CPU, and in which state, a profile was measured on; and whether this machine is the same now.

A CPU profile prices operations at the speeds of the machine it was measured on. Two things make those
speeds wrong for a run elsewhere, and neither shows in the profile's own held-out errors:

- **another processor**: the machine behind a name such as "2-vCPU VM" changes (this project's
  development VM was an Intel Xeon, then an AMD EPYC, then an Intel Xeon with a 480 MiB L3 again);
- **another memory state on the same processor**: on a shared host the memory of the same VM was measured
  22-42% faster for 8-20 MB weight matrices one evening than 2 hours earlier, while 2 MB ones (in cache)
  stayed within 7% (measured on this project's development VM).

``state_probe`` measures the two rates the cost model's roofline rests on, in the shapes the decode and
training operations have: a one-row GEMV over float32 weight matrices of 2, 8 and 32 MiB (bytes per
second: in cache, around the last-level cache of a small VM, beyond it) and a 256-row GEMM (FLOP per
second); and a third rate the roofline does not see but the small models' operations are made of, the
host's **dispatch rate**: a chain of small layers (``DISPATCH_LAYERS`` x linear 64x64, layer norm, SiLU on
16 rows) run forward and backward through autograd, in operator calls per second. The models a CPU
validates are small enough that most of a call is this per-operator host work (Python, the dispatcher,
autograd, thread hand-offs), and on a shared host it moves on its own: on this project's VM the
calibration's own training points re-timed 2 hours after the calibration took 1.10-1.29x as long, and the
host's dispatch rate went from 104-123 to 67-86 thousand operator calls per second within the next 90
minutes of continuous work. A calibration stores it at its start and end (``device.state_probe_at_start``/``_at_end``);
``rlhfsim validate`` takes it again before and after the real steps and compares (``device_check``): a
different CPU model, or a rate that moved by more than ``TOLERANCE``, is printed as a warning and kept in
the document, so that a prediction's error can be read against the state it was made in. Nothing here
changes a prediction: the remedy is to calibrate this machine (``rlhfsim calibrate --device cpu --quick``),
not to scale a profile by a ratio.
"""

from __future__ import annotations

import statistics
import time

import torch

GEMV_MIB = (2, 8, 32)     # weight-matrix sizes of the memory probe, MiB (float32)
GEMV_COLS = 1024
GEMM_SHAPE = (256, 1024, 1024)   # rows x in x out of the compute probe
DISPATCH_LAYERS = 16      # small layers of the dispatch probe (3 operators each forward)
DISPATCH_SHAPE = (16, 64)  # rows x width of its activations (a few KiB: nothing for the memory system)
TOLERANCE = 0.15          # |rate now / rate in the profile - 1| beyond which validate warns
PROBE_VERSION = 2         # 2: the dispatch rate


def median_call_s(fn, calls: int) -> float:
    """Median seconds of ``calls`` timed calls of ``fn`` after two untimed ones (host clock: CPU work)."""
    fn()
    fn()
    ts = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def state_probe(threads: int | None = None, calls: int = 15) -> dict:
    """Memory rate of a one-row GEMV per weight size (GB/s) and compute rate of a GEMM (GFLOP/s), each the
    median of ``calls`` timed calls after two untimed ones, with ``threads`` torch threads (default:
    torch's); about half a second on a 2-core VM."""
    from calibrate.measuring.device_info import cpu_model, load_avg, usable_cores

    old = torch.get_num_threads()
    if threads:
        torch.set_num_threads(int(threads))
    try:
        with torch.inference_mode():
            gemv = {}
            for mib in GEMV_MIB:
                rows = mib * 2**20 // (4 * GEMV_COLS)
                w = torch.randn(rows, GEMV_COLS)
                x = torch.randn(1, GEMV_COLS)
                t = median_call_s(lambda: torch.nn.functional.linear(x, w), calls)
                gemv[str(mib)] = w.numel() * 4 / t / 1e9
                del w
            m, k, n = GEMM_SHAPE
            a, b = torch.randn(m, k), torch.randn(n, k)
            t = median_call_s(lambda: torch.nn.functional.linear(a, b), calls)
            gemm = 2 * m * k * n / t / 1e9
        dispatch = dispatch_rate(calls)
    finally:
        torch.set_num_threads(old)
    return {"version": PROBE_VERSION, "cpu_model": cpu_model(), "cpu_cores": usable_cores(),
            "threads": int(threads or old), "load_avg_1m": load_avg(), "gemv_gb_s": gemv, "gemm_gflop_s": gemm,
            "dispatch_kops_s": dispatch}


def dispatch_rate(calls: int = 15, device: str = "cpu") -> float:
    """Thousands of operator calls per second through a chain of ``DISPATCH_LAYERS`` small layers (linear,
    layer norm, SiLU on ``DISPATCH_SHAPE`` activations) forward and backward with autograd: the median of
    ``calls`` timed passes. Counted as 3 operators per layer forward and 3 backward (the real count of
    kernels is larger; only the ratio between two probes is used). On ``cuda`` the same chain on the device,
    synchronised at the end of each pass: its kernels are tiny, so this is the host's rate of dispatching
    and launching them, what a small model's decode step on a GPU is bound by (``host_probe``)."""
    rows, width = DISPATCH_SHAPE
    gen = torch.Generator().manual_seed(0)
    weights = [torch.randn(width, width, generator=gen).to(device).requires_grad_() for _ in range(DISPATCH_LAYERS)]
    x0 = torch.randn(rows, width, generator=gen).to(device)
    cuda = torch.device(device).type == "cuda"

    def chain():
        x = x0
        for w in weights:
            x = torch.nn.functional.silu(torch.nn.functional.layer_norm(torch.nn.functional.linear(x, w), (width,)))
        x.sum().backward()
        for w in weights:
            w.grad = None
        if cuda:
            torch.cuda.synchronize(device)

    t = median_call_s(chain, calls)
    return 6 * DISPATCH_LAYERS / t / 1e3


def host_probe(device: str, calls: int = 15) -> dict:
    """The host's speed beside a GPU: the dispatch chain on the CPU and on ``device`` (``dispatch_rate``),
    thousands of operator calls per second. On the H200 a small model's step was host-bound (utilization
    4-15% at full clock) and the same decode call moved between 20 and 105 ms from one stretch of seconds to
    the next; a GPU validation records this before and after its steps, and the
    GPU session's ``env.json`` at calibration, so a later comparison can tell a slower host from a model
    miss. Nothing here changes a prediction."""
    from calibrate.measuring.device_info import cpu_model, load_avg, usable_cores

    return {"version": PROBE_VERSION, "device": device, "cpu_model": cpu_model(), "cpu_cores": usable_cores(),
            "load_avg_1m": load_avg(), "dispatch_kops_s": dispatch_rate(calls),
            "device_dispatch_kops_s": dispatch_rate(calls, device)}


def _rates(probe: dict) -> dict[str, float]:
    out = {f"gemv_{k}MiB": float(v) for k, v in (probe.get("gemv_gb_s") or {}).items()}
    if probe.get("gemm_gflop_s"):
        out["gemm"] = float(probe["gemm_gflop_s"])
    if probe.get("dispatch_kops_s"):  # probe version 2 on
        out["dispatch"] = float(probe["dispatch_kops_s"])
    return out


def profile_probes(profile: dict) -> list[dict]:
    """The probes a profile's calibration took, oldest first: those of every pass when its passes were
    measured apart (``device.state_probes``, ``pool_pass_probes``), else its start and end; empty for
    profiles measured before the probe existed or on a GPU."""
    dev = profile.get("device") or {}
    if isinstance(dev.get("state_probes"), list):
        return [p for p in dev["state_probes"] if isinstance(p, dict)]
    return [p for p in (dev.get("state_probe_at_start"), dev.get("state_probe_at_end")) if isinstance(p, dict)]


def pool_pass_probes(path, prior: list[dict]) -> None:
    """After one more pass of a calibration whose passes are measured apart (each run writes the profile
    at ``path`` anew, with its own start and end probes): keep the probes of the passes before it
    (``prior``, ``profile_probes`` of the profile before this pass) beside this pass's, as
    ``device.state_probes``, so the device check sets a profile pooled over its passes against the machine
    over all of them, not over its last pass."""
    import json
    from pathlib import Path

    from rlhfsim.files import write_json_atomic

    if not prior:
        return
    doc = json.loads(Path(path).read_text())
    doc["device"]["state_probes"] = [*prior, *profile_probes(doc)]
    write_json_atomic(Path(path), doc)


def _env_text(env: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(env.items())) or "the defaults"


def compare(profile: dict, now: list[dict]) -> dict:
    """The ``device_check`` of one profile against the probes taken now: the CPU models, and per rate the
    ratio of now's median to the profile's median (above 1: this machine is faster now than when the
    profile was measured); ``warnings`` names each mismatch in one line."""
    dev = profile.get("device") or {}
    name = profile.get("name", "?")
    local_model = now[0]["cpu_model"] if now else None
    prof_model = dev.get("cpu_model") or dev.get("name")
    out: dict = {"profile": name, "profile_cpu_model": prof_model, "local_cpu_model": local_model,
                 "same_cpu_model": None if prof_model is None or local_model is None else prof_model == local_model,
                 "ratios": {}, "warnings": []}
    if dev.get("kind") not in (None, "cpu"):
        out["warnings"].append(f"profile {name!r} was measured on a {dev.get('kind')} device; this check covers CPU profiles only")
        return out
    if out["same_cpu_model"] is False:
        out["warnings"].append(f"profile {name!r} was measured on {prof_model!r}, this machine is {local_model!r}: "
                               "its predictions price another processor (calibrate this one: rlhfsim calibrate --device cpu --quick)")
    then_env = dev.get("thread_env")
    if isinstance(then_env, dict):   # absent from profiles older than the record (calibrate.measuring.device_info.THREAD_ENV)
        from calibrate.measuring.device_info import thread_env

        now_env = thread_env()
        if now_env != then_env:
            out["warnings"].append(f"profile {name!r} was measured with thread-pool settings {_env_text(then_env)}, "
                                   f"this run has {_env_text(now_env)}: a decode step of two rows or more can take "
                                   "several times as long when the pool's workers sleep between parallel regions "
                                   "(lab/diagnostics/decode_threadpool.py; calibrate again with the same settings)")
    from calibrate.cpu.threadpool import scorer_threads

    mine_threads = scorer_threads(False)   # the executor's scorer thread on this CPU (older profiles measured another count)
    stale = sorted(rt for rt, h in ((profile.get("interference") or {}).get("handover") or {}).items()
                   if isinstance(h, dict) and h.get("scorer_threads") != mine_threads)
    if stale:
        then = "a scorer thread that owned an OpenMP team" if mine_threads == 1 else "a one-thread scorer"
        out["warnings"].append(f"profile {name!r} measured its hand-over points ({', '.join(stale)}) with {then}, "
                               f"unlike this run's executor: its intra-step scenarios' co-running is priced from another "
                               "pattern (calibrate.cpu.threadpool; calibrate again)")
    theirs = [_rates(p) for p in profile_probes(profile)]
    mine = [_rates(p) for p in now]
    if not theirs:
        out["warnings"].append(f"profile {name!r} has no device state probe (measured before it existed): "
                               "whether this machine's memory and compute rates match it cannot be checked")
        return out
    moved = []
    for key in theirs[0]:
        a = [r[key] for r in theirs if key in r]
        b = [r[key] for r in mine if key in r]
        if a and b:
            ratio = statistics.median(b) / statistics.median(a)
            out["ratios"][key] = ratio
            if abs(ratio - 1) > TOLERANCE:
                moved.append(f"{key} x{ratio:.2f}")
    if moved:
        out["warnings"].append(f"this machine's rates moved since profile {name!r} was measured (now / then: {', '.join(moved)}): "
                               "its predictions of those operations are off by about as much (calibrate again in this state)")
    return out
