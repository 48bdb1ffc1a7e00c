"""The scenario: a frozen pydantic model loaded from YAML. Help text lives next to each field, so
``rlhfsim schema`` and the docs come from one place. Cross-field checks that need catalogs (memory fit,
GPU counts) live in ``rlhfsim.scenario.checks`` so they can name the exact YAML path."""

from __future__ import annotations

from typing import Annotated, Literal, Optional, Union

from pathlib import Path

from pydantic import Field, PrivateAttr, model_validator

from rlhfsim.contracts import ROLES, STREAMING_ARCHS
from rlhfsim.costs.genruntimes import DEFAULT_RUNTIME, GEN_RUNTIMES
from rlhfsim.scenario.fields import Frozen, PositiveInt, Seconds, Tokens  # noqa: F401 (the blocks' types)
from rlhfsim.scenario.schedules import CONFIGS, VARIANTS, SyncSchedule

STREAMING_NAMES = tuple(STREAMING_ARCHS)

Dtype = Literal["bfloat16", "float16", "float32", "float8"]


# --- length distributions -------------------------------------------------------------------------
class Fixed(Frozen):
    kind: Literal["fixed"] = "fixed"
    value: Tokens = Field(description="Every sample has this many tokens.")


class Normal(Frozen):
    kind: Literal["normal"] = "normal"
    mean: float = Field(gt=0, description="Mean tokens.")
    std: float = Field(ge=0, description="Standard deviation in tokens (samples clipped to [1, cap]).")


class LogNormal(Frozen):
    kind: Literal["lognormal"] = "lognormal"
    median: float = Field(gt=0, description="Median tokens.")
    p99: float = Field(gt=0, description="99th percentile in tokens (must exceed the median).")

    @model_validator(mode="after")
    def _p99_above_median(self):
        if self.p99 <= self.median:
            raise ValueError(f"expected p99 > median ({self.median}), got p99={self.p99}")
        return self


class Pareto(Frozen):
    kind: Literal["pareto"] = "pareto"
    scale: float = Field(gt=0, description="Minimum length x_m in tokens.")
    alpha: float = Field(gt=0, description="Tail index; smaller is heavier (alpha <= 2 has infinite variance).")


class Empirical(Frozen):
    kind: Literal["empirical"] = "empirical"
    path: str = Field(description="CSV or JSONL file of observed lengths, relative to the scenario file.")


class Trace(Frozen):
    kind: Literal["trace"] = "trace"
    path: str = Field(description="CSV or JSONL of a real run's rollouts (columns step, prompt_id, rollout, prompt_len, response_len), relative to the scenario file; replayed one for one in (step, prompt, rollout) order with each rollout's own prompt length (workload.prompt_length is then not sampled). Every prompt needs algorithm.group_size rollouts and every step workload.prompts_per_step prompts; a run longer than the trace starts it over. Write one with `rlhfsim lengths import`.")


class Component(Frozen):
    weight: float = Field(gt=0, le=1e12, description="Relative weight of this component (relative to the others; at most 1e12).")
    dist: "LengthDist"


class Mixture(Frozen):
    kind: Literal["mixture"] = "mixture"
    components: list[Component] = Field(min_length=1, max_length=64, description="Weighted components.")


LengthDist = Annotated[Union[Fixed, Normal, LogNormal, Pareto, Empirical, Trace, Mixture], Field(discriminator="kind")]
Component.model_rebuild()


# --- models ---------------------------------------------------------------------------------------
class ModelRef(Frozen):
    model: str = Field(description="Catalog name (see `rlhfsim models`) or path to a local Hugging Face config.json.")
    dtype: Dtype = Field("bfloat16", description=(
        "Weights and activations dtype. float8: FP8 GEMMs (the GPU's FP8 tensor-core peak) and weights stored at 1 "
        "byte, with activations, KV cache, communication and gradients in bfloat16 and the optimizer's fp32 master "
        "weights and moments as for bfloat16; the actor's dtype is also generation's. Only on a GPU with FP8 tensor "
        "cores (`rlhfsim gpus`, fp8 column)."))
    expert_imbalance: Optional[float] = Field(
        None, ge=1.0, le=1000.0, description="A mixture-of-experts model's busiest routed expert's tokens over the mean "
        "(>= 1): its routed experts' FLOPs are priced at this factor (cost term expert_imbalance). Default: the "
        "catalog's assumption, catalog.ASSUMED_EXPERT_IMBALANCE (not a measurement); a dense model takes none.")


class ActorModel(ModelRef):
    pass


class RewardModel(ModelRef):
    kind: Literal["model"] = "model"
    runtime: Optional[str] = Field(None, description="Scoring runtime whose fitted costs to use (a `score:RUNTIME` entry of the profile, e.g. eager, compile, onnxruntime, aoti_cpp). Default: `eager` when the profile measured it (a training framework's forward pass), else the prefill costs.")
    streaming: Optional[Literal[STREAMING_NAMES]] = Field(
        None, description="How responses reach the reward model while the actor decodes (OPPO intra-step, `schedule.intra`): `incremental` (each chunk prefilled on top of the reward model's own KV cache of the prefix; decoders only: an encoder's bidirectional attention has no causal cache), `reencode` (each chunk re-encodes the whole prefix so far from scratch; only the last pass gives the score, the earlier ones keep the scorer busy ahead of time), `final_only` (nothing streams: each response is scored whole as soon as it finishes, verl-style per-sample reward overlap; the actor still returns every `chunk_tokens`). Default: incremental for a decoder, final_only for an encoder. Ignored when nothing streams (sync, intra-step off).")


class RuleReward(Frozen):
    kind: Literal["rule"] = "rule"
    cpu_s_per_sample: Seconds = Field(0.001, description="CPU seconds to check one response (e.g. a GSM8K answer matcher).")
    workers: PositiveInt = Field(8, description="CPU processes scoring in parallel.")


class Models(Frozen):
    actor: ActorModel
    critic: Optional[ModelRef] = Field(None, description="Value model (PPO). Omit for GRPO.")
    reference: Optional[ModelRef] = Field(None, description="Reference policy for the KL penalty.")
    reward: Annotated[Union[RewardModel, RuleReward], Field(discriminator="kind")] = Field(
        description="A reward model (`kind: model`, the default), or `kind: rule` for a rule-based checker on the CPU.")

    @model_validator(mode="before")
    @classmethod
    def _reward_kind_defaults_to_model(cls, data):
        if isinstance(data, dict) and isinstance(data.get("reward"), dict) and "kind" not in data["reward"]:
            data = {**data, "reward": {**data["reward"], "kind": "model"}}
        return data


# --- cluster and placement ------------------------------------------------------------------------
class Cluster(Frozen):
    gpu: str = Field(description="Device type from the hardware catalog (see `rlhfsim gpus`).")
    nodes: int = Field(1, ge=1, le=4096, description="Number of nodes.")
    gpus_per_node: int = Field(8, ge=1, le=64, description="GPUs per node.")


class Pool(Frozen):
    name: str = Field(description="Pool name used in outputs.")
    gpus: int = Field(ge=1, le=262_144, description="GPUs in this pool.")
    roles: list[Literal[ROLES]] = Field(
        min_length=1, max_length=len(ROLES), description="Roles on this pool. `rollout` (the generation engine) goes with `actor` unless placed elsewhere.")


class TensorParallel(Frozen):
    actor: PositiveInt = 1
    critic: PositiveInt = 1
    reference: PositiveInt = 1
    reward: PositiveInt = 1
    rollout: Optional[PositiveInt] = Field(None, description="TP of the generation engine; default: actor's.")


class Colocated(Frozen):
    kind: Literal["colocated"] = "colocated"
    tp: TensorParallel = TensorParallel()


class DedicatedReward(Frozen):
    """OPPO's 7+1: the reward model on its own GPUs, everything else on the rest."""

    kind: Literal["dedicated_reward"] = "dedicated_reward"
    reward_gpus: PositiveInt = Field(1, description="GPUs given to the reward model.")
    tp: TensorParallel = TensorParallel()


class CustomPlacement(Frozen):
    kind: Literal["pools"] = "pools"
    pools: list[Pool] = Field(min_length=1, max_length=64)
    tp: TensorParallel = TensorParallel()


Placement = Annotated[Union[Colocated, DedicatedReward, CustomPlacement], Field(discriminator="kind")]


# --- algorithm, workload, generation ---------------------------------------------------------------
class Algorithm(Frozen):
    kind: Literal["ppo", "grpo", "rloo"] = "ppo"
    group_size: int = Field(1, ge=1, le=1024, description="Rollouts per prompt: GRPO's and RLOO's groups; with PPO, several samples per prompt each with its own GAE advantages (verl: rollout.n with adv_estimator gae; OpenRLHF: n_samples_per_prompt).")
    ppo_epochs: int = Field(1, ge=1, le=1000, description="Passes over the batch per step.")
    minibatch_size: PositiveInt = Field(16, description="Sequences per optimizer step (global, over data-parallel ranks).")


class Workload(Frozen):
    prompts_per_step: int = Field(ge=1, le=1_000_000, description="Prompts per step B (rollouts = B x group_size).")
    prompt_length: LengthDist = Field(Fixed(value=256), description="Prompt length distribution (tokens).")
    response_length: LengthDist = Field(description="Response length distribution (tokens).")
    max_prompt_tokens: int = Field(2048, ge=1, le=4_194_304, description="Prompt lengths are clipped to this.")
    max_response_tokens: int = Field(ge=1, le=4_194_304, description="Responses are cut at this many tokens.")


class GenerationParallel(Frozen):
    """How a mixture-of-experts model's generation engine spreads over its GPUs beside ``placement.tp.rollout``
    (vLLM's ``--enable-expert-parallel`` with ``--data-parallel-size``; SGLang's ``--ep-size``,
    ``--enable-dp-attention`` and ``--dp-size``). All defaults: the experts sliced by tensor parallelism as every other
    weight (the simulator's older engine)."""

    ep: PositiveInt = Field(1, le=4096, description="Expert parallelism of the generation engine: each MoE layer's routed experts spread whole over this many GPUs, every decode step dispatching each token's hidden state to its top-k experts' GPUs and combining the results back (cost term gen_ep_alltoall). vLLM: tensor_parallel_size x data_parallel_size with enable_expert_parallel; SGLang: --ep-size (= --tp-size); verl: actor_rollout_ref.rollout.expert_parallel_size. Without dp_attention it must equal placement.tp.rollout (priced as TP then: vLLM runs no all-to-all without data-parallel ranks); with it, a multiple of it. Must divide the rollout pool's GPUs and the model's experts (with redundant_experts).")
    dp_attention: bool = Field(False, description="Data-parallel attention inside an expert-parallel engine: its ep GPUs run ep / placement.tp.rollout attention ranks, each with its own batch (generation.max_batch), its own KV cache and attention at TP placement.tp.rollout (no tensor-parallel all-reduce when that is 1), all ranks stepping together through the shared MoE layers. Each rank is one generation replica. vLLM: data_parallel_size > 1 with enable_expert_parallel; SGLang: --enable-dp-attention --dp-size ep / tp.")
    redundant_experts: int = Field(0, ge=0, le=4096, description="Extra expert replicas an expert-parallel engine holds to balance load (SGLang --ep-num-redundant-experts, vLLM --num-redundant-experts with EPLB): each GPU holds (experts + redundant_experts) / ep experts.")
    fp8_dispatch: bool = Field(False, description="The dispatch all-to-all sends each token's hidden state in FP8 with one fp32 scale per 128 values (DeepEP's low-latency dispatch as SGLang and vLLM's deepep_low_latency backend call it); the combine stays in the activation dtype. Off: both directions in the activation dtype.")
    two_batch_overlap: bool = Field(False, description="Two micro-batches per decode step, one's all-to-alls running while the other computes (SGLang --enable-two-batch-overlap, vLLM --enable-dbo): a step costs the larger of its device time and its all-to-alls instead of their sum.")


class Generation(Frozen):
    engine: Literal["static", "continuous"] = Field(
        "continuous", description="`static`: Hugging Face generate / TRL, a batch ends when its longest sequence ends; `continuous`: vLLM/SGLang-like, finished slots are refilled.")
    max_batch: PositiveInt = Field(64, description="Maximum concurrent sequences per generation replica.")
    replicas: Optional[PositiveInt] = Field(None, description="Data-parallel generation replicas; default: rollout pool GPUs / rollout TP.")
    kv_cache_fraction: float = Field(0.9, gt=0, le=1, description="Fraction of GPU memory left after weights that the KV cache may use.")
    step_overhead_s: Optional[Seconds] = Field(None, description="Per decode step overhead in seconds; default: the profile's decode overhead.")
    sampling_logprobs: bool = Field(
        False, description="The runtime also returns each sampled token's log-prob, computed from the step's logits (a log-softmax over the vocabulary per row and step): rlhfsim's executor does, in every runtime (its PPO ratio's old log-probs); TRL's generate() does not. Priced with the profile's sampling tail measured with the executor's recorder (`generation.RUNTIME.sampling_logprobs`, calibrate.measuring.sampling) where the runtime's tail is measured without one (hf_generate, hf_static); kv_decoder's tail always includes its log-probs.")
    max_num_batched_tokens: Optional[PositiveInt] = Field(
        None, description="Tokens one engine step may process (vLLM's max_num_batched_tokens, SGLang's chunked_prefill_size; continuous engine): admitted rows are prefilled in steps of at most this many tokens, each one forward with one fixed overhead (and, where the profile has the engine's host keys, one step's host work for the rows in it). Default: one prefill call per admitted row (the simulator's older model).")
    chunked_prefill: bool = Field(
        False, description="With max_num_batched_tokens: an engine step carries the running rows' decode tokens and, in the rest of its budget, chunks of the admitted rows' prefills, so running rows keep decoding while new rows prefill (vLLM V1 always; V0 with enable_chunked_prefill; SGLang's chunked prefill); the chunks' device work beyond the step's weight reads is term prefill_chunk. Without it a prefill step runs whole prompts only, and the running rows wait (vLLM V0's default).")
    prefix_caching: bool = Field(
        False, description="A prompt's samples share its prefill on a replica (continuous engine): a row whose prompt a sample of the same prompt prefilled there before in the step prefills only the prompt's last partial block of 16 tokens (vLLM's prefix caching, on by default in V1 and in verl's rollouts; V0's n samples forked from one prefill; SGLang's radix cache). The KV cache still counts each row's whole prompt.")
    dispatch: Literal["rows", "prompts"] = Field(
        "rows", description="How a step's rollouts are dealt to the generation replicas (continuous engine): `rows`, row i to replica i mod replicas, a prompt's samples spread over replicas (verl's async agent loop sends each sample to the least-loaded server); `prompts`, every sample of a prompt to the same replica (verl's synchronous rollout hands each engine whole prompts with SamplingParams(n)).")
    parallel: GenerationParallel = Field(
        GenerationParallel(), description="Expert parallelism and data-parallel attention of a mixture-of-experts model's engine (vLLM, SGLang), beside placement.tp.rollout. Default: none (experts sliced by tensor parallelism).")
    runtime: Optional[Literal[tuple(GEN_RUNTIMES)]] = Field(
        None, description="Generation runtime whose measured costs price prefill, decode, the per-call overhead and the chunk handoff (`prefill:RUNTIME`/`decode:RUNTIME` and `generation.RUNTIME` of the profile): hf_generate (TRL), hf_static (generate with a static cache and torch.compile), kv_decoder (rlhfsim's own decoder), vllm, vllm_eager (vLLM without CUDA graphs, enforce_eager=True), sglang. Default: hf_generate for the static engine, vllm for the continuous one; a profile without the runtime's costs falls back to its plain prefill/decode (the summary says so).")

    @model_validator(mode="after")
    def _runtime_fits_engine(self):
        sem = GEN_RUNTIMES.get(self.runtime) if self.runtime else None
        if sem not in (None, "any") and sem != self.engine:
            raise ValueError(f"runtime: expected a runtime with {self.engine} batching for engine {self.engine!r} "
                             f"({', '.join(r for r, k in GEN_RUNTIMES.items() if k in (self.engine, 'any'))}), got {self.runtime!r}")
        if self.engine != "continuous" and (self.max_num_batched_tokens is not None or self.chunked_prefill):
            raise ValueError(f"max_num_batched_tokens: expected it (and chunked_prefill) only with engine 'continuous' "
                             f"(an engine's per-step token budget), got engine {self.engine!r}")
        if self.engine != "continuous" and (self.prefix_caching or self.dispatch != "rows"):
            raise ValueError(f"prefix_caching: expected it (and dispatch: prompts) only with engine 'continuous', got "
                             f"engine {self.engine!r}")
        if self.chunked_prefill and self.max_num_batched_tokens is None:
            raise ValueError("chunked_prefill: expected max_num_batched_tokens with it (the step's token budget the "
                             "chunks fill), got none")
        return self

    @property
    def resolved_runtime(self) -> str:
        """The runtime that prices generation: the scenario's, else the engine's default."""
        return self.runtime or DEFAULT_RUNTIME[self.engine]


# --- how the training framework runs a step (verl / OpenRLHF mechanics; everything off by default) -------
class MicroBatch(Frozen):
    """How forward passes and training are cut into calls per data-parallel rank (verl's names). Unset
    fields keep the simulator's older behaviour: forward passes in pieces of ``generation.max_batch``
    rows, training as one padded call per rank per minibatch."""

    log_prob_micro_batch_size_per_gpu: Optional[PositiveInt] = Field(
        None, description="Rows per call of every forward pass (reward, old_log_prob, reference, critic values) on each data-parallel rank (verl: actor_rollout_ref.rollout/ref.log_prob_micro_batch_size_per_gpu, critic.forward_micro_batch_size_per_gpu). Default: generation.max_batch.")
    ppo_micro_batch_size_per_gpu: Optional[PositiveInt] = Field(
        None, description="Rows per forward+backward call in training on each data-parallel rank; a minibatch's rows on a rank run in pieces of this size with gradient accumulation, one optimizer step per minibatch (verl: actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu; OpenRLHF: micro_train_batch_size). Default: all of the rank's rows in one call.")
    use_dynamic_bsz: bool = Field(
        False, description="Form pieces by a token budget instead of a row count: rows are taken in order into a piece while its tokens stay within the budget (a row longer than the budget is a piece of its own); verl: use_dynamic_bsz.")
    ppo_max_token_len_per_gpu: Optional[Tokens] = Field(
        None, description="Token budget of a training piece with use_dynamic_bsz (verl: actor_rollout_ref.actor.ppo_max_token_len_per_gpu). Required with use_dynamic_bsz.")
    log_prob_max_token_len_per_gpu: Optional[Tokens] = Field(
        None, description="Token budget of a forward-pass piece with use_dynamic_bsz (verl: log_prob_max_token_len_per_gpu). Default: ppo_max_token_len_per_gpu.")
    use_remove_padding: bool = Field(
        False, description="Sequence packing (verl: use_remove_padding; OpenRLHF: packing_samples): a piece costs the sum of its rows' real tokens and attention over each row's own length, not every row padded to the piece's longest.")
    ref_log_prob_micro_batch_size_per_gpu: Optional[PositiveInt] = Field(
        None, description="The reference pass's own rows per call (verl: actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu). Default: log_prob_micro_batch_size_per_gpu.")
    critic_forward_micro_batch_size_per_gpu: Optional[PositiveInt] = Field(
        None, description="The critic's values pass's own rows per call (verl: critic.forward_micro_batch_size_per_gpu, by default the critic's ppo_micro_batch_size_per_gpu). Default: log_prob_micro_batch_size_per_gpu.")
    critic_ppo_micro_batch_size_per_gpu: Optional[PositiveInt] = Field(
        None, description="The critic's own rows per training call (verl: critic.ppo_micro_batch_size_per_gpu). Default: ppo_micro_batch_size_per_gpu.")
    critic_ppo_max_token_len_per_gpu: Optional[Tokens] = Field(
        None, description="The critic's own token budget per call with use_dynamic_bsz, for its training and its values pass (verl: critic.ppo_max_token_len_per_gpu, default 32768, and critic.forward_max_token_len_per_gpu, by default the same). Default: ppo_max_token_len_per_gpu (training) and log_prob_max_token_len_per_gpu (values).")
    critic_use_remove_padding: Optional[bool] = Field(
        None, description="The critic's own packing flag (verl: critic.model.use_remove_padding, which verl ~0.3 left False while the actor packed). Default: use_remove_padding.")
    pad_to: Literal["longest", "max_length"] = Field(
        "longest", description="Rows of an unpacked piece are padded to: `longest`, the piece's longest row; `max_length`, the configured workload.max_prompt_tokens + workload.max_response_tokens (verl: prompts left-padded to data.max_prompt_length, responses padded to the rollout's response_length).")


class TrainedOffload(Frozen):
    param: bool = Field(False, description="Parameters live in host memory between phases: loaded onto the device before each phase that uses the model and offloaded after (verl: fsdp_config.param_offload).")
    grad: bool = Field(False, description="Gradients are moved to host memory after each training phase (verl moves them with param_offload; DeepSpeed ZeRO offload).")
    optimizer: bool = Field(False, description="AdamW state (fp32 master weights and moments, 12 bytes per parameter) lives in host memory: loaded before the training phase and offloaded after (verl: fsdp_config.optimizer_offload; OpenRLHF: adam_offload).")


class ReferenceOffload(Frozen):
    param: bool = Field(False, description="The reference model's parameters stay in host memory and stream to the device on every forward call (FSDP CPUOffload; verl: actor_rollout_ref.ref.fsdp_config.param_offload; OpenRLHF: ref_reward_offload).")


class Offload(Frozen):
    """Host-memory offload per model; every move crosses the host link (``host_link_bw`` of the device)."""

    actor: TrainedOffload = TrainedOffload()
    critic: TrainedOffload = TrainedOffload()
    reference: ReferenceOffload = ReferenceOffload()
    megatron_swap: bool = Field(
        False, description="NeMo RL's colocated step with a Megatron policy worker (cost term host_swap): every step the distributed optimizer's state goes to host memory before the weight update and back before training, the actor's parameters to host memory after the update and back before the log-prob passes, and the reference pass swaps the reference's weights (kept in host memory) in through the policy's model and the policy's back (three copies); the gradients are freed, not copied. Per GPU over the host link, the actor's Megatron layout (execution.megatron.actor) setting its weights a GPU. vLLM's own sleep and wake: execution.weight_sync.engine_sleep.")


class WeightSync(Frozen):
    engine_sleep: bool = Field(
        False, description="With reshard on a shared pool: the engine offloads its weights to host memory while training runs and loads them back before the next rollout (vLLM's sleep level 1 and wake_up, verl >= 0.3's free_cache_engine with vLLM >= 0.7), W / rollout TP each way over the host link, priced beside the KV cache's reallocation (part sleep_wake_s).")
    packed: bool = Field(
        False, description="With nccl: as NeMo RL's non-colocated refit runs it (refit_policy_generation, packed_broadcast_producer / _consumer): each tensor made whole on every training rank by Megatron-Bridge's export (the pipeline stage's broadcast, the tensor- and expert-parallel all-gathers, each over its group's link), packed into buckets of 2% of the GPU's memory (at most 5 GiB) broadcast from the training pool's rank 0, and loaded by the engine, with two buffers a side so that gathering, broadcasting and loading run as a pipeline over the buckets (the slowest sets the pace). False: the three one after the other (verl's recipes).")
    kind: Literal["copy", "reshard", "nccl"] = Field(
        "copy", description="`copy`: the trained weights are copied through device memory (shared pool) or broadcast over the link (separate pools: each engine rank its tensor-parallel shard), nothing else; `reshard`: as verl's hybrid engine does it: the training layout's shards are gathered into the engine's tensor-parallel layout (intra-node link), loaded into the engine (a copy through device memory) and, on a shared pool, the engine's KV cache is freed and allocated again; `nccl` (the generation engine on a pool of its own only): as verl's one_step_off and fully_async recipes do it: each tensor gathered whole on the training pool, broadcast whole to every generation rank over NCCL (NVLink where both pools sit in one node, else the inter-node link) and loaded into the engine, serial with both pools.")


class Advantage(Frozen):
    enabled: bool = Field(False, description="Record advantage computation (GAE for PPO, group normalization for GRPO/RLOO) as the phase `adv`, on the driver's CPU between the forward passes and training, over every row padded to workload.max_response_tokens as verl holds them; priced from the profile's adv_* step scalars (rlhfsim.costs.driver).")
    gae_loop: Literal["plain", "masked"] = Field("masked", description="GAE's reverse loop over response positions as the framework's code runs it: `plain`, 5 tensor ops per position (verl <= 0.4); `masked`, 13, with the observation-token masks (verl >= 0.5).")
    rollout_metrics: bool = Field(False, description="The driver also computes the rollout-correction metrics (the rollout's log-probs against the recomputed ones: KL, perplexities, chi-square) on the advantage timer, as verl does when the rollout returns its log-probs (rollout.calculate_log_probs, the default from verl 0.9).")


class RoleParallel(Frozen):
    """Megatron-LM's model parallelism of one trained or forward-only model beside its tensor parallelism
    (``placement.tp``): the role's GPUs are tp x pp x cp x dp (dp the data-parallel replicas; ep is carved out of
    dp x cp, as Megatron does). All 1: no pipeline, context or expert parallelism (the simulator's older step)."""

    pp: PositiveInt = Field(1, le=256, description="Pipeline stages (Megatron: pipeline_model_parallel_size): each GPU of a pipeline holds layers / pp decoder layers; a training minibatch's micro-batches on a pipeline run under 1F1B, the pipeline bubble a cost term (pipeline_bubble), the activations between stages another (pp_p2p).")
    vpp: PositiveInt = Field(1, le=64, description="Virtual stages per pipeline rank (Megatron: virtual_pipeline_model_parallel_size; interleaved 1F1B): the bubble shrinks by this factor, the stage-to-stage messages grow by it. Needs pp > 1 and each stage's layers divisible by vpp (the layers by pp x vpp where the stages are even).")
    cp: PositiveInt = Field(1, le=256, description="Context parallelism (Megatron: context_parallel_size): groups of cp GPUs share every sequence, each holding 1/cp of its tokens, keys and values passed round a ring in attention (cost term cp_comm).")
    ep: PositiveInt = Field(1, le=1024, description="Expert parallelism (Megatron: expert_model_parallel_size; a mixture-of-experts model only): each MoE layer's routed experts spread over ep GPUs, every token sent to its experts' GPUs and back (dispatch and combine all-to-alls, cost term ep_alltoall). ep must divide dp x cp and the model's experts.")
    etp: Optional[PositiveInt] = Field(None, le=256, description="Expert tensor parallelism (Megatron: expert_tensor_parallel_size; NeMo RL's default 1): each routed expert split over etp GPUs, the expert-parallel group then carved out of the stage's tp x cp x dp GPUs (ep x etp must divide them) and spanning ep x etp consecutive GPUs. Unset: tp, as Megatron-core defaults it (ep carved out of dp x cp).")
    first_stage_layers: Optional[PositiveInt] = Field(None, description="Decoder layers on the first pipeline stage (Megatron: num_layers_in_first_pipeline_stage; verl: megatron.override_transformer_config.num_layers_in_first_pipeline_stage): fewer than the others' to make room for the embedding, or to split a layer count pp does not divide (DeepSeek-V3's 61). The stages between the first and last share the rest evenly, as Megatron-core splits them; the slowest stage sets the pipeline's pace and the largest its weights per GPU. Unset (with last_stage_layers unset): layers / pp each.")
    last_stage_layers: Optional[PositiveInt] = Field(None, description="Decoder layers on the last pipeline stage (Megatron: num_layers_in_last_pipeline_stage; verl: megatron.override_transformer_config.num_layers_in_last_pipeline_stage): fewer than the others' to make room for the LM head and the loss. As first_stage_layers.")


class Megatron(Frozen):
    """Megatron-LM parallelism per model (verl's ``strategy: megatron``; ``actor_rollout_ref.actor.megatron.*``). The
    tensor-parallel degree stays ``placement.tp``; the rollout engine and the reward model are not trained with it."""

    actor: RoleParallel = RoleParallel()
    critic: RoleParallel = RoleParallel()
    reference: RoleParallel = RoleParallel()


class Execution(Frozen):
    """The mechanics of a step as verl and OpenRLHF run it. Every field defaults to off, which is the
    simulator's older step (generation, scoring, reference and critic passes, training, a weight copy)."""

    old_log_prob: bool = Field(False, description="The actor recomputes log-probs of every rollout (prompt + response) in a forward pass on its pool after scoring and before the reference pass (verl: compute_log_prob, phase old_log_prob).")
    advantage: Advantage = Advantage()
    micro_batch: MicroBatch = MicroBatch()
    sharding: Literal["none", "fsdp"] = Field(
        "none", description="How the actor, critic and reference parameters are sharded over their pool's data-parallel GPUs: `none`, each rank holds them whole (the gradients all-reduced once per minibatch); `fsdp`, FSDP FULL_SHARD / ZeRO-3 (verl's fsdp and fsdp2 strategies, OpenRLHF's --zero_stage 3): every forward call all-gathers the parameters, every training call gathers them twice and reduce-scatters fp32 gradients (rlhfsim.costs.framework).")
    balance_batch: bool = Field(
        False, description="Rows are spread over each pool's data-parallel ranks so that every rank holds about the same number of tokens (verl's trainer.balance_batch, on by default from verl 0.3: a partition by sequence length, equal row counts), each rank's mini-batches slices of its share; off: rows dealt round-robin (rlhfsim.sim.balance).")
    entropy: bool = Field(
        False, description="Every log-prob call (old_log_prob, reference, actor training) also computes the entropy of every position from its logits (verl's entropy_from_logits), priced as element-wise passes over the vocabulary on GPU profiles.")
    gradient_checkpointing: bool = Field(False, description="Activation recomputation in training: one more forward per training piece, priced as the profile's checkpoint_extra_frac of the piece's train time (verl: enable_gradient_checkpointing).")
    offload: Offload = Offload()
    weight_sync: WeightSync = WeightSync()
    ulysses_sequence_parallel_size: PositiveInt = Field(
        1, description="Ulysses sequence parallelism of the actor, critic and reference (verl: ulysses_sequence_parallel_size): groups of this many GPUs of a pool share every piece, each holding 1/sp of its tokens, with four all-to-alls per layer per pass; data-parallel ranks are pool GPUs / (TP x sp) and token budgets cover a group (x sp). Within one node.")
    megatron: Megatron = Field(
        Megatron(), description="Megatron-LM's pipeline (pp, vpp), context (cp) and expert (ep) parallelism of the actor, critic and reference, beside placement.tp (verl: actor_rollout_ref.actor.megatron.*, critic.megatron.*). All 1 by default: none.")


# --- schedules ------------------------------------------------------------------------------------
# Each schedule's config model lives in rlhfsim.scenario.schedules (its class in rlhfsim/sim/schedules/,
# whose registry is checked against CONFIGS); the union and the variant names are derived from CONFIGS.
Schedule = Annotated[Union[CONFIGS], Field(discriminator="kind")]


class Scenario(Frozen):
    """One RLHF training setup: models, hardware, placement, algorithm, workload, engine, schedule."""

    name: str = Field("scenario", description="Name used in outputs.")
    description: str = Field("", description="Free text.")
    models: Models
    cluster: Cluster
    placement: Placement = Field(Colocated(), description="Where each role runs: `colocated`, `dedicated_reward` (OPPO's 7+1) or explicit `pools`.")
    algorithm: Algorithm = Algorithm()
    workload: Workload
    generation: Generation = Generation()
    execution: Execution = Field(Execution(), description="How the training framework runs the step (verl/OpenRLHF mechanics: old-log-prob pass, advantages, micro-batches, checkpointing, offload, weight resharding); all off by default.")
    schedule: Schedule = SyncSchedule()
    steps: int = Field(10, ge=1, le=100_000, description="Steps to simulate.")
    warmup_steps: int = Field(1, ge=0, le=100_000, description="Leading steps excluded from steady-state statistics.")
    seed: int = Field(0, ge=0, le=2**63 - 1, description="Random seed: same seed, same output.")
    compare: Optional[list[Literal[VARIANTS]]] = Field(
        None, description="Schedule variants `rlhfsim simulate` compares when run without --compare.")
    _base_dir: Path = PrivateAttr(default_factory=Path.cwd)  # where relative paths in the scenario resolve

    @property
    def base_dir(self) -> Path:
        return self._base_dir
