"""Generation runtimes: the engines people generate rollouts with, and what a Profile says about each.

This module is the one home of the names and the profile layout; it is pure Python (no torch, no
pydantic), so both sides import it: ``calibrate/`` measures the runtimes and writes the keys below,
``rlhfsim/`` reads them.

Runtimes (``GEN_RUNTIMES``) and the batching semantics each framework calls them with:

* ``hf_generate``: ``transformers`` ``generate()`` with its default dynamic cache, as TRL's trainers call
  it: a batch of left-padded prompts, sampling, a max-new-tokens cap, EOS stopping. Static batching: a
  batch ends when its longest row ends.
* ``hf_static``: ``generate()`` with ``cache_implementation="static"`` and ``torch.compile`` of the
  forward, as the transformers docs recommend for speed. Static batching.
* ``kv_decoder``: rlhfsim's own static-KV decoder (``calibrate.measuring.decoder.StaticKVDecoder``); static or
  continuous. Its costs are the profile's plain ``prefill``/``decode`` operations.
* ``vllm``, ``sglang``: continuous batching with paged KV caches; measured only where importable on a
  CUDA device, otherwise skipped with a reason (never faked).
* ``vllm_eager``: vLLM with ``enforce_eager=True`` (no CUDA graphs), verl's default until v0.5 (changed
  to False on 2025-08-08, verl #2956, released in v0.6.0): every decode step launches each layer's
  kernels from the host, so the step carries per-layer host time that graph replay removes.
* ``vllm_v0``, ``vllm_v0_eager``: the same with vLLM's V0 engine (``LLMEngine`` of vLLM <= 0.9: the scheduler,
  input preparation and output processing run serially with the model in one process; V0 is the only engine of
  vLLM <= 0.6, which verl 0.2 pins, and the fallback of vLLM 0.8-0.9 when ``VLLM_USE_V1=0`` or
  ``VLLM_ATTENTION_BACKEND=XFORMERS`` is set, which verl's examples of 2025 exported). ``vllm``/``vllm_eager`` are
  V1 (vLLM's default from 0.8.0). The kernels are the same: a profile without operations or scalars of its own for
  a V0 runtime prices them as its V1 twin's (``PRICED_AS``); its engine's host work per step is its own
  (``engine_host``: V0's and V1's host code differ).

Profile keys (schema_version 1, all optional, so older profiles still load):

* ``operations["prefill:RT"]``, ``operations["decode:RT"]``: the roofline-with-efficiency parameters
  (``rlhfsim.costs.model``) of one prefill call / one decode step of runtime RT, fitted exactly like
  ``prefill``/``decode``. Missing: the plain ``prefill``/``decode`` operations price the runtime (the
  simulator says so in its summary: ``generation_runtime.fallback``).
* ``generation[RT]``: what is not a roofline::

      {"valid": bool, "available": bool, "reason": str,      # skipped/invalid: why
       "semantics": "static"|"continuous",                   # how its framework batches
       "call_overhead_s": f,     # fixed host cost of one generate() call beyond its prefill and steps
       "handoff_s": f,           # cost to the actor of one chunk boundary mid-generation (the pause to
                                 # hand k new tokens per row downstream: a generate() call ending and the
                                 # next one starting on the cached prefix, the tokens copied to the host)
       "handoff_per_row_s": f,   # ... plus this much per row in the batch
       "pad_step_s": f,          # what left padding adds to one decode step of a static batch whose rows'
                                 # contexts differ (HF applies the padding mask at every step; a batch
                                 # without padding runs unmasked causal attention)
       "pad_step_per_row_s": f,  # ... plus this much per row in the batch
       "pad_prefill_s": f,       # what left padding adds to the prefill of such a batch (once per call)
       "tokens_match_eager": bool|null,                      # greedy tokens == eager's (correctness first)
       "source": "measured"|"derived", "n_points": int, ...}

Missing ``generation[RT]`` (or a key of it): zero call overhead, handoff and padding cost (stated in the summary).

The sampling tail (``calibrate.measuring.sampling``), optional keys of ``generation[RT]``: ``sample_s`` and
``sample_per_logit_s``, the measured cost of turning one step's logits into tokens (softmax, the draw,
log-probs, stopping checks) as ``sample_s + sample_per_logit_s x rows x vocab``. The calibration
subtracts it from RT's prefill and decode points before their roofline fit, so the simulator adds it
back once per decode step and once per prefill call (``sample_tail``). A runtime whose tail was not
measured shares another's (``SAMPLING_AS``) or, when its prefill/decode fall back to the plain
operations, ``kv_decoder``'s (the tail those were fitted without); none: no tail (profiles measured before
the tail existed keep their fitted overheads, which carry it at the shapes they measured).

The tail with the sampled tokens' log-probs (optional ``generation[RT].sampling_logprobs``, a dict with its
own ``sample_s`` and ``sample_per_logit_s``): the same measurement of RT's ``generate()`` loop with the
log-prob recorder rlhfsim's executor passes it (``calibrate.genruntimes.hf_generate.LogprobRecorder``: a
log-sum-exp over each row's logits and a gather per step, the tokens handed to it by a stopping criterion).
TRL's ``generate()`` records none; a scenario with ``generation.sampling_logprobs`` (as ``rlhfsim validate``
prices the executor) is priced with this tail instead of the plain one (``sample_tail(..., logprobs=True)``).
Missing: the plain tail (the recorder unpriced; the summary says so). ``kv_decoder``'s sampler computes the
log-probs in every case (``calibrate.measuring.decoder.sample_next``), so its one tail carries them.

The engine's host work per step (``engine_host``; optional keys of ``generation[RT]``, each absent key 0 / none, which
prices a step as before the keys existed):

* ``step_host_s`` ``h0`` and ``step_host_per_seq_s`` ``h1``: what one engine step costs the host beyond its kernels as
  a function of the sequences running in it (scheduling, input preparation, the sampler's bookkeeping, output
  processing, detokenizing): ``H(b) = h0 + h1 b`` for a step of ``b`` rows;
* ``step_host_overlap`` ``phi`` in [0, 1]: the share of ``H`` the engine hides behind the same step's device work (0:
  all serial, as vLLM's V0 engine; SGLang's overlap scheduler and V1's output processing in another process hide
  part): a decode step costs ``(1 - phi) H(b) + max(device, phi H(b))``, the hidden part a floor under the device's
  time as an eager engine's launches are (``rlhfsim.costs.model._Decode``);
* ``graph_max_batch`` (rows) and ``eager_runtime`` (a runtime name): a CUDA-graph engine captures its decode graphs
  up to a batch size (vLLM 0.7-0.9: 512, ``[1, 2, 4] + range(8, 513, 8)`` capped by ``max_num_seqs``; vLLM 0.6: 256;
  SGLang 0.4: ``cuda_graph_max_bs`` 160 on GPUs of 25 GB or more) and runs a larger batch eagerly, launching each
  layer's kernels from the host: such a step takes the launch floor of ``eager_runtime``'s decode operation
  (``overhead_per_layer_s`` x layers, ``host_overlap``) instead of its own.

Within a decode segment the batch is fixed, so ``H(b)`` and the floors are per-step constants and the segment's sum
stays closed-form.

Decode-step K/V traffic: ``KV_PASSES`` (below) multiplies the cache bytes a decode step moves; it is
part of the work both the fit (``calibrate.fitting.fit.point_work``) and the simulator compute.
"""

from __future__ import annotations

from dataclasses import dataclass

GEN_RUNTIMES: dict[str, str] = {
    # name -> batching semantics of the framework that calls it
    "hf_generate": "static",
    "hf_static": "static",
    "kv_decoder": "any",
    "vllm": "continuous",
    "sglang": "continuous",
    "vllm_eager": "continuous",
    "vllm_v0": "continuous",
    "vllm_v0_eager": "continuous",
}

# A runtime priced, where the profile has nothing of its own for it, as another: its prefill/decode operations, its
# ``generation`` scalars (call overhead, handoff, padding, sampling tail, K/V passes). Not its engine's host work
# (``engine_host``): the V0 engine's scheduler and output processing are other code than V1's.
PRICED_AS: dict[str, str] = {"vllm_v0": "vllm", "vllm_v0_eager": "vllm_eager"}

# The runtime a scenario's engine uses when ``generation.runtime`` is not given: TRL generates with
# HF generate (static batches); verl and OpenRLHF with vLLM (continuous batching).
DEFAULT_RUNTIME = {"static": "hf_generate", "continuous": "vllm"}

GEN_SCALARS = ("call_overhead_s", "handoff_s", "handoff_per_row_s", "pad_step_s", "pad_step_per_row_s", "pad_prefill_s")
# The engine's host work per step (module docstring; ``engine_host``): seconds per step, per running sequence, and the
# share hidden behind the device.
HOST_SCALARS = ("step_host_s", "step_host_per_seq_s", "step_host_overlap")


@dataclass(frozen=True)
class EngineHost:
    """A runtime's engine host work per step and its CUDA-graph limit (module docstring): ``H(b) = step_s + per_seq_s b``,
    ``overlap`` of it hidden behind the step's device work; a decode batch above ``graph_max_batch`` rows (None: no
    limit) runs eagerly, at ``eager_runtime``'s launch floor."""

    step_s: float = 0.0
    per_seq_s: float = 0.0
    overlap: float = 0.0
    graph_max_batch: int | None = None
    eager_runtime: str | None = None

    @property
    def any(self) -> bool:
        """Does it change a step's price (else the step is priced as without the keys)?"""
        return bool(self.step_s or self.per_seq_s or self.graph_max_batch is not None)


def engine_host(runtime: str | None, profile_generation: dict | None) -> EngineHost:
    """``runtime``'s ``EngineHost`` from the profile's ``generation[runtime]`` (its own entry only: ``PRICED_AS`` does
    not lend another engine's host code); all zero / none without it."""
    info = (profile_generation or {}).get(runtime) if runtime else None
    if not isinstance(info, dict):
        return EngineHost()
    g = info.get("graph_max_batch")
    return EngineHost(float(info.get("step_host_s") or 0.0), float(info.get("step_host_per_seq_s") or 0.0),
                      float(info.get("step_host_overlap") or 0.0), int(g) if g is not None else None,
                      info.get("eager_runtime") if g is not None else None)

# Runtimes whose decode loop runs one step per call in the framework's own code (rlhfsim's static-KV
# decoder, as ``calibrate.executor`` drives it): under intra-step streaming a row's new tokens go
# downstream the moment it reaches its own chunk boundary, and its last ones the moment it ends, even in a
# static batch. Runtimes that generate in whole ``generate()`` calls (hf_generate, hf_static) hand a static
# batch's tokens over only when a call returns: at the batch's chunk boundaries and at its end
# (``rlhfsim.sim.engines.static``). Continuous batching hands over per row whatever the runtime.
ROW_HANDOVER = frozenset({"kv_decoder"})

# Runtimes that generate with the training framework's own model object (TRL calls ``generate()`` on
# the policy it trains): when generation runs on the actor's own GPUs there are no inference weights to
# refresh after an update, so the weight sync costs nothing. (Across pools the weights still travel.)
SHARES_TRAINING_WEIGHTS = frozenset({"hf_generate", "hf_static"})

# Passes over the cached K/V a decode step makes, by runtime (a mechanism of the implementation, not a
# fit): transformers' DynamicCache appends with ``torch.cat`` per layer per step
# (``DynamicLayer.update``), which reads the whole cache and writes it anew before attention reads it:
# 3 passes. Static caches and paged caches write the new token in place: 1 pass (attention's read).
# A profile may override it with ``generation[RT].kv_passes``.
KV_PASSES: dict[str, float] = {"hf_generate": 3.0}


# Runtimes that run another runtime's sampling loop after their forward: hf_static is generate() with a
# compiled forward, its tail is hf_generate's (calibrate.measuring.sampling measures hf_generate's only).
SAMPLING_AS: dict[str, str] = {"hf_static": "hf_generate"}


def _tail_of(info) -> tuple[float, float] | None:
    if isinstance(info, dict) and isinstance(info.get("sample_per_logit_s"), (int, float)):
        return float(info.get("sample_s") or 0.0), float(info["sample_per_logit_s"])
    return None


def _lookup(runtime: str | None, profile_generation: dict | None, own_ops: bool,
            logprobs: bool) -> tuple[tuple[float, float], bool]:
    """(the tail ``sample_tail`` prices, whether it carries the sampled tokens' log-probs): ``kv_decoder``'s
    tail always does, another runtime's only when it is its measured ``sampling_logprobs``."""
    gen = profile_generation or {}
    own = own_ops and runtime not in (None, "kv_decoder")
    for name in ([*pricing_names(runtime), SAMPLING_AS.get(runtime)] if own else ["kv_decoder"]):
        info = gen.get(name) if name else None
        recorded = _tail_of(info.get("sampling_logprobs")) if logprobs and isinstance(info, dict) else None
        if recorded is not None:
            return recorded, True
        tail = _tail_of(info)
        if tail is not None:
            return tail, not own
    return (0.0, 0.0), False


def sample_tail(runtime: str | None, profile_generation: dict | None, own_ops: bool,
                logprobs: bool = False) -> tuple[float, float]:
    """(sample_s, sample_per_logit_s) of ``runtime``'s sampling tail (see the module docstring);
    ``own_ops``: the profile prices the runtime's prefill/decode with operations of its own (else the
    plain ones, fitted without ``kv_decoder``'s tail). ``logprobs``: the runtime also records the sampled
    tokens' log-probs: the tail measured with the recorder (``sampling_logprobs``) where the profile has it,
    else the plain one. (0, 0) when nothing was measured."""
    return _lookup(runtime, profile_generation, own_ops, logprobs)[0]


def logprob_tail_priced(runtime: str | None, profile_generation: dict | None, own_ops: bool) -> bool:
    """Whether ``sample_tail(..., logprobs=True)`` prices the recorder (the same look-up)."""
    return _lookup(runtime, profile_generation, own_ops, True)[1]


def kv_passes(runtime: str | None, profile_generation: dict | None = None) -> float:
    """K/V passes per decode step of ``runtime`` (see ``KV_PASSES``)."""
    for name in pricing_names(runtime):
        info = (profile_generation or {}).get(name)
        if isinstance(info, dict) and isinstance(info.get("kv_passes"), (int, float)) and info["kv_passes"] > 0:
            return float(info["kv_passes"])
    return KV_PASSES.get(PRICED_AS.get(runtime, runtime), 1.0) if runtime else 1.0


def pricing_names(runtime: str | None) -> tuple[str, ...]:
    """The runtimes whose profile entries price ``runtime``, in order: itself, then the one it is priced as
    (``PRICED_AS``); () for None."""
    if runtime is None:
        return ()
    twin = PRICED_AS.get(runtime)
    return (runtime, twin) if twin else (runtime,)


def op_key(op: str, runtime: str) -> str:
    """``prefill:hf_generate``: the profile operation of ``op`` (prefill or decode) under ``runtime``."""
    return f"{op}:{runtime}"
