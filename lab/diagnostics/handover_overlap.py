"""What a waiting and a computing intra-step scorer cost the actor, per (actor, scorer) pair (issue 16, item 2).

Runs ``calibrate.cpu.corun``'s own hand-over rounds (``kv_decoder`` actor, one OpenMP thread in the scorer thread,
as the executor and the calibration run it on a CPU) for each pair and fits ``calibrate.cpu.corun.overlap_fit`` on
their stamps: ``idle_x`` (the actor's time per decode step, relative to alone, while the scorer waits),
``busy_x`` (while one of its calls runs) and the share of a call's time the actor loses,
``lost = 1 - idle_x / busy_x``; plus the scorer's busy share and its calls beside the actor against alone
(the calibration's ``prefill`` side). Pairs given as ``ACTOR:SCORER`` (catalog names or config.json paths);
the calibration measures each decoder beside itself, this says whether the scorer or the actor sets the loss.

    python lab/diagnostics/handover_overlap.py                                   # the default pairs
    python lab/diagnostics/handover_overlap.py tiny-qwen2:small-qwen2 --batch 4 --chunk 16 --json
"""

from __future__ import annotations

import argparse
import json
import statistics

DEFAULT_PAIRS = ("tiny-qwen2:tiny-qwen2", "tiny-qwen2:small-qwen2-l2", "tiny-qwen2:small-qwen2",
                 "small-qwen2-l2:tiny-qwen2", "small-qwen2-l2:small-qwen2-l2", "small-qwen2:small-qwen2",
                 "tiny-qwen2-l4:tiny-qwen2-l4")


def _shape(ref: str):
    from rlhfsim.models.catalog import CATALOG, load_model

    return CATALOG[ref] if ref in CATALOG else load_model(ref)


class _Session:
    """What ``calibrate.cpu.corun._Actor`` / ``_Scorer`` ask of a calibration session: random-weight models on
    the CPU."""

    device, dtype = "cpu", "float32"

    def decoder(self, shape, head: str, max_slots: int, max_len: int):
        import torch

        from calibrate.measuring.decoder import StaticKVDecoder

        return StaticKVDecoder(shape, dtype=torch.float32, device=torch.device("cpu"), max_slots=max_slots,
                               max_len=max_len, head=head, seed=0)


def measure(actor_ref: str, scorer_ref: str, batch: int, prompt: int, chunk: int, rounds: int) -> dict:
    from calibrate.cpu.corun import handover_rounds

    alone, beside, _, fit = handover_rounds(_Session(), "kv_decoder", _shape(actor_ref), _shape(scorer_ref),
                                            batch, prompt, chunk, rounds)
    call_alone, call_beside = statistics.median(alone["prefill"]), statistics.median(beside["prefill"])
    return {"actor": actor_ref, "scorer": scorer_ref, "batch": batch, "chunk": chunk, "fit": fit,
            "lost": None if fit is None else 1.0 - fit["idle_x"] / fit["busy_x"],
            "call_alone_ms": 1e3 * call_alone, "call_beside_ms": 1e3 * call_beside,
            "call_slowdown": call_beside / call_alone}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("pairs", nargs="*", default=list(DEFAULT_PAIRS), help="ACTOR:SCORER (catalog names or paths)")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--chunk", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    rows = []
    for pair in a.pairs:
        actor, _, scorer = pair.partition(":")
        if not actor or not scorer:
            raise SystemExit(f"pairs: expected ACTOR:SCORER, got {pair!r}")
        r = measure(actor, scorer, a.batch, a.prompt, a.chunk, a.rounds)
        rows.append(r)
        if not a.json:
            f = r["fit"]
            fit = ("no fit (overlap span too narrow)" if f is None else
                   f"idle_x {f['idle_x']:.2f} busy_x {f['busy_x']:.2f} lost {r['lost']:.2f} scorer busy {f['duty']:.2f} "
                   f"step alone {1e3 * f['alone_op_s']:.2f} ms")
            print(f"{actor} <- {scorer} (b{a.batch}, c{a.chunk}): {fit} | call {r['call_alone_ms']:.2f} ms alone, "
                  f"x{r['call_slowdown']:.2f} beside", flush=True)
    if a.json:
        import torch

        print(json.dumps({"torch": torch.__version__, "threads": torch.get_num_threads(), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
