"""The named cost terms a step's price is made of: one registry (``TERMS``), read by the simulator's per-phase
breakdown (``rlhfsim explain``), by validate's per-call tables (the ``Price`` of each ``rlhfsim.costs.price`` call)
and by the docs' term table (``python -m rlhfsim.costs.terms`` prints it as Markdown: docs/reference/cost-terms.md).

A term is a ``CostTerm`` object, registered by one row below (``KERNELS = _row("kernels", ...)``); a breakdown's
keys are these objects (a ``CostTerm`` is the ``str`` of its name, so a breakdown prints and writes JSON as
before), and code names a term by importing its constant: a misspelt name fails when its module is imported. No
module writes a term's name as a string, nor keys a breakdown with one (tests/unit/test_term_names.py reads them all).

Each term says what it prices, where its numbers live in a profile or a scenario, the devices it applies to
(``any``; ``gpu``: priced only from a GPU profile's sections, a CPU profile never reaches it; ``cpu``: a host
effect measured on a CPU, priced only where the device is a CPU: ``rlhfsim.costs.cpuhost``) and what measures
or sources it. The equations are in docs/cost-model.md; the module that computes each term is named.

Every breakdown sums exactly (to float rounding) to the price it splits:

* a forward or training piece (``CallParts.terms``, ``CostModel.forward``): kernels + op_overhead +
  logprob_head + layer_elementwise + fsdp_exposed + host_launch_bound, and on a CPU the host effects priced inside its roofline
  (logprob_tail_cpu, page_faults, width_rate), each the price with it less the price without it, taken out
  of kernels (what the device computes) or op_overhead (page faults: host time); a mixture-of-experts model's
  router and expert_imbalance the same way, out of kernels (``rlhfsim.costs.moe.effects``);
* decode steps (``_Decode.price``): decode_kernels + engine_step + sampling_tail + host_launch_bound (+ engine_host
  where the profile has the engine's host work per step, + tp_inter_node where the engine's TP spans NVLink domains), and on a CPU gemm_footprint (out of decode_kernels) and
  cold_overheads (out of the fixed costs); a mixture-of-experts model's router and expert_imbalance out of
  decode_kernels (``rlhfsim.costs.moe.split_decode``);
* a generation prefill whose TP spans NVLink domains: its forward's terms with tp_inter_node out of kernels;
* a generation runtime's call (``rlhfsim.costs.price.generate_call``): gen_call_overhead or handoff,
  left_padding, its prefill's forward terms and its decode steps' terms;
* a generation replica's time in a step (``rlhfsim.sim.engines.accounting``): its decode segments' steps
  summed by term (decode_kernels, engine_step, sampling_tail, host_launch_bound, on a CPU gemm_footprint and
  cold_overheads, left_padding per padded step), its prefill calls' forward terms, gen_call_overhead,
  left_padding, handoff, and interference (a segment or hand-over slowed by co-running scoring: the time
  taken less the price alone); the generate phase's span is the last replica's terms plus its idle time;
* a streamed scorer call (``Streaming.parts``): a forward's terms, reencode_prefix where the strategy
  re-encodes what earlier calls scored, retokenize, and interference (its co-running slowdown);
* a forward or training piece under Megatron's parallelism (``execution.megatron``): the piece's terms priced on one
  stage's layers plus pp_p2p, cp_comm and ep_alltoall (``rlhfsim.costs.parallel``), and per replica's forward pass
  or per minibatch and rank the pipeline_bubble over its pieces;
* a phase: its calls' terms plus framework_piece, offload and optimizer; a CPU-side phase (advantage,
  retokenize, rule_reward) and the weight update (weight_sync, offload, and pool_weight_transfer where the engine
  has a pool of its own) are one term each.

A streamed phase's span also holds the time its replica waits for generation to hand tokens over: that is
not a cost term, and ``WAITING`` names it.

Host-side terms (op_overhead, host_launch_bound, framework_piece, engine_step, engine_host, gen_call_overhead,
handoff, advantage, retokenize) read their profile values times one factor, the GPU's server host CPU against the
host the profile states them for (``rlhfsim.costs.hostscale``; ``rlhfsim gpus`` lists each GPU's host).
"""

from __future__ import annotations

from functools import partial

DEVICES = ("any", "gpu", "cpu")


class CostTerm(str):
    """One named term of the cost model: a registry row (``_row``). The object is its name (a ``str``: a breakdown's
    keys are these objects, so a breakdown prints, compares and writes to JSON as its names do), and it carries what
    it prices, the profile or scenario key holding its numbers, the devices it applies to (``DEVICES``), what
    measures or sources it, and the module (or ``module.Class.method``) whose formula computes it.

    Code names a term by importing its constant (``from rlhfsim.costs.terms import INTERFERENCE``), never by writing
    its name: a misspelt constant is an ImportError when the module is imported, where a misspelt string would have
    been a new term, silently, at run time."""

    prices: str
    key: str          # profile (or scenario) key holding its numbers
    devices: str      # any | gpu | cpu
    measured_by: str  # what measures or sources it
    module: str       # where the formula lives: a module, or a module's function, class or method (dotted)

    def __new__(cls, name: str, prices: str, key: str, devices: str, measured_by: str, module: str) -> "CostTerm":
        if devices not in DEVICES:
            raise ValueError(f"cost term {name!r}: devices expected one of {', '.join(DEVICES)}, got {devices!r}")
        t = super().__new__(cls, name)
        for k, v in (("prices", prices), ("key", key), ("devices", devices), ("measured_by", measured_by),
                     ("module", module)):
            object.__setattr__(t, k, v)
        return t

    def __setattr__(self, k, v):
        raise AttributeError(f"cost term {self.name!r} is read-only")

    def __reduce__(self):
        return term, (self.name,)   # a copy, or a breakdown unpickled in another process, is the registry's object

    @property
    def name(self) -> str:
        return str.__str__(self)

    def __repr__(self) -> str:
        return f"CostTerm({self.name!r})"


_ROWS: list[CostTerm] = []


def _row(name: str, prices: str, key: str, devices: str, measured_by: str, module: str) -> CostTerm:
    """Register one cost term (a new term is one row below); a repeated name or an unknown device kind fails at import."""
    if any(t == name for t in _ROWS):
        raise ValueError(f"cost term {name!r}: registered twice")
    t = CostTerm(name, prices, key, devices, measured_by, module)
    _ROWS.append(t)
    return t


KERNELS = _row(
    "kernels", "an operation's device work: max(FLOPs / (peak x compute_eff), bytes / (bandwidth x "
    "memory_eff)), plus tensor-parallel and Ulysses communication, and a forward log-prob pass's head",
    "operations.OP.compute_eff, memory_eff (a derived profile's carried to the GPU by its compute-to-bandwidth "
    "balance: catalog.carried_compute_eff); kernels_by_shape (GPU profiles built from public measurements)",
    "any", "rlhfsim calibrate (fit of measured points); rlhfsim calibrate --from-ops (Vidur's per-operation "
    "GPU data); MAMF's sustained GEMM fraction and datasheet peaks and bandwidths (the carrying)",
    "rlhfsim.costs.model.roofline")
OP_OVERHEAD = _row(
    "op_overhead", "an operation's fitted fixed time per call and per layer beside its kernels",
    "operations.OP.overhead_s, overhead_per_layer_s", "any", "rlhfsim calibrate (fit)",
    "rlhfsim.costs.model.with_overheads_s")
LOGPROB_HEAD = _row(
    "logprob_head", "a training piece's element-wise passes over its logits (temperature, log-probs, "
    "entropy and their backward), after the GEMMs", "framework (present: GPU profile); execution.entropy",
    "gpu", "bytes per logit counted from verl's code (rlhfsim.costs.framework)", "rlhfsim.costs.framework")
LAYER_ELEMENTWISE = _row(
    "layer_elementwise", "a framework forward pass's decoder-layer element-wise kernels (transformers' eager RMSNorm "
    "in float32, rotary embedding, SwiGLU, residual adds), serial with its GEMMs, where the pass is priced from "
    "GEMM-only kernel curves (a whole-pass efficiency holds them already)",
    "framework (present: GPU profile); kernels_by_shape.elementwise.memory_eff", "gpu",
    "bytes per token counted from transformers' modeling code; Vidur's element-wise kernels' memory efficiency "
    "(calibrate.fitting.fromops)", "rlhfsim.costs.eager")
FSDP_EXPOSED = _row(
    "fsdp_exposed", "FSDP/ZeRO-3 parameter gathers and gradient reduce-scatters of a piece, where they "
    "outlast its compute (the first unit's gather always)", "execution.sharding; the GPU's link bandwidth",
    "any", "bytes from FSDP FULL_SHARD's mixed precision; hardware catalog link bandwidth",
    "rlhfsim.costs.framework")
HOST_LAUNCH_BOUND = _row(
    "host_launch_bound", "host dispatch beyond the device's time in a launch-bound piece or decode step "
    "(a max, not a sum: launches run ahead of the device); a CUDA-graph engine's decode step above its graph "
    "limit launches eagerly", "framework.host_forward_per_layer_s, "
    "host_train_per_layer_s, host_checkpoint_mult, fsdp_host_per_unit_s; operations.decode:RT.host_overlap; "
    "generation.RT.graph_max_batch, eager_runtime",
    "gpu", "H200 measurement of Qwen2.5-0.5B pieces (h200-measured step.samples); pytorch/pytorch#173680",
    "rlhfsim.costs.framework, rlhfsim.costs.model._Decode")
FRAMEWORK_PIECE = _row(
    "framework_piece", "a framework's host time per piece beyond the fitted call (slicing, the loss)",
    "step.microbatch_forward_s, microbatch_train_s", "any", "calibrate.measuring.stepbench", "rlhfsim.costs.stepcosts")
OFFLOAD = _row(
    "offload", "parameters, gradients and optimizer state crossing the host link",
    "execution.offload; step.host_copy_eff; hardware host_link_bw", "any", "calibrate.measuring.stepbench (host_copy_eff)",
    "rlhfsim.sim.execution.offload_s")
HOST_SWAP = _row(
    "host_swap", "NeMo RL's colocated step with a Megatron policy worker: the distributed optimizer's state to host "
    "memory and back (2 x 12 P / n), the actor's parameters to host memory after the weight update and back before the "
    "log-prob passes (2 W_r) and the reference pass's weight swap through the policy's model (3 W_r), W_r the actor's "
    "weight bytes on one GPU under its Megatron layout; recorded in the weight update's phase for the whole step",
    "execution.offload.megatron_swap; step.host_copy_eff; hardware host_link_bw", "any",
    "bytes counted from NeMo RL's megatron_policy_worker (offload_before_refit, offload_after_refit, "
    "use_reference_model, prepare_for_training); datasheet host link x calibrate.measuring.stepbench (host_copy_eff)",
    "rlhfsim.costs.hostswap")
OPTIMIZER = _row(
    "optimizer", "the AdamW step on a GPU's shard and the gradient all-reduce (none under FSDP)",
    "operations.optimizer", "any", "derived defaults", "rlhfsim.costs.model.CostModel.optimizer")
DECODE_KERNELS = _row(
    "decode_kernels", "a decode step's device work: weights and KV cache streamed, attention and "
    "GEMM FLOPs, TP all-reduces (two per layer, each never under the measured time of a small message)",
    "operations.decode:RT; kernels_by_shape; collectives.all_reduce.by_workers.N (latency_s, bus_bw, "
    "small_message_s)", "any", "rlhfsim calibrate; --from-ops; Vidur's NCCL all-reduce times (microsoft/vidur "
    "data/profiling/network, calibrate/public/vidur)", "rlhfsim.costs.model._Decode, rlhfsim.costs.model.CostModel._tp_comm_s")
TP_INTER_NODE = _row(
    "tp_inter_node", "a generation engine's tensor-parallel all-reduces when its TP group spans NVLink domains (vLLM at "
    "TP 16 or 32 on 8-GPU nodes): two per layer per prefill and decode step, each an inter-node all-reduce's "
    "small-message time plus its bytes over the inter-node link (out of decode_kernels and kernels, where the "
    "all-reduces within a node are)", "placement.tp.rollout beyond the NVLink domain; hardware inter_node_bw, "
    "INTER_NODE_ALLREDUCE_S", "any", "nccl-tests all_reduce_perf over 2 x 8 Hopper GPUs on NDR InfiniBand, 46-48 us "
    "(NVIDIA/nccl#1244); hardware catalog link bandwidth", "rlhfsim.costs.model.CostModel._tp_comm_s")
ENGINE_STEP = _row(
    "engine_step", "an engine's fixed host time per decode step (scheduling, input preparation, output "
    "processing), serial with the device", "operations.decode:RT.overhead_s (and per layer without "
    "host_overlap)", "any", "rlhfsim calibrate; derived from vLLM/SGLang performance posts",
    "rlhfsim.costs.model._Decode")
ENGINE_HOST = _row(
    "engine_host", "the engine's host work per step as a function of the sequences running in it (scheduler, "
    "input preparation, the sampler's bookkeeping, output processing, detokenizing): (1 - overlap) x H(b) serial "
    "with the step, and the share hidden behind the device where it outlasts the device's work and launches",
    "generation.RT.step_host_s, step_host_per_seq_s, step_host_overlap", "any",
    "vLLM's host code timed on a CPU (calibrate/enginehost: the scheduler, output processor and input "
    "preparation are the same code as on a GPU); vLLM and SGLang performance posts",
    "rlhfsim.costs.model._Decode.host")
PREFILL_CHUNK = _row(
    "prefill_chunk", "prefill tokens a decode step carries under chunked prefill (vLLM V1, V0's "
    "enable_chunked_prefill, SGLang): their device work beyond the step's weight reads, their all-reduces, and "
    "their rows' share of the step's host work", "generation.max_num_batched_tokens, chunked_prefill; "
    "operations.prefill:RT", "any", "the prefill operation's fit (its roofline less the weight bytes)",
    "rlhfsim.costs.model.CostModel.chunk_in_step_s")
SAMPLING_TAIL = _row(
    "sampling_tail", "the sampler's work per decode step and row (softmax, top-k/p, log-probs)",
    "generation.RT.sample_s, sample_per_logit_s", "any", "calibrate.measuring.sampling", "rlhfsim.costs.genruntimes")
GEN_CALL_OVERHEAD = _row(
    "gen_call_overhead", "a static-batch runtime's fixed host cost of one generate() call (argument "
    "checks, cache setup, the stopping criteria), beside its prefill and decode steps",
    "generation.RT.call_overhead_s", "any", "rlhfsim calibrate (calibrate.measuring.genbench prefill points)",
    "rlhfsim.costs.price.generate_call")
HANDOFF = _row(
    "handoff", "the actor's pause at a chunk boundary under intra-step streaming (a generate() call "
    "returning its tokens and the next one continuing on the cache), per boundary and row",
    "generation.RT.handoff_s, handoff_per_row_s", "any", "rlhfsim calibrate (calibrate.measuring.genbench handoff "
    "points)", "rlhfsim.sim.engines.base.Engine.handoff")
LEFT_PADDING = _row(
    "left_padding", "what a left-padded static batch (rows of different contexts) adds to its prefill call "
    "and to each decode step (the attention mask applied at every step)",
    "generation.RT.pad_step_s, pad_step_per_row_s, pad_prefill_s", "any",
    "rlhfsim calibrate (calibrate.measuring.genbench pad points)", "rlhfsim.sim.engines.static")
WEIGHT_SYNC = _row(
    "weight_sync", "the trained weights into the engine: gather, load, KV cache reallocation, engine "
    "sleep and wake, broadcast", "execution.weight_sync; step.reshard_eff, kv_realloc_s", "any",
    "calibrate.measuring.stepbench", "rlhfsim.costs.model.CostModel.reshard_parts")
POOL_WEIGHT_TRANSFER = _row(
    "pool_weight_transfer", "the trained weights crossing from the training pool to a separate generation pool: "
    "`copy`, each engine rank's tensor-parallel shard over the link; `nccl` (verl's one_step_off and fully_async "
    "recipes), every tensor whole, broadcast from the actor's rank 0 to every rank of both pools over NVLink where "
    "the two pools sit in one node, else over the inter-node link; serial with both pools (neither recipe overlaps "
    "it with generation); `nccl` with `packed` (NeMo RL's refit), the same broadcast in buckets, pipelined with the "
    "gather and the load (CostModel.packed_sync_parts)", "execution.weight_sync.kind; placement pools; the GPU's intra_node_bw / inter_node_bw",
    "any", "hardware catalog link bandwidths (bytes = parameters x dtype bytes, counted from the shape)",
    "rlhfsim.costs.model.CostModel.pool_transfer_s")
ADVANTAGE = _row(
    "advantage", "advantages on the driver's CPU over every row padded to the response cap, as verl's code "
    "runs them: GAE's reverse loop over positions (small tensor ops on strided columns), GRPO's Python loops "
    "over rows, their element-wise passes, and verl 0.9's rollout-correction metrics",
    "step.adv_per_op_s, adv_per_strided_s, adv_per_element_s, adv_per_row_s; execution.advantage.gae_loop, "
    "rollout_metrics", "any", "verl's code paths timed on a CPU, one thread (calibrate.measuring.advbench; "
    "calibrate.measuring.stepbench on a profile's host)", "rlhfsim.costs.driver.advantage_parts")
INTERFERENCE = _row(
    "interference", "decode and prefill slowed while they share GPUs (OPPO intra-step; a streamed scorer "
    "call's seconds beyond its price alone)",
    "interference.decode_slowdown, prefill_slowdown, handover", "any", "calibrate.cpu.corun",
    "rlhfsim.costs.model.CostModel.corun")
PAGE_FAULTS = _row(
    "page_faults", "minor page faults of logits-sized tensors above glibc's mmap threshold (out of "
    "op_overhead)",
    "kernels.page_faults", "cpu", "calibrate.cpu.pagefaults", "rlhfsim.costs.cpuhost.page_fault_s")
LOGPROB_TAIL_CPU = _row(
    "logprob_tail_cpu", "a log-prob pass's log-softmax and gather measured on a CPU, priced after its "
    "roofline instead of as bytes inside it (the difference, out of kernels: negative where the measured "
    "tail is faster than the bytes)",
    "kernels.page_faults.logprob_tail.s_per_logit", "cpu", "calibrate.cpu.pagefaults.measure_logprob_tail",
    "rlhfsim.costs.cpuhost.CpuHostEffects, rlhfsim.costs.model._Forward.parts")
COLD_OVERHEADS = _row(
    "cold_overheads", "a decode step's fixed costs (engine step, sampling tail, launch floor) beyond their "
    "hot values, after its weights swept the CPU caches",
    "kernels.cold_overheads", "cpu", "calibrate.cpu.coldfixed", "rlhfsim.costs.cpuhost.cold_factor")
GEMM_FOOTPRINT = _row(
    "gemm_footprint", "a decode step's weight passes (a multi-row GEMM) and its weights' streaming rate, by "
    "the weights' cache footprint (out of decode_kernels)",
    "kernels.gemm_weight_passes, gemm_passes_by_footprint", "cpu", "calibrate.cpu.gemm",
    "rlhfsim.costs.cpuhost.footprint_passes, rlhfsim.costs.cpuhost.stream_factor")
WIDTH_RATE = _row(
    "width_rate", "training rate by model width (the body FLOPs' extra time, out of kernels)", "kernels.width_efficiency", "cpu", "calibrate.cpu.widths",
    "rlhfsim.costs.cpuhost.width_rate")
ROUTER = _row(
    "router", "a mixture-of-experts model's routers: each MoE layer's hidden x E GEMM per token, its weights, and the "
    "softmax and top-k over the E logits (out of kernels or decode_kernels: the price with it less the price without)",
    "the model's shape (config.json num_experts / n_routed_experts / num_local_experts)", "any",
    "counted from the shape (rlhfsim.costs.moe); priced on the operation's roofline", "rlhfsim.costs.moe")
EXPERT_IMBALANCE = _row(
    "expert_imbalance", "a mixture-of-experts layer waiting for its busiest routed expert: the routed experts' FLOPs "
    "times (imbalance - 1) (out of kernels or decode_kernels: the price with it less the price without; nothing "
    "where the step is bound by its bytes)", "models.ROLE.expert_imbalance (default catalog.ASSUMED_EXPERT_IMBALANCE)",
    "any", "an assumption (no public measurement found); the scenario sets it", "rlhfsim.costs.moe")
EXPERT_GEMM = _row(
    "expert_gemm", "a mixture-of-experts layer's routed experts at their own shape (Megatron-core's grouped GEMM): each "
    "GPU's E / ep experts run GEMMs of n k ep / E rows (balanced routing) by hidden x moe_intermediate / etp, priced at "
    "the roofline of that shape, the kernel curve's efficiency at that many rows and one expert's weights where the "
    "profile has kernels_by_shape, less what the call's roofline charged for the same FLOPs; plus the tokens' "
    "permute and unpermute copies (k copies of each hidden state, and the sort by local expert under expert "
    "parallelism) at the element-wise memory efficiency; forward and backward (3 GEMM passes, 2 copy passes) in a "
    "training call", "the model's shape (experts, top-k, moe_intermediate); execution.megatron.ROLE.ep, etp; the "
    "profile's kernels_by_shape (else operations.OP.compute_eff, memory_eff)", "gpu",
    "counted from the shape and Megatron-core's MoE layer (TEGroupedMLP, MoEAlltoAllTokenDispatcher's permute and "
    "unpermute); the profile's kernel curve fitted to Vidur's public GEMM timings; checked against Megatron-Bridge's "
    "published MoE pre-training throughputs (scenarios/examples/megatron-field/pretrain.py)", "rlhfsim.costs.moe.expert_gemm_s")
PIPELINE_BUBBLE = _row(
    "pipeline_bubble", "a pipeline's idle time under 1F1B (Megatron's pipeline parallelism): a training minibatch's (or a "
    "forward pass's) m micro-batches on p stages of v virtual stages each leave every GPU idle (p - 1) / (v m) of its "
    "micro-batches' time (Narayanan et al. 2021), during the pipeline's fill and drain", "execution.megatron.ROLE.pp, vpp; "
    "execution.micro_batch (m)", "any", "the interleaved 1F1B schedule's bubble, counted from its timeline (no fit)",
    "rlhfsim.costs.parallel.bubble_s")
PP_P2P = _row(
    "pp_p2p", "a pipeline stage's activations sent to the next stage and its gradients back (Megatron's point-to-point "
    "sends), per micro-batch and virtual stage, over the intra- or inter-node link", "execution.megatron.ROLE.pp, "
    "vpp; the GPU's link bandwidths", "any", "bytes counted from Megatron's schedule; hardware catalog link bandwidth",
    "rlhfsim.costs.parallel.p2p_s")
CP_COMM = _row(
    "cp_comm", "context parallelism's ring attention: each layer passes every rank's keys and values round the ring of "
    "cp GPUs (cp - 1 steps), forward and backward (the gradients of keys and values too), counted serial with the "
    "compute (an upper bound: Megatron overlaps it with attention)", "execution.megatron.ROLE.cp; the GPU's link "
    "bandwidths", "any", "bytes counted from the model's key/value width; hardware catalog link bandwidth",
    "rlhfsim.costs.parallel.cp_s")
EP_ALLTOALL = _row(
    "ep_alltoall", "expert parallelism's all-to-alls: each MoE layer dispatches every token's hidden state to its top-k "
    "experts' GPUs and combines the results back, forward and backward, (ep - 1) / ep of it leaving the GPU, over "
    "NVLink within a node and the inter-node link otherwise", "execution.megatron.ROLE.ep; the GPU's link bandwidths",
    "any", "bytes counted from Megatron's all-to-all token dispatcher; hardware catalog link bandwidth",
    "rlhfsim.costs.parallel.ep_alltoall_s")
GEN_EP_ALLTOALL = _row(
    "gen_ep_alltoall", "a generation engine's expert all-to-alls under expert parallelism (vLLM's "
    "enable_expert_parallel, SGLang's --ep-size): every decode step dispatches each of a GPU's tokens to its top-k "
    "experts' GPUs and combines them back, per MoE layer, the share within the NVLink domain over NVLink and the rest "
    "over the inter-node link at once, plus a latency per call; with two-batch overlap only what the step's device "
    "time does not hide", "generation.parallel.ep, fp8_dispatch, two_batch_overlap; the GPU's link bandwidths", "any",
    "bytes counted from the routing (k copies per token, DeepEP's low-latency kernels); hardware catalog link "
    "bandwidth; checked against DeepEP's published low-latency times", "rlhfsim.costs.genparallel.alltoall_s")
REENCODE_PREFIX = _row(
    "reencode_prefix", "a streamed scorer call's re-encoding of the prefix earlier calls already scored "
    "(streaming reencode: the call's price less the price of its new tokens alone), what re-scoring costs "
    "against incremental", "models.reward.streaming; operations.reencode:RT (else score:RT, prefill)",
    "any", "calibrate.rescore", "rlhfsim.sim.streaming.Reencode.price")
RETOKENIZE = _row(
    "retokenize", "the host decoding the actor's ids to text and tokenizing it for a reward model of "
    "another tokenizer (per batch, or per streamed call)", "step.retokenize_s, retokenize_per_token_s",
    "any", "calibrate.measuring.stepbench", "rlhfsim.costs.model.CostModel.retokenize_s")
RULE_REWARD = _row(
    "rule_reward", "a rule-based reward checker on CPU workers", "models.reward.cpu_s_per_sample, workers",
    "any", "the scenario", "rlhfsim.costs.model.CostModel.rule_reward_s")


# The one line of an explanation that is not a cost term: a streamed phase's replica idle inside the span,
# waiting for generation to hand tokens over (``rlhfsim explain``'s ``waiting_s``).
WAITING = "waiting for rollouts"

TERMS: tuple[CostTerm, ...] = tuple(_ROWS)   # the registry, in the docs' order
BY_NAME = {t.name: t for t in TERMS}


def term(name: str) -> CostTerm:
    """The registered term called ``name`` (a name read from outside the code: a table, a JSON document)."""
    t = BY_NAME.get(name)
    if t is None:
        raise KeyError(f"cost term: expected one of {', '.join(BY_NAME)}, got {name!r}")
    return t


def split(total_s: float, active_s: float, effects: dict[str, float] | None = None,
          effects_active_s: float = 0.0) -> dict[str, float]:
    """A roofline price (``total_s``, of which ``active_s`` the device's kernels) by term: kernels and
    op_overhead, less the CPU host effects priced inside them (``effects``: seconds by term, of which
    ``effects_active_s`` inside ``active_s``), which are given as their own terms. Sums to ``total_s``."""
    out = {KERNELS: active_s, OP_OVERHEAD: total_s - active_s}
    if effects:
        host = sum(effects.values()) - effects_active_s
        out[KERNELS] = active_s - effects_active_s
        out[OP_OVERHEAD] = total_s - active_s - host
        out.update(effects)
    return out


class Price:
    """An operation's price, as its one predictor returns it (``CostModel.forward``, ``train``, ``optimizer``,
    ``decode_steps``, ...; ``rlhfsim.costs.price``'s calls): ``total_s``, what the simulator charges; ``active_s``, the
    device-busy share of it (what utilization counts); ``terms()``, the same seconds by cost term, summing to
    ``total_s`` (to rounding), worked out only when asked (``rlhfsim explain``, validate's per-call tables), so that a
    price costs the simulator nothing it does not use. Unpacks as ``total_s, active_s``.

    ``why`` says how the terms are had: None, a roofline price's kernels and op_overhead (``split``); a ``CostTerm``,
    all of it that one term; a dict, the terms themselves; a function of no arguments that returns them (a CPU's host
    effects, which are the price again without each)."""

    __slots__ = ("total_s", "active_s", "why")

    def __init__(self, total_s, active_s, why=None):
        self.total_s, self.active_s, self.why = total_s, active_s, why

    def terms(self) -> dict[CostTerm, float]:
        why = self.why
        if why is None:
            return split(self.total_s, self.active_s)
        if isinstance(why, CostTerm):
            return {why: self.total_s}
        if isinstance(why, dict):
            return dict(why)
        return why()

    def add(self, term: CostTerm, seconds: float, active_s: float = 0.0) -> "Price":
        """This price and ``seconds`` more, of ``term`` (``active_s`` of them device-busy)."""
        return Price(self.total_s + seconds, self.active_s + active_s, partial(_added, self, term, seconds))

    def __iter__(self):
        return iter((self.total_s, self.active_s))

    def __getitem__(self, i):
        return (self.total_s, self.active_s)[i]

    def __len__(self) -> int:
        return 2

    def __eq__(self, other) -> bool:
        return isinstance(other, (Price, tuple)) and tuple(self) == tuple(other)

    __hash__ = None

    def __repr__(self) -> str:
        return f"Price(total_s={self.total_s!r}, active_s={self.active_s!r})"


def _added(price: Price, term: CostTerm, seconds: float) -> dict[CostTerm, float]:
    out = price.terms()
    out[term] = out.get(term, 0.0) + seconds
    return out


def with_effects(total_s: float, active_s: float, effects, *args) -> dict[CostTerm, float]:
    """``split`` of a roofline price with the CPU host effects inside it (``effects(*args)``: the effects by term and
    their share of the active seconds, ``CpuHostEffects.forward_effects`` / ``train_effects``): a ``Price``'s ``why``
    on a CPU, bound with ``functools.partial``."""
    return split(total_s, active_s, *effects(*args))


def moved(price: Price, source: CostTerm, term: CostTerm, seconds: float) -> dict[CostTerm, float]:
    """``price``'s terms with ``seconds`` of ``source`` given to ``term`` (a part priced inside ``source``, named: the
    inter-node all-reduces of a prefill, out of kernels); bound with ``functools.partial`` as a ``Price``'s ``why``."""
    out = price.terms()
    out[source] = out.get(source, 0.0) - seconds
    out[term] = out.get(term, 0.0) + seconds
    return out


def add_terms(acc: dict[str, float], parts: dict[str, float], scale: float = 1.0) -> float:
    """Add ``parts`` (seconds by term) x ``scale`` into ``acc``, terms of 0 s left out; returns the seconds added.
    Every breakdown (the simulator's phases, the engines' replicas, validate's per-call tables) sums through it."""
    s = 0.0
    for k, v in parts.items():
        if v:
            v *= scale
            acc[k] = acc.get(k, 0.0) + v
            s += v
    return s


def markdown() -> str:
    """The registry as the docs' table."""
    rows = ["| term | what it prices | profile / scenario key | devices | measured or sourced by | module |",
            "|---|---|---|---|---|---|"]
    rows += [f"| `{t.name}` | {t.prices} | {t.key} | {t.devices} | {t.measured_by} | `{t.module}` |" for t in TERMS]
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    print("# Cost terms\n\nGenerated from `rlhfsim/costs/terms.py` (`python -m rlhfsim.costs.terms`); the equations "
          "are in [cost-model.md](../cost-model.md). `rlhfsim explain SCENARIO` shows which of them a step's "
          "phases are made of. Host-side terms (op_overhead, host_launch_bound, framework_piece, engine_step, "
          "engine_host, gen_call_overhead, handoff, advantage, retokenize) are read times the GPU's host factor "
          "(cost-model.md, \"The host CPU of each GPU's server\").\n")
    print(markdown())
