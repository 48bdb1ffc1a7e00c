"""The hardware side of rlhfsim: measure the costs the simulator predicts, on this machine, and write them
as a Profile (``rlhfsim/costs/profile.py``), the only thing that crosses over to ``rlhfsim/``.

Needs torch, transformers, onnxruntime, click and numpy only (no pydantic, simpy, scipy, plotly; rich is
optional), so it runs on bare GPU images: ``python -m calibrate calibrate --gpu h200 --quick --out X``.

Its modules, by role: ``measuring/`` (the points timed on this device: generation, scoring, training, interference,
a framework step's scalars, the sampling tail, the timing discipline, what was measured on), ``fitting/``
(measured points -> Profile: the roofline fits with held-out error, the measured terms, the quality verdict; GPU
kernel terms from published per-operation data), ``running/`` (one calibration: what is measured, the session, the
crash-safe journal, progress, extending a measured profile, reports); beside them ``cpu/`` (the CPU host-effect
probes), ``runtimes/`` and ``genruntimes/`` (scoring and generation runtimes), ``executor/`` and ``frameworks/``
(real steps), ``validation/`` (measured against predicted), ``enginehost/`` (an engine's host work per step).
At the root only the entry points: ``cli`` (click commands) and ``__main__`` (``python -m calibrate``).
"""

# Bumped whenever what a point times changes (a cached calibration measured under an older version is
# stale): 2 = prefill/decode include sampling (sample_next), StaticKVDecoder reads GQA caches in place;
# 3 = fits use each point's trimmed mean (tmean_s) instead of its median; 4 = a decode point is one
# iteration of the executor's decode loop (Generator._decode); 5 = generation runtimes (calibrate.measuring.genbench:
# prefill/decode/handoff points with a runtime field; the plain fits exclude them); 6 = co-running in the
# hand-over pattern per generation runtime (calibrate.cpu.corun: interference points of strategy handover);
# 7 = sampling tails (calibrate.measuring.sampling: sample points; generation prefill/decode fitted less the tail)
# and GEMM weight passes (calibrate.cpu.gemm: gemm points; decode work counts the weights that many times at >= 2 rows).
MEASUREMENT_VERSION = 7
