"""Reports of a profile: the scoring-runtime comparison (per model, batch and length: median, p95,
speedup over eager with 95% intervals and a Welch verdict (``calibrate.fitting.stats``), throughput, peak memory,
max abs difference; like the tables of the runtime study), batching strategies against scoring one
sequence at a time, chunked scoring, and the fitted parameters with held-out error. Plain text.

``runtime_json`` picks a reference shape: the padded (model, batch, length) point measured by the most
valid runtimes, ties broken by more tokens; runtimes not measured there report nulls.

Generation runtimes (``profile["generation"]``, ``calibrate.measuring.genbench``): ``generation_table`` has one row
per runtime and measured decode shape (model, batch, mean context: ms per decode step, tokens/s =
batch / step time, the call overhead, the chunk handoff and what left padding adds to a decode step at
that batch, validity and reason); a runtime without measured steps gets one row with its reason. ``generation_json`` reports each runtime at a
reference decode shape chosen like the scoring one: the (model, batch, context) measured by the most
valid runtimes, ties broken by more cached tokens.
"""

from __future__ import annotations

from calibrate.fitting import stats


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
    """One row per (model, batch, length, runtime): percentiles, the median's 95% interval, the speedup
    over eager at the same shape with its interval, Welch's verdict (``calibrate.fitting.stats``), throughput and
    peak memory."""
    pts = _padded_points(profile)
    eager = {(p["model"], p["batch"], p["seq_len"]): p for p in pts if p["runtime"] == "eager"}
    rows = []
    for p in sorted(pts, key=lambda p: (p["model"], p["batch"], p["seq_len"], p["runtime"] != "eager", p["runtime"])):
        e = eager.get((p["model"], p["batch"], p["seq_len"]))
        d = stats.describe(p["samples_s"], p.get("rounds_of"))
        row = {"model": p["model"], "batch": p["batch"], "seq_len": p["seq_len"], "runtime": p["runtime"],
               "median_ms": p["median_s"] * 1e3, "ci95_ms": _scaled(d["ci95"], 1e3),
               "p50_ms": d["p50"] * 1e3, "p95_ms": d["p95"] * 1e3, "p99_ms": d["p99"] * 1e3,
               "n_samples": d["n"], "n_rounds": d["n_rounds"], "interleaved": d["interleaved"],
               "launches": p.get("launches", 1),
               "speedup_vs_eager": None, "speedup_ci95": None, "verdict": None, "welch_p": None,
               "sequences_per_s": p["batch"] / p["median_s"], "tokens_per_s": p["batch"] * p["seq_len"] / p["median_s"],
               "peak_mem_mb": p.get("peak_mem_mb"), "peak_mem_extra_mb": p.get("peak_mem_extra_mb"),
               "max_abs_diff": p["max_abs_diff"],
               "valid": p["valid"] and profile["runtimes"].get(p["runtime"], {}).get("valid", False),
               "first_call_ms": p["first_call_s"] * 1e3, "setup_s": p["setup_s"],
               "contended": p.get("contended"), "contention_ratio": p.get("contention_ratio")}
        if e is not None:
            c = stats.compare(e["samples_s"], e.get("rounds_of"), p["samples_s"], p.get("rounds_of"))
            row.update(speedup_vs_eager=c["speedup"], speedup_ci95=c["speedup_ci95"], verdict=c["verdict"],
                       welch_p=None if c["welch"] is None else c["welch"]["p"])
            if p["runtime"] == "eager":   # the baseline against itself
                row.update(speedup_vs_eager=1.0, speedup_ci95=(1.0, 1.0), verdict="tie", welch_p=1.0)
        rows.append(row)
    return rows


def _scaled(pair, k: float):
    return None if pair is None else [pair[0] * k, pair[1] * k]


def _ci(v, pair, fmt: str) -> str:
    if v is None:
        return "-"
    return fmt.format(v) + ("" if pair is None else " [" + fmt.format(pair[0]) + "-" + fmt.format(pair[1]) + "]")


def runtime_cells(r: dict) -> list[str]:
    return [r["model"], str(r["batch"]), str(r["seq_len"]), r["runtime"], _ci(r["median_ms"], r["ci95_ms"], "{:.2f}"),
            f"{r['p95_ms']:.2f}", _ci(r["speedup_vs_eager"], r["speedup_ci95"], "{:.2f}"), r["verdict"] or "-",
            f"{r['sequences_per_s']:.1f}", f"{r['tokens_per_s']:.0f}",
            "-" if r["peak_mem_mb"] is None else f"{r['peak_mem_mb']:.0f}", f"{r['max_abs_diff']:.1e}",
            str(r["n_rounds"]) + ("" if r["interleaved"] else "*"), "yes" if r["valid"] else "NO"]


RUNTIME_HEADER = ["model", "batch", "len", "runtime", "median ms [95% CI]", "p95 ms", "vs eager [95% CI]",
                  "verdict", "seq/s", "tok/s", "peak MiB", "max|diff|", "rounds", "valid"]


def runtime_table(profile: dict) -> str:
    rows = runtime_rows(profile)
    shown = {r["runtime"] for r in rows}
    t = _fmt_table(RUNTIME_HEADER, [runtime_cells(r) for r in rows])
    notes = [f"{name}: not measured ({info['reason']})" for name, info in sorted(profile["runtimes"].items())
             if name not in shown]
    notes += [f"{name}: invalid ({info['reason']})" for name, info in sorted(profile["runtimes"].items())
              if name in shown and not info["valid"]]
    if any(not r["interleaved"] for r in rows):
        notes.append("* not interleaved (a profile measured before interleaving): each sample counts as a round")
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
    rows = runtime_rows(profile)
    at = {r["runtime"]: r for r in rows if ref and (r["model"], r["batch"], r["seq_len"]) == ref}
    keys = ("median_ms", "ci95_ms", "p50_ms", "p95_ms", "p99_ms", "speedup_vs_eager", "speedup_ci95", "verdict",
            "welch_p", "sequences_per_s", "tokens_per_s", "peak_mem_mb", "peak_mem_extra_mb", "n_samples",
            "n_rounds", "interleaved", "launches", "contended")
    out = {}
    for name, info in sorted(profile["runtimes"].items()):
        r = at.get(name)
        out[name] = {**{k: (r[k] if r else None) for k in keys},
                     "max_abs_diff": r["max_abs_diff"] if r else info.get("max_abs_diff"),
                     "valid": bool(info["valid"]), "reason": info["reason"], "op": info.get("op")}
    reference = {"model": ref[0], "batch": ref[1], "seq_len": ref[2]} if ref else None
    gen_ref, gen = generation_json(profile)
    return {"profile": profile["name"], "quality": profile.get("quality"), "reference": reference,
            "statistics": "median and p95/p99 of all samples; 95% CIs by scipy.stats.bootstrap over rounds; "
                          "verdict from Welch's t-test on per-round means at alpha 0.05 (calibrate.fitting.stats)",
            "runtimes": out, "shapes": [_json_row(r) for r in rows], "batching": batching_rows(profile),
            "generation_reference": gen_ref, "generation": gen}


def _json_row(r: dict) -> dict:
    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in r.items()}


def batching_rows(profile: dict) -> list[dict]:
    """Per (model, batch, max length) and strategy: ms with its 95% interval, sequences/s and (real)
    tokens/s, peak memory, and the speedup over scoring one sequence at a time (``batch1``) with its
    interval and verdict; over ``padded`` in profiles measured before batch1 existed (``baseline``)."""
    out = []
    for row in profile.get("batching", []):
        st = row["strategies"]
        base_name = "batch1" if "batch1" in st else "padded"
        base = st.get(base_name)
        for name, v in st.items():
            samples = v.get("samples_s")
            d = stats.describe(samples, v.get("rounds_of")) if samples else None
            r = {"model": row["model"], "batch": row["batch"], "max_len": row["max_len"], "tokens": row["tokens"],
                 "strategy": name, "baseline": base_name, "median_ms": v["median_s"] * 1e3,
                 "ci95_ms": _scaled(d["ci95"], 1e3) if d else None,
                 "sequences_per_s": row["batch"] / v["median_s"], "tokens_per_s": row["tokens"] / v["median_s"],
                 "padded_tokens": v["padded_tokens"], "peak_mem_mb": v.get("peak_mem_mb"),
                 "speedup_vs_baseline": base["median_s"] / v["median_s"] if base else None,
                 "speedup_ci95": None, "verdict": None}
            if base and samples and base.get("samples_s") and name != base_name:
                c = stats.compare(base["samples_s"], base.get("rounds_of"), samples, v.get("rounds_of"))
                r.update(speedup_ci95=_scaled(c["speedup_ci95"], 1.0), verdict=c["verdict"])
            elif name == base_name:
                r.update(verdict="tie", speedup_ci95=[1.0, 1.0])
            out.append(r)
    return out


def batching_table(profile: dict) -> str:
    rows = [[r["model"], str(r["batch"]), str(r["max_len"]), str(r["tokens"]), r["strategy"],
             _ci(r["median_ms"], r["ci95_ms"], "{:.2f}"), str(r["padded_tokens"]), f"{r['sequences_per_s']:.1f}",
             f"{r['tokens_per_s']:.0f}", "-" if r["peak_mem_mb"] is None else f"{r['peak_mem_mb']:.0f}",
             _ci(r["speedup_vs_baseline"], r["speedup_ci95"], "{:.2f}") + f" vs {r['baseline']}", r["verdict"] or "-"]
            for r in batching_rows(profile)]
    return _fmt_table(["model", "batch", "max len", "tokens", "strategy", "ms [95% CI]", "computed tok", "seq/s",
                       "tok/s", "peak MiB", "speedup [95% CI]", "verdict"], rows)


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
    out = (f"interference ({i['source']}): decode slowdown {i['decode_slowdown']:.2f}x, "
           f"prefill slowdown {i['prefill_slowdown']:.2f}x")
    for rt, h in sorted((i.get("handover") or {}).items()):
        out += (f"; hand-over beside {rt}: generation {h['decode_slowdown']:.2f}x, "
                f"scorer call {h['prefill_slowdown']:.2f}x")
    return out


# -- generation runtimes ----------------------------------------------------------------------------------
def _ms(v: float | None, scale: float = 1e3, fmt: str = "{:.3f}") -> str:
    return "-" if v is None else fmt.format(v * scale)


def _handoff_at(info: dict, batch: int) -> float | None:
    if info.get("handoff_s") is None:
        return None
    return info["handoff_s"] + (info.get("handoff_per_row_s") or 0.0) * batch


def _pad_at(info: dict, batch: int) -> float | None:
    if info.get("pad_step_s") is None:
        return None
    return info["pad_step_s"] + (info.get("pad_step_per_row_s") or 0.0) * batch


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
                         "pad_step_s": _pad_at(info, b) if b is not None else info.get("pad_step_s"),
                         "valid": bool(info["valid"]), "reason": info.get("reason", "")})
    return rows


def generation_table(profile: dict) -> str:
    if not profile.get("generation"):
        return "no generation runtimes measured"
    rows = [[r["runtime"], r["model"] or "-", "-" if r["batch"] is None else str(r["batch"]),
             "-" if r["context"] is None else f"{r['context']:g}", _ms(r["ms_per_step"], 1.0),
             "-" if r["tokens_per_s"] is None else f"{r['tokens_per_s']:.0f}", _ms(r["call_overhead_s"]),
             _ms(r["handoff_s"]), _ms(r["pad_step_s"]), "yes" if r["valid"] else "NO", r["reason"] or ""]
            for r in generation_rows(profile)]
    return _fmt_table(["runtime", "model", "batch", "context", "ms/step", "tokens/s", "call overhead ms",
                       "handoff ms", "padded step +ms", "valid", "reason"], rows)


def sampling_table(profile: dict) -> str | None:
    """The measured sampling tails (``calibrate.measuring.sampling``), one row per runtime; None when none was measured."""
    rows = []
    for rt, info in profile.get("generation", {}).items():
        fit = info.get("sampling") or {}
        if "sample_per_logit_s" in info:
            for name, tail in ((rt, {**fit, **info}), (f"{rt} + log-probs", info.get("sampling_logprobs"))):
                if tail:   # the second: with the executor's log-prob recorder (generation.sampling_logprobs)
                    rows.append([name, _ms(tail.get("sample_s")), f"{tail['sample_per_logit_s'] * 1e9:.2f}",
                                 "-" if tail.get("heldout_mape") is None else f"{100 * tail['heldout_mape']:.1f}%",
                                 str(tail.get("n_points", "-")),
                                 ", ".join(f"{p['rows']}x{p['vocab']}" for p in tail.get("points", []))])
        elif fit.get("shared_with"):
            rows.append([rt, "-", "-", "-", "-", f"shares {fit['shared_with']}'s (the same generate() loop)"])
    if not rows:
        return None
    return _fmt_table(["runtime", "fixed ms", "ns per logit", "held-out MAPE", "points", "rows x vocab"], rows)


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
                   "pad_step_s": info.get("pad_step_s"), "pad_step_per_row_s": info.get("pad_step_per_row_s"),
                   "pad_prefill_s": info.get("pad_prefill_s"),
                   "tokens_match_eager": info.get("tokens_match_eager"), "source": info.get("source"),
                   "sample_s": info.get("sample_s"), "sample_per_logit_s": info.get("sample_per_logit_s"),
                   "ops": info.get("ops", [])}
    reference = {"model": ref[0], "batch": ref[1], "context": ref[2]} if ref else None
    return reference, out
