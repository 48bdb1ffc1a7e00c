"""How much does the intra-step scorer slow HF generate() beside it, and itself, as the executor runs it
compared with how the calibrator measures co-running? (issue 16, item 2)

`rlhfsim validate`'s intra-step scenarios run `generate()` (batch 4, 32 new tokens per call, the
validation scenarios' `small-qwen2`) in the main thread while a scorer thread prefills each row's new
32-token chunk on its cached prefix (`StaticKVDecoder`, value head, batch 1). The calibrator's
`interference` points measure two loops that are busy all the time. Three conditions, each in a fresh
process, rounds alternating:

    alone        generate() calls only; then, separately, the scorer's chunk calls only
    handoff      after each generate() call the main thread queues its 4 rows' chunks; the scorer thread
                 scores them while the next call runs (what the executor does)
    continuous   the scorer thread scores chunks back to back during every generate() call

Reported: the median generate() call and the median chunk call per condition, as ratios to alone.

    python lab/diagnostics/corun_pattern.py [--rounds 4] [--json]
"""

from __future__ import annotations

import json
import os
import statistics

from _common import alternating_main

CONDITIONS = ("alone", "handoff", "continuous")
CALLS = 8


def child(cond: str) -> None:
    import queue
    import threading
    import time

    import torch

    from calibrate.measuring.decoder import StaticKVDecoder
    from calibrate.genruntimes.hf_generate import HfGenerate
    from calibrate.measuring.models import build_hf_model
    from rlhfsim.models.catalog import CATALOG

    shape = CATALOG["small-qwen2"]
    actor = build_hf_model(shape, "lm", "float32", "cpu")
    rt = HfGenerate()
    rt.load(actor, shape, max_batch=4, max_len=48 + 32 * (CALLS + 2))
    ids = torch.randint(1, shape.vocab, (4, 48))
    mask = torch.ones_like(ids)
    rm = StaticKVDecoder(shape, dtype=torch.float32, device="cpu", max_slots=4, max_len=48 + 32 * (CALLS + 4),
                         head="value", seed=0)
    chunk = torch.randint(1, shape.vocab, (1, 32))
    prompt = torch.randint(1, shape.vocab, (1, 48))
    score_times: list[float] = []
    q: queue.Queue = queue.Queue()
    stop = threading.Event()

    def score_one(slot: int) -> None:
        s = torch.tensor([slot])
        if int(rm.positions[slot]) + 32 > rm.max_len - 1:
            rm.reset(s)
        if int(rm.positions[slot]) == 0:
            rm.extend(s, prompt)
        t = time.perf_counter()
        rm.extend(s, chunk)
        score_times.append(time.perf_counter() - t)

    def scorer() -> None:
        with torch.inference_mode():
            while True:
                if cond == "continuous":
                    if stop.is_set():
                        return
                    score_one(len(score_times) % 4)
                    continue
                item = q.get()
                if item is None:
                    return
                score_one(item)

    def generate() -> float:
        t = time.perf_counter()
        rt.generate(ids, mask, 32).sequences[:, -32:].tolist()
        return time.perf_counter() - t

    with torch.inference_mode():
        for _ in range(2):
            generate()
            score_one(0)
        rm.reset(torch.arange(4))
        score_times.clear()
        gen_times = []
        if cond == "alone":
            gen_times = [generate() for _ in range(CALLS)]
            for i in range(CALLS * 4):
                score_one(i % 4)
        else:
            th = threading.Thread(target=scorer, daemon=True)
            th.start()
            for _ in range(CALLS):
                gen_times.append(generate())
                if cond == "handoff":
                    for r in range(4):
                        q.put(r)
            if cond == "handoff":
                q.put(None)
            stop.set()
            th.join()
    print(json.dumps({"cond": cond, "generate_s": statistics.median(gen_times),
                      "chunk_s": statistics.median(score_times), "chunks": len(score_times)}))


def main() -> None:
    ran = alternating_main(__file__, __doc__, CONDITIONS, 4, child,
                           lambda c, r: f"{c} generate {r['generate_s'] * 1e3:.0f} ms, chunk {r['chunk_s'] * 1e3:.1f} ms")
    if ran is None:
        return
    args, res = ran
    med = {c: {k: statistics.median(x[k] for x in v) for k in ("generate_s", "chunk_s")} for c, v in res.items()}
    summary = {"rounds": args.rounds, "median": med,
               "ratio_to_alone": {c: {k: med[c][k] / med["alone"][k] for k in ("generate_s", "chunk_s")}
                                  for c in CONDITIONS if c != "alone"},
               "load_avg_1m": os.getloadavg()[0]}
    if args.json:
        print(json.dumps(summary, indent=1))
        return
    for c in CONDITIONS:
        ratio = summary["ratio_to_alone"].get(c)
        extra = "" if ratio is None else f"  (x{ratio['generate_s']:.2f} and x{ratio['chunk_s']:.2f} of alone)"
        print(f"{c:10s} generate() {med[c]['generate_s'] * 1e3:.1f} ms, chunk call {med[c]['chunk_s'] * 1e3:.2f} ms{extra}")
    print(f"load average (1 min) at the end: {summary['load_avg_1m']:.2f}")


if __name__ == "__main__":
    main()
