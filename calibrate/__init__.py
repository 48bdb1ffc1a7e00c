"""The hardware side of rlhfsim: measure the costs the simulator predicts, on this machine, and write them
as a Profile (``rlhfsim/costs/profile.py``), the only thing that crosses over to ``rlhfsim/``.

Needs torch, transformers, onnxruntime, click and numpy only (no pydantic, simpy, scipy, plotly; rich is
optional), so it runs on bare GPU images: ``python -m calibrate calibrate --gpu h200 --quick --out X``.

Modules: ``run`` (one calibration, ``run_calibration``), ``grid`` (what is measured), ``session`` (the
measuring context), ``measure`` (timing discipline), ``journal`` (crash-safe JSONL of measured points),
``bench`` (generation, chunked scoring, training, interference), ``genbench`` and ``genruntimes``
(generation runtimes: HF generate, static-cache compiled generate, our decoder, vLLM, SGLang), ``scoring`` (runtimes and batching
strategies), ``runtimes`` (scoring runtimes), ``models`` (random-weight HF models from shapes), ``fit``
(roofline-with-efficiency fits with held-out error), ``sampling`` (the sampling tail of a generation
step per runtime), ``gemm`` (weight passes of a matrix product of two rows or more), ``assemble`` (points -> Profile), ``report`` (runtime
comparison tables), ``device_info``, ``progress``, ``cli`` (click commands).
"""

# Bumped whenever what a point times changes (a cached calibration measured under an older version is
# stale): 2 = prefill/decode include sampling (sample_next), StaticKVDecoder reads GQA caches in place;
# 3 = fits use each point's trimmed mean (tmean_s) instead of its median; 4 = a decode point is one
# iteration of the executor's decode loop (Generator._decode); 5 = generation runtimes (calibrate.genbench:
# prefill/decode/handoff points with a runtime field; the plain fits exclude them); 6 = co-running in the
# hand-over pattern per generation runtime (calibrate.cpu.corun: interference points of strategy handover);
# 7 = sampling tails (calibrate.sampling: sample points; generation prefill/decode fitted less the tail)
# and GEMM weight passes (calibrate.cpu.gemm: gemm points; decode work counts the weights that many times at >= 2 rows).
MEASUREMENT_VERSION = 7
