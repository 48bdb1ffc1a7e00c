"""Published vLLM decode steps on H100 (points.yaml) beside CostModel's decoder under the bundled h100-sxm profile.

Each point is priced as one decode step of ``batch`` sequences at the mean cached context isl + osl / 2 (the batch's
sum of contexts while staggered requests decode), with ``CostModel.decoder(model, bfloat16, tp, runtime).price``: the
weights' and the KV cache's bytes over the profile's kernel terms by shape, the all-reduces, the engine's host work per
step. Printed: published TPOT, predicted step, the error and the step's terms; then the median |error|; then, for
the points of one source, model and batch at several cache lengths, the growth of the step from the shortest cache to
each longer one, published and predicted (the device's part of the step): the same weights and host work at every
length, so the growth is the attention's reading of the cache alone. Nothing is fitted to the published numbers: they are the check.

    PYTHONPATH=$PWD python scenarios/examples/engine-check/check.py [--profile h100-sxm] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import yaml

from rlhfsim.costs.model import CostModel, with_stack_rate
from rlhfsim.costs.profile import load_profile
from rlhfsim.costs.terms import ENGINE_HOST, ENGINE_STEP, HOST_LAUNCH_BOUND, SAMPLING_TAIL
from rlhfsim.errors import RlhfsimError
from rlhfsim.hardware.catalog import get_gpu
from rlhfsim.models.catalog import CATALOG

HERE = Path(__file__).resolve().parent


def load_points() -> list[dict]:
    return yaml.safe_load((HERE / "points.yaml").read_text())["points"]


HOST_TERMS = (ENGINE_HOST, ENGINE_STEP, SAMPLING_TAIL, HOST_LAUNCH_BOUND)   # the host's share of a decode step


def price(cost: CostModel, p: dict) -> tuple[float, float, dict[str, float]]:
    """One decode step of point ``p``: (seconds, the device's seconds of them: the step less its host terms, seconds
    by cost term)."""
    dec = cost.decoder(CATALOG[p["model"]], "bfloat16", int(p["tp"]), p["runtime"])
    b = int(p["batch"])
    pr = dec.price(b, b * (p["isl"] + p["osl"] / 2), 1)
    terms = {str(k): v for k, v in pr.terms().items() if v}
    return pr.total_s, sum(v for k, v in terms.items() if k not in HOST_TERMS), terms


def cost_model(profile: str, gpu: str, async_scheduling: bool) -> CostModel:
    """``profile`` on ``gpu`` (its efficiencies carried as ``with_stack_rate`` does); ``async_scheduling``: the vllm
    runtime's host work per step overlapped with the forward (step_host_overlap 1), as vLLM's async scheduling runs it
    (its default after 0.12, vllm PR #27614; the profile's step_host_basis: "with async scheduling ... nearly all of
    it"), where the profile's vllm runtime serialises it (verl's synchronous engine)."""
    doc = load_profile(profile)
    if async_scheduling:
        gen = dict(doc.get("generation") or {})
        gen["vllm"] = {**gen.get("vllm", {}), "step_host_overlap": 1.0}
        doc = {**doc, "generation": gen}
    return CostModel(get_gpu(gpu), with_stack_rate(doc, get_gpu(gpu)))


def rows(profile: str) -> list[dict]:
    costs: dict[tuple, CostModel] = {}
    out = []
    for p in load_points():
        key = (p.get("gpu", "h100-sxm"), bool(p.get("async_scheduling", False)))
        cost = costs.get(key) or costs.setdefault(key, cost_model(profile, *key))
        s, device, terms = price(cost, p)
        pub = p["tpot_ms"]
        out.append({"id": p["id"], "group": (p["source"], p["model"], p.get("gpu", "h100-sxm"), p["tp"], p["batch"]),
                    "osl": p["osl"], "isl": p["isl"], "published_ms": pub, "predicted_ms": round(s * 1e3, 3),
                    "device_ms": round(device * 1e3, 3),
                    "error_pct": round(100 * (s * 1e3 - pub) / pub, 1),
                    "terms_ms": {k: round(v * 1e3, 3) for k, v in terms.items()}})
    return out


def growth(rs: list[dict]) -> list[dict]:
    """Per group of points that differ only in the cached context (one source, model, GPU, TP, batch and output
    length): each longer cache's step less the shortest cache's, published and predicted (ms); predicted from the
    device's part of the step (less ``HOST_TERMS``), so that host work setting a short cache's step (overlapped host
    work longer than the device's) does not hide the cache's read."""
    groups: dict[tuple, list[dict]] = {}
    for r in rs:
        groups.setdefault((*r["group"], r["osl"]), []).append(r)
    out = []
    for g in groups.values():
        if len(g) < 2:
            continue
        g = sorted(g, key=lambda r: r["isl"])
        base = g[0]
        for r in g[1:]:
            # the device's growth: the host work, where it sets a short cache's step, does not hide the cache's read
            pub, pred = r["published_ms"] - base["published_ms"], r["device_ms"] - base["device_ms"]
            out.append({"id": r["id"], "from_isl": base["isl"], "published_ms": round(pub, 3), "predicted_ms": round(pred, 3),
                        "ratio": round(pred / pub, 2) if pub > 0 else None})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="h100-sxm", help="the profile to price with (default: h100-sxm)")
    ap.add_argument("--json", action="store_true", help="the rows as JSON")
    a = ap.parse_args()
    try:
        rs = rows(a.profile)
    except RlhfsimError as e:   # a profile that does not load: one line, exit 2
        print(f"check.py --profile: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    gs = growth(rs)
    if a.json:
        print(json.dumps({"points": [{k: v for k, v in r.items() if k != "group"} for r in rs], "growth": gs}, indent=1))
        return
    print(f"{'point':38s} {'published':>9s} {'predicted':>9s} {'error':>7s}  terms (ms)")
    for r in rs:
        terms = ", ".join(f"{k} {v:.2f}" for k, v in r["terms_ms"].items())
        print(f"{r['id']:38s} {r['published_ms']:9.2f} {r['predicted_ms']:9.2f} {r['error_pct']:+6.1f}%  {terms}")
    srcs = sorted({r["id"].split("-")[0] + "-" + r["id"].split("-")[1] for r in rs})
    for src in srcs:
        e = [r["error_pct"] for r in rs if r["id"].startswith(src + "-")]
        print(f"  {src}: median error {statistics.median(e):+.1f}%, median |error| "
              f"{statistics.median(abs(x) for x in e):.1f}% over {len(e)} points")
    print(f"median |error| {statistics.median(abs(r['error_pct']) for r in rs):.1f}% over {len(rs)} points "
          f"(profile {a.profile})")
    print("\ngrowth of the step with the cache (the attention's reading of it): published, predicted (ms), ratio")
    for r in gs:
        ratio = "-" if r["ratio"] is None else f"{r['ratio']:.2f}"
        print(f"{r['id']:38s} from isl {r['from_isl']:<5d} {r['published_ms']:7.3f} {r['predicted_ms']:7.3f}  {ratio}")


if __name__ == "__main__":
    main()
