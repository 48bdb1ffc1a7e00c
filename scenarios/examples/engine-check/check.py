"""Published vLLM decode steps on H100 (points.yaml) beside CostModel's decoder under the bundled h100-sxm profile.

Each point is priced as one decode step of ``batch`` sequences at the mean cached context isl + osl / 2 (the batch's
sum of contexts while staggered requests decode), with ``CostModel.decoder(model, bfloat16, tp, runtime).price``: the
weights' and the KV cache's bytes over the profile's kernel terms by shape, the all-reduces, the engine's host work per
step. Printed: published TPOT, predicted step, the error and the step's terms; then the median |error|; then, for
the points of one source, model and batch at several cache lengths, the growth of the step from the shortest cache to
each longer one, published and predicted: the same weights and host work at every length, so the growth is the
attention's reading of the cache alone. Nothing is fitted to the published numbers: they are the check.

    PYTHONPATH=$PWD python scenarios/examples/engine-check/check.py [--profile h100-sxm] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import yaml

from rlhfsim.costs.model import CostModel
from rlhfsim.hardware.catalog import get_gpu
from rlhfsim.models.catalog import CATALOG

HERE = Path(__file__).resolve().parent


def load_points() -> list[dict]:
    return yaml.safe_load((HERE / "points.yaml").read_text())["points"]


def price(cost: CostModel, p: dict) -> tuple[float, dict[str, float]]:
    """One decode step of point ``p``: (seconds, seconds by cost term)."""
    dec = cost.decoder(CATALOG[p["model"]], "bfloat16", int(p["tp"]), p["runtime"])
    b = int(p["batch"])
    pr = dec.price(b, b * (p["isl"] + p["osl"] / 2), 1)
    return pr.total_s, {str(k): v for k, v in pr.terms().items() if v}


def rows(profile: str) -> list[dict]:
    costs: dict[str, CostModel] = {}
    out = []
    for p in load_points():
        gpu = p.get("gpu", "h100-sxm")   # the profile's efficiencies carried to another GPU as with_stack_rate does
        cost = costs.get(gpu) or costs.setdefault(gpu, CostModel.load(get_gpu(gpu), profile))
        s, terms = price(cost, p)
        pub = p["tpot_ms"]
        out.append({"id": p["id"], "group": (p["source"], p["model"], p.get("gpu", "h100-sxm"), p["tp"], p["batch"]),
                    "osl": p["osl"], "isl": p["isl"], "published_ms": pub, "predicted_ms": round(s * 1e3, 3),
                    "error_pct": round(100 * (s * 1e3 - pub) / pub, 1),
                    "terms_ms": {k: round(v * 1e3, 3) for k, v in terms.items()}})
    return out


def growth(rs: list[dict]) -> list[dict]:
    """Per group of points that differ only in the cached context (one source, model, GPU, TP, batch and output
    length): each longer cache's step less the shortest cache's, published and predicted (ms)."""
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
            pub, pred = r["published_ms"] - base["published_ms"], r["predicted_ms"] - base["predicted_ms"]
            out.append({"id": r["id"], "from_isl": base["isl"], "published_ms": round(pub, 3), "predicted_ms": round(pred, 3),
                        "ratio": round(pred / pub, 2) if pub > 0 else None})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="h100-sxm", help="the profile to price with (default: h100-sxm)")
    ap.add_argument("--json", action="store_true", help="the rows as JSON")
    a = ap.parse_args()
    rs = rows(a.profile)
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
