"""The executor's decode step at 1, 2, 4 and 8 rows under the OpenMP thread pool's wait policies: what a
step of two rows or more pays when torch's worker threads have gone to sleep between parallel regions.
Not a speed benchmark: it measures why a decode step's price at two rows or more moves with the state of
the thread pool on a CPU, which a calibration point and a real step need not share, and what a second
thread's OpenMP team does to it.

    python lab/diagnostics/decode_threadpool.py                    # tiny-qwen2 and small-qwen2, 3 rounds
    python lab/diagnostics/decode_threadpool.py --models tiny-qwen2 --rounds 5 --json

Conditions, each in a fresh process (the policy is read when torch loads its OpenMP runtime), alternating
round after round so that a shared machine's drift falls on all of them alike:

* ``t2-default``: torch's threads (2 on the 2-vCPU VM), the runtime's own policy (spin a while, then sleep);
* ``t2-passive``: ``OMP_WAIT_POLICY=PASSIVE``: the workers sleep as soon as a parallel region ends, so every
  region of the next step wakes them;
* ``t2-active``: ``OMP_WAIT_POLICY=ACTIVE``: the workers spin between regions;
* ``t1``: one thread (``torch.set_num_threads(1)``): no parallel region at all;
* ``t2-peer``: the default policy, with a second Python thread alive that ran one matrix product with torch's
  threads (so it owns an OpenMP team of its own, as the executor's intra-step scorer thread does) and now
  blocks on a queue: it uses no CPU, but its team's worker counts in libgomp's ``gomp_managed_threads``;
  once that count exceeds the CPUs, every wait spins ``gomp_throttled_spin_count_var`` times (100 under the
  default policy) instead of ``gomp_spin_count_var`` (300,000) before it sleeps (libgomp ``env.c``,
  ``wait.h`` ``do_spin``), so the main thread's workers sleep between regions as under ``PASSIVE``;
* ``t2-peer-noteam``: the control: a peer thread alive and blocked in the same way that ran only an operation
  too small for a parallel region (``torch.ones(4) + 1``), so it owns no team. (Not ``torch.set_num_threads(1)``
  in the peer: that sets the thread count of every thread that has not yet run a parallel region, and MKL's
  for all.) In both peer conditions the main thread runs one matrix product before the peer starts.
* ``t2-peer-1t``: the executor's scorer thread as it runs now: the peer sets itself (alone) to one OpenMP
  thread (``calibrate.cpu.threadpool.one_thread_here``) and then runs the same matrix product, on one thread, so it
  owns no team either.

Each cell is the median over ``--iters`` timed calls (``calibrate.measuring.measure.time_calls``, after 10 untimed) of
``Generator._decode``, the calibration's decode loop (``calibrate.measuring.bench.measure_generation``: a
``StaticKVDecoder`` at 64 cached tokens per row, rewound before every call), float32; the table gives, per
condition, the median over the rounds and the rounds' range.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

from _common import alternating_main, decode_step_ms

CONDITIONS = ("t2-default", "t2-passive", "t2-active", "t1", "t2-peer", "t2-peer-noteam", "t2-peer-1t")
ROWS = (1, 2, 4, 8)
CONTEXT = 64


def _args() -> tuple[list[str], int]:
    """``--models`` and ``--iters``, taken off the command line (the shared parser knows ``--rounds`` and
    ``--json``) and passed on in the environment: the children are launched with ``--child COND`` alone."""
    ap = argparse.ArgumentParser(add_help=False)
    ap.add_argument("--models", default=os.environ.get("DECODE_THREADPOOL_MODELS", "tiny-qwen2,small-qwen2"))
    ap.add_argument("--iters", type=int, default=int(os.environ.get("DECODE_THREADPOOL_ITERS", "150")))
    a, rest = ap.parse_known_args()
    sys.argv[1:] = rest
    os.environ["DECODE_THREADPOOL_MODELS"], os.environ["DECODE_THREADPOOL_ITERS"] = a.models, str(a.iters)
    return [m for m in a.models.split(",") if m], max(20, a.iters)


def child(cond: str) -> None:
    if cond == "t2-passive":
        os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
    elif cond == "t2-active":
        os.environ["OMP_WAIT_POLICY"] = "ACTIVE"
    import torch

    from calibrate.measuring.decoder import StaticKVDecoder
    from rlhfsim.models.catalog import CATALOG

    if cond == "t1":
        torch.set_num_threads(1)
    peer = None
    if cond in ("t2-peer", "t2-peer-noteam", "t2-peer-1t"):
        import queue
        import threading

        def region():    # a matrix product: one parallel region on the calling thread's own team
            torch.randn(64, 256) @ torch.randn(256, 256)

        region()         # the main thread's own team first
        ready, stop = threading.Event(), queue.Queue()

        def peer_body():
            if cond == "t2-peer":
                region()
            elif cond == "t2-peer-1t":
                from calibrate.cpu.threadpool import one_thread_here

                one_thread_here()
                region()                                      # on one thread: no team
            else:
                torch.ones(4) + 1                               # torch, but no parallel region
            ready.set()
            stop.get()                                        # alive and blocked, as an idle scorer thread

        peer = threading.Thread(target=peer_body, daemon=True)
        peer.start()
        ready.wait()
    models, iters = _args()
    out = {"threads": torch.get_num_threads(), "ms": {}}
    with torch.inference_mode():
        for name in models:
            shape = CATALOG[name]
            dec = StaticKVDecoder(shape, dtype=torch.float32, device=torch.device("cpu"), max_slots=max(ROWS),
                                  max_len=CONTEXT + 2, head="lm", seed=0)
            for b in ROWS:
                out["ms"][f"{name}/{b}"] = decode_step_ms(dec, shape.vocab, b, CONTEXT, iters)
            del dec
    out["os_threads"] = len(os.listdir("/proc/self/task")) if os.path.isdir("/proc/self/task") else None
    if peer is not None:
        stop.put(None)
        peer.join()
    print(json.dumps(out))


def main() -> None:
    models, _ = _args()
    got = alternating_main(__file__, __doc__, CONDITIONS, 3, child,
                           lambda c, r: f"{c} {min(r['ms'].values()):.2f}-{max(r['ms'].values()):.2f} ms")
    if got is None:
        return
    args, res = got
    summary = {c: {k: {"median_ms": statistics.median(r["ms"][k] for r in runs),
                       "min_ms": min(r["ms"][k] for r in runs), "max_ms": max(r["ms"][k] for r in runs)}
                   for k in runs[0]["ms"]} for c, runs in res.items()}
    if args.json:
        import torch
        print(json.dumps({"torch": torch.__version__, "rounds": args.rounds, "context": CONTEXT, "models": models,
                          "conditions": summary, "runs": res}, indent=1))
        return
    print(f"decode step (ms), {CONTEXT} cached tokens per row, median of {args.rounds} rounds [range]")
    print(f"{'model':>14} {'rows':>4} " + " ".join(f"{c:>20}" for c in CONDITIONS))
    for name in models:
        for b in ROWS:
            k = f"{name}/{b}"
            print(f"{name:>14} {b:>4} " + " ".join(
                f"{summary[c][k]['median_ms']:>7.2f} [{summary[c][k]['min_ms']:.2f}-{summary[c][k]['max_ms']:.2f}]".rjust(20)
                for c in CONDITIONS))
    print("OS threads in the child at the end: " + ", ".join(f"{c} {res[c][0].get('os_threads')}" for c in CONDITIONS))


if __name__ == "__main__":
    main()
