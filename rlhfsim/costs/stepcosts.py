"""Step scalars: what a training framework's step costs beyond the roofline operations (``execution`` in
the scenario: micro-batches, gradient checkpointing, offload, weight resharding, advantages), and what a
Profile says about each.

This module is the one home of the names, the defaults and the profile layout; it is pure Python (no
torch, no pydantic), so both sides import it: ``calibrate.measuring.stepbench`` measures the scalars and writes
``profile["step"]``, ``rlhfsim.costs.model.CostModel.step_scalar`` reads them.

Profile key (schema_version 1, optional, so older profiles still load)::

    "step": {"microbatch_forward_s": f, ..., "source": "measured", "device": ..., "samples": {...}}

A profile without ``step`` (or without one of the keys, or with null) prices it with the default below,
and the simulation summary flags it (``step_costs.KEY.source == "default"``). Units: seconds, bytes,
fractions.

======================== ========= ==================================================================
scalar                   default   meaning
======================== ========= ==================================================================
microbatch_forward_s     0         framework host time per forward piece beyond the fitted forward
                                   (slicing the batch, log-softmax gather, moving outputs); charged on
                                   every forward call, micro-batched or not
microbatch_train_s       0         the same per training piece (log-probs, the PPO loss, backward
                                   bookkeeping, gradient accumulation scaling), on every training call
checkpoint_extra_frac    1/3       gradient checkpointing: extra time of a training piece as a
                                   fraction of the piece without it (one more forward of the three
                                   passes forward + backward = 3 forwards)
host_copy_eff            0.8       fraction of the device's host link (``host_link_bw``) a pinned
                                   host <-> device copy reaches
reshard_eff              0.7       memory efficiency of loading gathered weights into the engine's
                                   layout (a copy through device memory: read + write)
kv_realloc_s             0.02      fixed cost of freeing and allocating the engine's KV cache again
kv_realloc_s_per_gib     0.002     ... plus this per GiB of KV cache per GPU
adv_per_op_s             ADV       the driver's advantage step (rlhfsim.costs.driver): fixed dispatch of
                                   one small tensor op of GAE's reverse loop over positions
adv_per_strided_s        ADV       ... per row and op of that loop (a strided column of [rows, width])
adv_per_element_s        ADV       ... per element of [rows, padded width] and element-wise pass
adv_per_row_s            ADV       ... per row of GRPO's Python loops (group statistics, normalization)
retokenize_s             1e-4      a reward model of another tokenizer: one call decoding a batch of
                                   the actor's token ids to text and tokenizing the texts for the
                                   reward model (TRL's ``reward_processing_classes``), fixed part ...
retokenize_per_token_s   1e-6      ... plus this per token (prompt + response) of the batch. Host CPU
                                   work: it does not depend on the accelerator
======================== ========= ==================================================================

The defaults are assumptions, not measurements of the profile's device (the summary says so): the micro-batch
terms default to 0, a piece costing its fitted ``forward``/``train`` operation (the step before they were
measured); 1/3 is the FLOP count of one extra forward; 0.8 is a typical pinned-copy share of PCIe; 0.7 is the
link efficiency the cost model assumes elsewhere (``LINK_EFF``); the KV terms are order-of-magnitude guesses for a
host-side allocator call; the retokenize terms are the order of a Rust ``tokenizers`` decode + encode (about a
microsecond per token). The advantage terms (ADV) are host work measured: ``calibrate.measuring.advbench``'s timings of
verl's code paths on this project's 2-vCPU VM (AMD EPYC, Zen 5; the fastest of 9 calls, the median over shapes;
``ADV_MEASURED_HERE``), times ``ADV_HOST_SCALE``, the factor from that VM to the reference host the profile's host
terms are stated for (the H100/H200 servers' Xeon Platinum 8480C: ``rlhfsim.hardware.hosts``). ``rlhfsim calibrate``
(``calibrate.measuring.stepbench``) replaces them with measurements on its device.
"""

from __future__ import annotations

from rlhfsim.hardware.hosts import scale_from_clock

# calibrate.measuring.advbench on this project's VM (2026-12-07, torch 2.13 CPU, one thread; the median of five runs, the element
# cost with the passes' fresh allocations: lab/results/advbench-2026-12-07): seconds per op, per row-op, per
# element-pass, per row; and the VM-to-reference-host factor of host work (rlhfsim.hardware.hosts; docs/calibration.md,
# "From this CPU to a GPU server's host": one Python thread on a Xeon 8480C takes 1.35 times as long as here)
ADV_MEASURED_HERE = {"adv_per_op_s": 3.7e-6, "adv_per_strided_s": 3.3e-9, "adv_per_element_s": 1.2e-9,
                     "adv_per_row_s": 1.23e-5}
ADV_HOST_SCALE = scale_from_clock(3.9, "zen5")

STEP_DEFAULTS: dict[str, float] = {
    "microbatch_forward_s": 0.0,
    "microbatch_train_s": 0.0,
    "checkpoint_extra_frac": 1.0 / 3.0,
    "host_copy_eff": 0.8,
    "reshard_eff": 0.7,
    "kv_realloc_s": 0.02,
    "kv_realloc_s_per_gib": 0.002,
    **{k: v * ADV_HOST_SCALE for k, v in ADV_MEASURED_HERE.items()},
    "retokenize_s": 1e-4,
    "retokenize_per_token_s": 1e-6,
}
STEP_SCALARS = tuple(STEP_DEFAULTS)
EFFICIENCIES = ("host_copy_eff", "reshard_eff")  # in (0, 1.5]; every other scalar >= 0

# Bytes per parameter of AdamW state that optimizer offload moves (fp32 master weight, two moments):
# rlhfsim.scenario.checks.OPTIMIZER_BYTES_PER_PARAM less the bf16 gradient.
OPTIMIZER_STATE_BYTES = 12
GIB = 2**30


def check_step(doc: dict, where: str) -> str | None:
    """The first problem with ``profile["step"]`` as a one-line message naming its key, or None."""
    if not isinstance(doc, dict):
        return f"{where}: expected an object of step scalars, got {type(doc).__name__}"
    for k in STEP_SCALARS:
        v = doc.get(k)
        if v is None:
            continue
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not 0 <= v < float("inf"):
            return f"{where}.{k}: expected a finite number >= 0 or null, got {v!r}"
        if k in EFFICIENCIES and not 0 < v <= 1.5:
            return f"{where}.{k}: expected an efficiency in (0, 1.5], got {v!r}"
    return None


def packed_attn_pairs(lengths, encoder: bool = False) -> float:
    """(query, key) pairs attention visits over rows of ``lengths`` packed without padding: each row
    attends within itself, causally (L (L + 1) / 2) or, for an encoder, fully (L^2)."""
    if encoder:
        return float(sum(n * n for n in lengths))
    return float(sum(n * (n + 1) / 2 for n in lengths))
