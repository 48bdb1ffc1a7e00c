"""When streaming pays: step time against chunk size under each reward streaming strategy
(``models.reward.streaming``), for an encoder reward model (DeBERTa-v3-large) and a decoder one of similar
size (Qwen2.5-0.5B), on ``scenarios/encoder-streaming.yaml`` with a bundled profile. Not a speed
benchmark: it regenerates the tables of docs/schedules.md ("Reward models of another family").

    python examples/encoder_streaming.py                       # default (H200) profile, markdown
    python examples/encoder_streaming.py --format json

Per reward model: ``sync`` (no streaming: score after generation), ``final_only`` and the streaming
strategy it can run (``reencode`` for the encoder, ``incremental`` for the decoder) at every chunk size.
The crossover is the largest chunk size at which ``reencode`` stops hiding scoring: below it, its step
time is above ``final_only``'s at the same chunk size (the re-encoding of growing prefixes costs more
than it hides).
"""

from __future__ import annotations

import argparse
import json

from rlhfsim.scenario.loader import load_scenario
from rlhfsim.sim.run import rebuild, simulate

CHUNKS = (4, 8, 16, 32, 64, 128, 256, 384)
MODELS = {"deberta-v3-large": ("final_only", "reencode"), "qwen2.5-0.5b": ("final_only", "incremental")}


def run(scenario: str, profile: str | None, steps: int) -> dict:
    sc = load_scenario(scenario)
    out = {"scenario": sc.name, "profile": profile or "bundled", "steps": steps, "models": {}}
    for model, strategies in MODELS.items():
        base = sc.model_dump(mode="json")
        reward = {**base["models"]["reward"], "model": model, "streaming": None}
        models = {**base["models"], "reward": reward}
        sync = simulate(rebuild(sc, {"models": models, "schedule": {"kind": "sync"}}), profile=profile, steps=steps)
        rows = {"sync": sync.summary["step_time_s"], "curves": {}}
        for st in strategies:
            curve = []
            for k in CHUNKS:
                sched = {**base["schedule"], "intra": {**base["schedule"]["intra"], "enabled": True, "chunk_tokens": k}}
                r = simulate(rebuild(sc, {"models": {**models, "reward": {**reward, "streaming": st}}, "schedule": sched}),
                             profile=profile, steps=steps)
                s = r.summary
                curve.append({"chunk_tokens": k, "step_time_s": s["step_time_s"],
                              "scored_tokens_per_step": sum(x.scored_tokens for x in r.steps[sc.warmup_steps:]) / max(len(r.steps) - sc.warmup_steps, 1),
                              "calls_per_step": s["schedule_stats"]["chunks_scored"] / max(s["steps"], 1)})
            rows["curves"][st] = curve
        out["models"][model] = rows
    enc = out["models"]["deberta-v3-large"]["curves"]
    worse = [a["chunk_tokens"] for a, b in zip(enc["reencode"], enc["final_only"]) if a["step_time_s"] > b["step_time_s"] * 1.001]
    out["crossover_chunk_tokens"] = max(worse) if worse else None
    sync = out["models"]["deberta-v3-large"]["sync"]
    over_sync = [a["chunk_tokens"] for a in enc["reencode"] if a["step_time_s"] > sync]
    out["reencode_slower_than_sync_at_or_below"] = max(over_sync) if over_sync else None
    return out


def markdown(doc: dict) -> str:
    lines = [f"`{doc['scenario']}`, profile {doc['profile']}, {doc['steps']} steps (first excluded); step time in s, "
             "in brackets the scorer's calls and the tokens it encodes per step."]
    for model, rows in doc["models"].items():
        sts = list(rows["curves"])
        lines += ["", f"**{model}** (sync, no streaming: {rows['sync']:.2f} s)", "",
                  "| chunk | " + " | ".join(sts) + " |", "|---:|" + "---:|" * len(sts)]
        for i, k in enumerate(CHUNKS):
            cells = [f"{rows['curves'][st][i]['step_time_s']:.2f} ({rows['curves'][st][i]['calls_per_step']:,.0f} calls, "
                     f"{rows['curves'][st][i]['scored_tokens_per_step']:,.0f} tok)" for st in sts]
            lines.append(f"| {k} | " + " | ".join(cells) + " |")
    c, cs = doc["crossover_chunk_tokens"], doc["reencode_slower_than_sync_at_or_below"]
    lines += ["", ("Crossover: with DeBERTa-v3-large, `reencode` costs more than it hides (slower than `final_only`) "
                   f"at chunks of {c} tokens and below" if c else "No crossover in this range: `reencode` is never slower than `final_only`")
              + (f"; at {cs} tokens and below it is slower than not streaming at all (sync)." if cs else "; it is never slower than sync.")]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("scenario", nargs="?", default="scenarios/encoder-streaming.yaml")
    ap.add_argument("--profile", default=None)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--format", choices=("markdown", "json"), default="markdown")
    a = ap.parse_args()
    doc = run(a.scenario, a.profile, a.steps)
    print(json.dumps(doc, indent=1) if a.format == "json" else markdown(doc))


if __name__ == "__main__":
    main()
