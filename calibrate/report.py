"""Reports of a profile: the scoring-runtime comparison (per model, batch and length: median, p95,
speedup over eager, max abs difference; like the tables of the runtime study), batching strategies,
chunked scoring, and the fitted parameters with held-out error. Plain text, no dependencies.

``runtime_json`` picks a reference shape: the padded (model, batch, length) point measured by the most
valid runtimes, ties broken by more tokens; runtimes not measured there report nulls.

Generation runtimes (``profile["generation"]``, ``calibrate.genbench``): ``generation_table`` has one row
per runtime and measured decode shape (model, batch, mean context: ms per decode step, tokens/s =
batch / step time, the call overhead, the chunk handoff at that batch, validity and reason); a runtime
without measured steps gets one row with its reason. ``generation_json`` reports each runtime at a
reference decode shape chosen like the scoring one: the (model, batch, context) measured by the most
valid runtimes, ties broken by more cached tokens.
"""

from __future__ import annotations

import numpy as np


def _fmt_table(header: list[str], rows: list[list[str]]) -> str:
    """A rich table (as the rest of the CLI prints), rendered to text: first column left, the rest right."""
    import io

    from rich.console import Console
    from rich.table import Table

    table = Table()
    for i, h in enumerate(header):
        table.add_column(h, justify="left" if i == 0 else "right", no_wrap=True)
    for r in rows:
        table.add_row(*r)
    buf = io.StringIO()
    Console(file=buf, width=200, color_system=None).print(table)
    return buf.getvalue().rstrip("\n")


def _padded_points(profile: dict) -> list[dict]:
    return [p for p in profile["points"] if p["op"] == "score" and p.get("strategy") == "padded"
            and not p.get("varlen") and "skipped" not in p]


def runtime_rows(profile: dict) -> list[dict]:
    """One row per (model, batch, length, runtime) with the eager median of the same shape."""
    pts = _padded_points(profile)
    eager = {(p["model"], p["batch"], p["seq_len"]): p["median_s"] for p in pts if p["runtime"] == "eager"}
    rows = []
    for p in sorted(pts, key=lambda p: (p["model"], p["batch"], p["seq_len"], p["runtime"] != "eager", p["runtime"])):
        e = eager.get((p["model"], p["batch"], p["seq_len"]))
        rows.append({"model": p["model"], "batch": p["batch"], "seq_len": p["seq_len"], "runtime": p["runtime"],
                     "median_ms": p["median_s"] * 1e3, "p95_ms": float(np.percentile(p["samples_s"], 95)) * 1e3,
                     "speedup_vs_eager": e / p["median_s"] if e else None, "max_abs_diff": p["max_abs_diff"],
                     "valid": p["valid"] and profile["runtimes"].get(p["runtime"], {}).get("valid", False),
                     "first_call_ms": p["first_call_s"] * 1e3, "setup_s": p["setup_s"]})
    return rows


def runtime_table(profile: dict) -> str:
    rows = runtime_rows(profile)
    shown = {r["runtime"] for r in rows}
    t = _fmt_table(["model", "batch", "len", "runtime", "median ms", "p95 ms", "vs eager", "max|diff|", "valid"],
                   [[r["model"], str(r["batch"]), str(r["seq_len"]), r["runtime"], f"{r['median_ms']:.3f}",
                     f"{r['p95_ms']:.3f}", "-" if r["speedup_vs_eager"] is None else f"{r['speedup_vs_eager']:.2f}x",
                     f"{r['max_abs_diff']:.1e}", "yes" if r["valid"] else "NO"] for r in rows])
    notes = [f"{name}: not measured ({info['reason']})" for name, info in sorted(profile["runtimes"].items())
             if name not in shown]
    notes += [f"{name}: invalid ({info['reason']})" for name, info in sorted(profile["runtimes"].items())
              if name in shown and not info["valid"]]
    setup = [f"{name} on {m}: setup {mi['setup_s']:.1f} s, first call {mi['first_point']['first_call_s'] * 1e3:.0f} ms "
             f"(steady {mi['first_point']['median_s'] * 1e3:.2f} ms)"
             for name, info in sorted(profile["runtimes"].items()) for m, mi in sorted(info["models"].items())
             if "first_point" in mi and name != "eager"]
    return "\n".join([t] + (["", "setup and first calls:"] + ["  " + x for x in setup] if setup else [])
                     + (["", "runtimes:"] + ["  " + n for n in notes] if notes else []))


def reference_shape(profile: dict) -> tuple | None:
    pts = _padded_points(profile)
    valid = {n for n, i in profile["runtimes"].items() if i["valid"]}
    count: dict[tuple, int] = {}
    for p in pts:
        if p["runtime"] in valid:
            k = (p["model"], p["batch"], p["seq_len"])
            count[k] = count.get(k, 0) + 1
    if not count:
        return None
    return max(count, key=lambda k: (count[k], k[1] * k[2], k[0]))


def runtime_json(profile: dict) -> dict:
    ref = reference_shape(profile)
    rows = {r["runtime"]: r for r in runtime_rows(profile) if ref and (r["model"], r["batch"], r["seq_len"]) == ref}
    out = {}
    for name, info in sorted(profile["runtimes"].items()):
        r = rows.get(name)
        out[name] = {"median_ms": r["median_ms"] if r else None, "p95_ms": r["p95_ms"] if r else None,
                     "speedup_vs_eager": r["speedup_vs_eager"] if r else None,
                     "max_abs_diff": r["max_abs_diff"] if r else info.get("max_abs_diff"),
                     "valid": bool(info["valid"]), "reason": info["reason"], "op": info.get("op")}
    reference = {"model": ref[0], "batch": ref[1], "seq_len": ref[2]} if ref else None
    gen_ref, gen = generation_json(profile)
    return {"profile": profile["name"], "reference": reference, "runtimes": out, "generation_reference": gen_ref,
            "generation": gen}


def batching_table(profile: dict) -> str:
    rows = []
    for r in profile.get("batching", []):
        st = r["strategies"]
        base = st.get("padded", {}).get("median_s")
        cells = [f"{st[k]['median_s'] * 1e3:.2f} ({st[k]['padded_tokens']})" if k in st else "-"
                 for k in ("padded", "bucketed", "packed")]
        speed = f"{base / st[r['best']]['median_s']:.2f}x" if base else "-"
        rows.append([r["model"], str(r["batch"]), str(r["max_len"]), str(r["tokens"]), *cells, r["best"], speed])
    return _fmt_table(["model", "batch", "max len", "tokens", "padded ms (tok)", "bucketed ms (tok)",
                       "packed ms (tok)", "best", "vs padded"], rows)


def chunk_table(profile: dict) -> str:
    rows = [[r["model"], str(r["batch"]), str(r["prefix_len"]), str(r["chunk"]), f"{r['chunk_median_s'] * 1e3:.2f}",
             "-" if r["oneshot_median_s"] is None else f"{r['oneshot_median_s'] * 1e3:.2f}",
             f"{r['max_abs_diff_vs_oneshot']:.1e}"] for r in profile.get("chunked_scoring", [])]
    return _fmt_table(["model", "batch", "prefix", "chunk", "chunk ms", "one-shot ms (prefix+chunk)", "max|diff|"], rows)


def fit_table(profile: dict) -> str:
    def pct(v):
        return "-" if v is None else f"{100 * v:.1f}%"

    rows = [[op, f"{p['compute_eff']:.3g}", f"{p['memory_eff']:.3g}", f"{p['overhead_s'] * 1e6:.1f}",
             f"{p['overhead_per_layer_s'] * 1e6:.2f}", str(p.get("n_points", 0)), pct(p.get("fit_mape")),
             pct(p.get("heldout_mape")), pct(p.get("heldout_mape_by_model")), p.get("source", "")]
            for op, p in profile["operations"].items()]
    return _fmt_table(["operation", "compute_eff", "memory_eff", "overhead us", "per-layer us", "points", "fit MAPE",
                       "held-out MAPE", "leave-model-out", "source"], rows)


def interference_line(profile: dict) -> str:
    i = profile["interference"]
    return (f"interference ({i['source']}): decode slowdown {i['decode_slowdown']:.2f}x, "
            f"prefill slowdown {i['prefill_slowdown']:.2f}x")


# -- generation runtimes ----------------------------------------------------------------------------------
def _ms(v: float | None, scale: float = 1e3, fmt: str = "{:.3f}") -> str:
    return "-" if v is None else fmt.format(v * scale)


def _handoff_at(info: dict, batch: int) -> float | None:
    if info.get("handoff_s") is None:
        return None
    return info["handoff_s"] + (info.get("handoff_per_row_s") or 0.0) * batch


def generation_rows(profile: dict) -> list[dict]:
    rows = []
    for rt, info in profile.get("generation", {}).items():
        steps = sorted(info.get("ms_per_step", []), key=lambda r: (r["model"], r["batch"], r["context"]))
        for r in steps or [None]:
            b = r["batch"] if r else None
            rows.append({"runtime": rt, "model": r["model"] if r else None, "batch": b,
                         "context": r["context"] if r else None, "ms_per_step": r["ms"] if r else None,
                         "tokens_per_s": b / r["ms"] * 1e3 if r and r["ms"] > 0 else None,
                         "call_overhead_s": info.get("call_overhead_s"),
                         "handoff_s": _handoff_at(info, b) if b is not None else info.get("handoff_s"),
                         "valid": bool(info["valid"]), "reason": info.get("reason", "")})
    return rows


def generation_table(profile: dict) -> str:
    if not profile.get("generation"):
        return "no generation runtimes measured"
    rows = [[r["runtime"], r["model"] or "-", "-" if r["batch"] is None else str(r["batch"]),
             "-" if r["context"] is None else f"{r['context']:g}", _ms(r["ms_per_step"], 1.0),
             "-" if r["tokens_per_s"] is None else f"{r['tokens_per_s']:.0f}", _ms(r["call_overhead_s"]),
             _ms(r["handoff_s"]), "yes" if r["valid"] else "NO", r["reason"] or ""] for r in generation_rows(profile)]
    return _fmt_table(["runtime", "model", "batch", "context", "ms/step", "tokens/s", "call overhead ms",
                       "handoff ms", "valid", "reason"], rows)


def generation_reference(profile: dict) -> tuple | None:
    count: dict[tuple, int] = {}
    for info in profile.get("generation", {}).values():
        if info["valid"]:
            for r in info.get("ms_per_step", []):
                k = (r["model"], r["batch"], r["context"])
                count[k] = count.get(k, 0) + 1
    if not count:
        return None
    return max(count, key=lambda k: (count[k], k[1] * k[2], k[0]))


def generation_json(profile: dict) -> tuple[dict | None, dict]:
    """(reference shape, {runtime: summary at it}) (see the module docstring)."""
    ref = generation_reference(profile)
    out = {}
    for rt, info in profile.get("generation", {}).items():
        at = next((r for r in info.get("ms_per_step", []) if ref and (r["model"], r["batch"], r["context"]) == ref), None)
        ms = at["ms"] if at else None
        out[rt] = {"valid": bool(info["valid"]), "available": bool(info.get("available", True)),
                   "reason": info.get("reason", ""), "semantics": info.get("semantics"),
                   "ms_per_step": ms, "tokens_per_s": ref[1] / ms * 1e3 if ms else None,
                   "call_overhead_s": info.get("call_overhead_s"), "handoff_s": info.get("handoff_s"),
                   "handoff_per_row_s": info.get("handoff_per_row_s"),
                   "tokens_match_eager": info.get("tokens_match_eager"), "source": info.get("source"),
                   "ops": info.get("ops", [])}
    reference = {"model": ref[0], "batch": ref[1], "context": ref[2]} if ref else None
    return reference, out
