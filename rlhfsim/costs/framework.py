"""What a training framework pays around the kernels of one forward or training call on a GPU: the host's
dispatch of a launch-bound call, the log-prob head's element-wise passes over the vocabulary, a forward call's
decoder-layer element-wise kernels (``rlhfsim.costs.eager``), and FSDP's
(ZeRO-3's) parameter gathers and gradient reduce-scatters. Each is a named part, so a breakdown can show it.

One call is one micro-batch (piece) of one data-parallel rank::

    kernel_s  = the roofline of the call (CostModel.forward / train), less the log-prob tail's bytes
    head_s    = b x T_logits x V / tp / (mem_bw x memory_eff[prefill])          (log-prob passes with an LM head)
                b = LOGPROB_BYTES (+ ENTROPY_BYTES with execution.entropy) per logit in a forward pass,
                x TRAIN_HEAD_MULT in a training call (the backward of the same element-wise chain)
    ew_s      = a forward call's decoder-layer element-wise kernels, serial with the GEMMs, where its kernels are
                priced from GEMM-only curves (kernels_by_shape; rlhfsim.costs.eager)
    comm_s    = units x latency + bytes / (link_bw x LINK_EFF)                  (execution.sharding: fsdp, n > 1)
                forward: one all-gather of the bf16 parameters, bytes = (n - 1)/n x P x 2
                training: two all-gathers (forward, backward) + a reduce-scatter of fp32 gradients (verl's
                mixed precision reduces in fp32), bytes = (n - 1)/n x P x (2 + 2 + 4); units = L + 1 (one
                FSDP unit per decoder layer and the root)
    device_s  = max(kernel_s + head_s + ew_s, comm_s) + comm_s / units                 (gathers prefetched beside the
                compute; the first unit's gather is exposed)
    host_s    = L x h_fwd  (forward)  or  L x h_train x (checkpoint_mult if gradient checkpointing)  (training)
                + units x h_fsdp x (1 forward | 3 training: the gathers' pre-forward and pre-backward hooks and the
                  post-backward reduce-scatter)                                  (execution.sharding: fsdp)
    call_s    = max(device_s, host_s)

CUDA launches are asynchronous, so the host's dispatch overlaps the device's work: a call costs the larger of
the two, not their sum. A small model's call with few tokens is launch-bound (host_s wins); a large one is
device-bound. Units: seconds, bytes, FLOP/s.

Where the numbers come from: the host terms are in the profile's ``framework`` section, which GPU profiles
carry (CPU profiles do not: on a CPU the host *is* the device and the fitted operations already hold it, so
nothing here applies). The bundled values are the H200 measurement of Qwen2.5-0.5B pieces (``rlhfsim/profiles/
h200-measured.json``, ``step.samples``: a forward piece of 2 rows x 64 tokens took 19.0 ms (median of 7), a
training piece 89.4 ms, the same checkpointed 178.4 ms; at 64 tokens the device's share is well under 1 ms, so
these are host dispatch), divided by its 24 layers; the eager decode step's fitted host time per layer on
the same H200 (``decode:hf_generate.overhead_per_layer_s``, 0.79 ms) agrees with the forward's 0.79 ms. The
per-logit bytes are counted from verl's code (``verl.utils.torch_functional``: ``logits.div_(temperature)``,
``logprobs_from_logits`` through flash-attn's fused cross entropy, ``entropy_from_logits`` = logsumexp -
sum(softmax x logits)) in bf16: 4 (div_) + 2 (fused cross entropy) = 6, and 18 for the entropy (softmax: max,
read, write; logsumexp: two reads; product: two reads, one write; sum: one read; 2 bytes each). The FSDP
bytes follow FSDP's FULL_SHARD (reshard after forward) as verl configures it (param bf16, reduce fp32). FSDP's
own host time per unit and collective, h_fsdp (``fsdp_host_per_unit_s``), is the public report of FSDP's
``pre_forward`` taking about 1 ms per module on a Xeon host (pytorch/pytorch#173680, torch 2.10, FSDP2); FSDP1's
per-parameter view bookkeeping is of the same order (pytorch/pytorch#96958: unshard 4.3 ms and reshard 2.7 ms for
400 parameters, about 20 us per parameter and cycle, 12 parameters per Qwen2 layer).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from rlhfsim.costs.terms import FSDP_EXPOSED, HOST_LAUNCH_BOUND, LAYER_ELEMENTWISE, LOGPROB_HEAD, Price, split
from rlhfsim.models.catalog import ModelShape

LOGPROB_BYTES = 6.0     # bytes per logit: temperature div_ (read + write bf16) + fused cross entropy (read)
ENTROPY_BYTES = 18.0    # bytes per logit of verl's entropy_from_logits in bf16 (see the module docstring)
TRAIN_HEAD_MULT = 3.0   # a training call runs the chain forward and its backward (about twice the traffic)
PARAM_BYTES = 2.0       # FSDP's gathered parameters (bf16)
GRAD_REDUCE_BYTES = 4.0  # FSDP's gradient reduce-scatter (fp32 reduce dtype)

FRAMEWORK_KEYS = ("host_forward_per_layer_s", "host_train_per_layer_s", "host_checkpoint_mult")
OPTIONAL_KEYS = ("fsdp_host_per_unit_s",)  # 0 when absent
FSDP_TRAIN_COLLECTIVES = 3  # a training call's gathers (forward, backward) and reduce-scatter, per unit


def check_framework(doc: dict, where: str) -> str | None:
    """The first problem with ``profile["framework"]`` as a one-line message naming its key, or None."""
    if not isinstance(doc, dict):
        return f"{where}: expected a mapping, got {type(doc).__name__}"
    for k in FRAMEWORK_KEYS + tuple(k for k in OPTIONAL_KEYS if k in doc):
        v = doc.get(k)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 0 or v == float("inf"):
            return f"{where}.{k}: expected a finite number >= 0, got {v!r}"
    if doc["host_checkpoint_mult"] < 1:
        return f"{where}.host_checkpoint_mult: expected >= 1 (checkpointing adds work), got {doc['host_checkpoint_mult']!r}"
    return None


@dataclass(frozen=True)
class FrameworkHost:
    """The host's dispatch time per layer of a framework's call (profile ``framework``)."""

    forward_per_layer_s: float
    train_per_layer_s: float
    checkpoint_mult: float
    fsdp_per_unit_s: float = 0.0

    @classmethod
    def of(cls, profile: dict) -> "FrameworkHost | None":
        doc = profile.get("framework")
        if not doc:
            return None
        return cls(float(doc["host_forward_per_layer_s"]), float(doc["host_train_per_layer_s"]),
                   float(doc["host_checkpoint_mult"]), float(doc.get("fsdp_host_per_unit_s") or 0.0))

    def forward_s(self, m: ModelShape, fsdp: bool = False) -> float:
        return m.layers * self.forward_per_layer_s + (fsdp_units(m) * self.fsdp_per_unit_s if fsdp else 0.0)

    def train_s(self, m: ModelShape, checkpointing: bool, fsdp: bool = False) -> float:
        return m.layers * self.train_per_layer_s * (self.checkpoint_mult if checkpointing else 1.0) + \
            (fsdp_units(m) * FSDP_TRAIN_COLLECTIVES * self.fsdp_per_unit_s if fsdp else 0.0)


def head_bytes_per_logit(entropy: bool, training: bool) -> float:
    """Element-wise bytes per logit of a log-prob call's head after its GEMM (module docstring)."""
    b = LOGPROB_BYTES + (ENTROPY_BYTES if entropy else 0.0)
    return b * (TRAIN_HEAD_MULT if training else 1.0)


def fsdp_bytes(m: ModelShape, head: str, n: int, training: bool) -> float:
    """Bytes each GPU moves through FSDP's collectives in one call over ``n`` shards (0 for n <= 1)."""
    if n <= 1:
        return 0.0
    per_param = 2 * PARAM_BYTES + GRAD_REDUCE_BYTES if training else PARAM_BYTES
    return (n - 1) / n * m.params(head) * per_param


def fsdp_units(m: ModelShape) -> int:
    """FSDP units of a decoder wrapped per layer (verl's auto-wrap policy), plus the root."""
    return m.layers + 1


@dataclass(frozen=True)
class CallParts:
    """Seconds of one framework call, by part; ``total_s`` = max(device, host) (module docstring).
    ``kernel_active_s``: the roofline's device-busy share of ``kernel_s`` (its fitted overheads are not).
    ``effects``: on a CPU, what gives the host effects priced inside ``kernel_s`` (seconds by term, and their
    share inside ``kernel_active_s``), asked only by ``terms`` (None on a GPU: none exist)."""

    kernel_s: float
    kernel_active_s: float
    head_s: float = 0.0
    comm_s: float = 0.0
    comm_exposed_s: float = 0.0
    host_s: float = 0.0
    effects: Callable[[], tuple[dict[str, float], float]] | None = field(default=None, compare=False, repr=False)
    elementwise_s: float = 0.0   # the decoder layers' element-wise kernels (rlhfsim.costs.eager)
    # Megatron's communications serial with the call, (term, seconds) each (rlhfsim.costs.parallel): pp_p2p, cp_comm,
    # ep_alltoall; empty without execution.megatron
    parallel: tuple = ()

    @property
    def device_s(self) -> float:
        serial = self.kernel_s + self.head_s + self.elementwise_s
        if self.parallel:
            serial += sum(s for _, s in self.parallel)
        if self.comm_s <= 0:
            return serial
        if isinstance(serial, np.ndarray):   # many pieces priced at once
            return np.maximum(serial, self.comm_s) + self.comm_exposed_s
        return max(serial, self.comm_s) + self.comm_exposed_s

    @property
    def total_s(self) -> float:
        device = self.device_s
        if isinstance(device, np.ndarray):   # a call priced for many pieces at once (token counts as an array)
            return np.maximum(device, self.host_s)
        return max(device, self.host_s)

    @property
    def active_s(self) -> float:
        """Device-busy seconds: the roofline's kernels, the head and the communication not hidden by them."""
        return self.kernel_active_s + (self.device_s - self.kernel_s)

    def price(self) -> Price:
        """The call as a ``Price``: its total, active seconds and terms."""
        return Price(self.total_s, self.active_s, self.terms)

    def terms(self) -> dict[str, float]:
        """Seconds by cost term (``rlhfsim.costs.terms``), summing to ``total_s``: the host counts only where it
        exceeds the device's time; a CPU's host effects (``effects``) are split out of kernels and op_overhead."""
        out = split(self.kernel_s, self.kernel_active_s, *(self.effects() if self.effects is not None else ()))
        par = sum(s for _, s in self.parallel) if self.parallel else 0.0
        out.update({LOGPROB_HEAD: self.head_s, LAYER_ELEMENTWISE: self.elementwise_s,
                    FSDP_EXPOSED: max(self.device_s - self.kernel_s - self.head_s - self.elementwise_s - par, 0.0),
                    HOST_LAUNCH_BOUND: max(self.host_s - self.device_s, 0.0)})
        out.update(self.parallel)
        return out
