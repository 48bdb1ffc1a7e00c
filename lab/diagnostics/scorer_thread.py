"""Does the intra-step scorer thread slow the training that follows generation on a CPU? (issue 16, item 2)

`rlhfsim validate` on CPU runs OPPO's intra-step scorer as a thread of the step's process
(`calibrate/executor/scorer.py`): it prefills chunks with torch ops on its own OpenMP team while the main
thread decodes, then blocks on its queue, alive, while the main thread trains. This times a training step
(the validation scenarios' `small-qwen2`, AdamW, 4 x 256 tokens, fp32) in the main thread under three
conditions, each in a fresh process so that no thread history carries over:

    none      no other thread
    idle      a scorer thread ran 8 chunk prefills (32 tokens each) with torch's default threads, then
              blocks on a queue while the main thread trains (what the executor does)
    idle-1    the same, with the scorer thread at torch.set_num_threads(1)
    shrunk    as idle, but the scorer thread sets torch.set_num_threads(1) (and runs one small op) once its
              chunks are done, before it blocks
    exited    as idle, but the scorer thread returns (joined) before the main thread trains

Rounds alternate the conditions (none, idle, idle-1, none, ...); each process times 5 training steps after
3 warm-ups and reports their median. The paired ratio idle/none per round is the slowdown (medians over
rounds; rounds let a shared machine's load fall on every condition alike).

    python lab/diagnostics/scorer_thread.py [--rounds 6] [--json]
"""

from __future__ import annotations

import json
import os
import statistics

from _common import alternating_main

CONDITIONS = ("none", "idle", "idle-1", "shrunk", "exited")


def child(cond: str) -> None:
    import queue
    import threading
    import time

    import torch

    from calibrate.measuring.decoder import StaticKVDecoder
    from calibrate.measuring.models import build_hf_model, random_batch
    from rlhfsim.models.catalog import CATALOG

    shape = CATALOG["small-qwen2"]
    model = build_hf_model(shape, "lm", "float32", "cpu").train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
    ids, mask = random_batch(shape.vocab, [256] * 4, "cpu", 1)

    def train_step() -> float:
        t = time.perf_counter()
        model.zero_grad(set_to_none=True)
        model(input_ids=ids, attention_mask=mask, labels=ids).loss.backward()
        opt.step()
        return time.perf_counter() - t

    for _ in range(3):
        train_step()
    q: queue.Queue = queue.Queue()
    th = None
    if cond != "none":
        dec = StaticKVDecoder(shape, dtype=torch.float32, device="cpu", max_slots=2, max_len=512, head="value", seed=0)
        chunk = torch.randint(1, shape.vocab, (1, 32))
        ready = threading.Event()

        def scorer() -> None:
            if cond == "idle-1":
                torch.set_num_threads(1)
            slot = torch.tensor([0])
            with torch.inference_mode():
                for _ in range(8):
                    dec.reset(slot)
                    dec.extend(slot, chunk)
            if cond == "shrunk":
                torch.set_num_threads(1)
                torch.ones(64, 64).sum()
            ready.set()
            if cond != "exited":
                q.get()

        th = threading.Thread(target=scorer, daemon=True)
        th.start()
        ready.wait()
        if cond == "exited":
            th.join()
            th = None
        time.sleep(0.2)
    ts = [train_step() for _ in range(5)]
    if th is not None:
        q.put(None)
        th.join()
    print(json.dumps({"cond": cond, "median_s": statistics.median(ts), "samples_s": ts,
                      "threads": torch.get_num_threads()}))


def main() -> None:
    ran = alternating_main(__file__, __doc__, CONDITIONS, 6, child,
                           lambda c, r: f"{c} {r['median_s'] * 1e3:.0f} ms")
    if ran is None:
        return
    args, runs = ran
    res = {c: [r["median_s"] for r in v] for c, v in runs.items()}
    paired = {c: [x / a for x, a in zip(res[c], res["none"])] for c in CONDITIONS if c != "none"}
    summary = {"rounds": args.rounds, "median_ms": {c: statistics.median(v) * 1e3 for c, v in res.items()},
               "paired_ratio_median": {c: statistics.median(v) for c, v in paired.items()},
               "paired_ratios": paired, "load_avg_1m": os.getloadavg()[0]}
    if args.json:
        print(json.dumps(summary, indent=1))
        return
    for c in CONDITIONS:
        extra = "" if c == "none" else (f"  {c}/none: median {summary['paired_ratio_median'][c]:.3f} "
                                        f"(rounds: {', '.join(f'{x:.2f}' for x in paired[c])})")
        print(f"{c:7s} median train step {summary['median_ms'][c]:.1f} ms{extra}")
    print(f"load average (1 min) at the end: {summary['load_avg_1m']:.2f}")


if __name__ == "__main__":
    main()
