"""Cross-field checks and the resolved view of a scenario (``Setup``): model shapes, the device, pools
with their roles, tensor-parallel degrees, generation replicas, KV-cache capacity, length samplers.

Memory check per GPU of a pool (bytes):

    resident = sum over models on the pool of params x dtype_bytes / tp[role]
             + sum over trained models (actor, critic) of 14 x params / pool_gpus   (bf16 grads + fp32
               master weights and Adam moments, ZeRO-3 sharded over the pool; 12 less with
               execution.offload.ROLE.optimizer, 2 less with .grad: that state lives in host memory)
    resident + one full-length sequence of KV (max_prompt + max_response tokens) / tp  <=  GPU memory

Under Megatron's parallelism (``execution.megatron.ROLE``) a GPU holds 1/ep of each MoE layer's routed experts and a
pipeline stage 1/pp of the weights (the optimizer state stays as above, sharded over the pool).

KV capacity of a generation replica (tokens) = (memory - resident) x tp x kv_cache_fraction /
kv_bytes_per_token(actor).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from rlhfsim.contracts import DEFAULT_STREAMING, SEQUENCE_PARALLEL, STREAMING_ARCHS
from rlhfsim.costs.parallel import stage_layers
from rlhfsim.costs.genparallel import GenLayout, engine_weight_bytes, kv_shards, layout_of
from rlhfsim.costs.stepcosts import OPTIMIZER_STATE_BYTES
from rlhfsim.errors import ScenarioError
from rlhfsim.hardware.catalog import GpuSpec, get_gpu
from rlhfsim.models.catalog import DTYPE_BYTES, ModelShape, load_model
from rlhfsim.scenario.schema import Colocated, CustomPlacement, DedicatedReward, RuleReward, Scenario
from rlhfsim.workload.lengths import Sampler, sampler_for, trace_for
from rlhfsim.words import count

TRAINED = ("actor", "critic")
OPTIMIZER_BYTES_PER_PARAM = 14  # bf16 gradient (2) + fp32 master weight (4) + Adam m, v (4 + 4)


@dataclass(frozen=True)
class PoolSpec:
    """A group of GPUs and the roles that run on them."""

    name: str
    gpus: int
    roles: tuple[str, ...]
    first_gpu: int  # global index of its first GPU (pools are laid out in order)
    spans_nodes: bool


@dataclass
class Setup:
    """Everything the simulator needs, resolved from a Scenario and the catalogs."""

    scenario: Scenario
    gpu: GpuSpec
    shapes: dict[str, ModelShape]
    dtypes: dict[str, str]
    pools: list[PoolSpec]
    role_pool: dict[str, int]
    tp: dict[str, int]
    replicas: int
    kv_capacity_tokens: int
    prompt_sampler: Sampler
    response_sampler: Sampler
    rule_reward: RuleReward | None
    rollouts_per_step: int
    resident_bytes: list[float] = field(default_factory=list)
    trace: list[tuple[int, int]] | None = None  # replayed (prompt_len, response_len), from a `trace` source
    reward_streaming: str = "incremental"  # how chunks reach the reward model (rlhfsim.sim.streaming)
    retokenize: bool = False  # the reward model reads another tokenizer: responses are decoded and re-tokenized
    reward_max_tokens: int | None = None  # a reward call's rows are truncated to this many tokens (None: whole)
    gen_parallel: GenLayout | None = None  # the engine's expert parallelism, data-parallel attention (None: neither)

    def pool_of(self, role: str) -> PoolSpec:
        return self.pools[self.role_pool[role]]

    def head(self, role: str) -> str:
        return role_head(role)


def pools_span_nodes(a: PoolSpec, b: PoolSpec, domain: int) -> bool:
    """Whether the GPUs of pools ``a`` and ``b`` together sit in more than one NVLink domain of ``domain`` GPUs (the
    node, or an NVL72 rack: ``GpuSpec.link_domain``; pools are laid out in order from ``first_gpu``): a transfer
    between them then crosses the inter-node link."""
    nodes = {g // domain for p in (a, b) for g in (p.first_gpu, p.first_gpu + p.gpus - 1)}
    return len(nodes) > 1


def role_head(role: str) -> str:
    """Actor, reference and the generation engine carry an LM head; critic and reward a scalar head."""
    return "lm" if role in ("actor", "reference", "rollout") else "value"


def _probe_layout(sc: Scenario, tp: int) -> GenLayout:
    """``generation.parallel``'s layout for the memory check (its links are not read there)."""
    par = sc.generation.parallel
    return GenLayout(tp, par.ep, par.dp_attention, par.redundant_experts, par.fp8_dispatch, par.two_batch_overlap, 1,
                     False)


def _check_gen_parallel(sc: Scenario, shape: ModelShape, pool: "PoolSpec", tp: int, gpu: GpuSpec) -> None:
    """``generation.parallel`` against the rollout pool, ``placement.tp.rollout`` and the model (one-line errors)."""
    par, where = sc.generation.parallel, "generation.parallel"
    if par.ep == 1 and not par.dp_attention and par.redundant_experts == 0 and not par.fp8_dispatch \
            and not par.two_batch_overlap:
        return
    if par.ep == 1:
        raise ScenarioError(f"{where}.ep", (f"expected ep > 1 with {where}'s other fields (dp_attention, "
                                            f"redundant_experts, fp8_dispatch, two_batch_overlap act on an "
                                            f"expert-parallel engine), got 1"))
    if not shape.is_moe:
        raise ScenarioError(f"{where}.ep", f"expected 1 for the dense model {shape.name} (experts only), got {par.ep}")
    if gpu.kind == "cpu":
        raise ScenarioError(f"{where}.ep", f"expected 1 on a CPU device (an engine over GPUs), got {par.ep}")
    if sc.generation.engine != "continuous":
        raise ScenarioError(f"{where}.ep", (f"expected 1 with engine {sc.generation.engine!r} (expert parallelism is "
                                            f"vLLM's and SGLang's, engine 'continuous'), got {par.ep}"))
    if par.dp_attention:
        if par.ep % tp:
            raise ScenarioError(f"{where}.ep", (f"expected a multiple of placement.tp.rollout ({tp}) with dp_attention "
                                                f"(ep / tp attention ranks), got {par.ep}"))
    elif par.ep != tp:
        raise ScenarioError(f"{where}.ep", (f"expected placement.tp.rollout ({tp}) without dp_attention (the experts "
                                            f"spread over the tensor-parallel group; set dp_attention for ep / tp "
                                            f"attention ranks), got {par.ep}"))
    if pool.gpus % par.ep:
        raise ScenarioError(f"{where}.ep", (f"expected ep to divide the {count(pool.gpus, 'GPU')} of pool "
                                            f"{pool.name!r} (rollout), got {par.ep}"))
    slots = shape.num_experts + par.redundant_experts
    if slots % par.ep:
        raise ScenarioError(f"{where}.ep", (f"expected ep to divide {shape.name}'s {shape.num_experts} experts"
                                            f"{f' + {par.redundant_experts} redundant' if par.redundant_experts else ''}"
                                            f" ({slots}), got {par.ep}"))
    if sc.generation.replicas is not None and sc.generation.replicas * tp != pool.gpus:
        raise ScenarioError("generation.replicas", (f"expected {pool.gpus // tp} (every GPU of the rollout pool in an "
                                                    f"engine of ep {par.ep}) or unset, got {sc.generation.replicas}"))


def _check_megatron(sc: Scenario, role: str, shape: ModelShape, pool: "PoolSpec", tp: int) -> None:
    """``execution.megatron.ROLE``'s degrees against the role's pool, the model and Ulysses (one-line errors)."""
    lay = getattr(sc.execution.megatron, role)
    where = f"execution.megatron.{role}"
    if (lay.pp, lay.vpp, lay.cp, lay.ep) == (1, 1, 1, 1) and lay.first_stage_layers is lay.last_stage_layers is None:
        return
    if sc.execution.ulysses_sequence_parallel_size > 1:
        raise ScenarioError("execution.ulysses_sequence_parallel_size", (
            f"expected 1 with Megatron's parallelism ({where}: pp {lay.pp}, cp {lay.cp}, ep {lay.ep}; Megatron's "
            f"context parallelism is cp), got {sc.execution.ulysses_sequence_parallel_size}"))
    if sc.execution.sharding == "fsdp":
        raise ScenarioError("execution.sharding", (
            f"expected none with Megatron's parallelism ({where}: pp {lay.pp}, cp {lay.cp}, ep {lay.ep}; verl's "
            f"megatron strategy shards with tensor and pipeline parallelism, not FSDP), got 'fsdp'"))
    g = tp * lay.pp * lay.cp
    if pool.gpus % g:
        raise ScenarioError(where, (f"expected tp x pp x cp ({tp} x {lay.pp} x {lay.cp} = {g}) to divide the "
                                    f"{count(pool.gpus, 'GPU')} of pool {pool.name!r}, got {g}"))
    if lay.vpp > 1 and lay.pp == 1:
        raise ScenarioError(f"{where}.vpp", f"expected pp > 1 with virtual stages (interleaved 1F1B), got vpp {lay.vpp} with pp 1")
    first, last = lay.first_stage_layers, lay.last_stage_layers
    if first is not None or last is not None:
        _check_uneven(where, shape, lay.pp, lay.vpp, first, last)
    elif shape.layers % (lay.pp * lay.vpp):
        raise ScenarioError(f"{where}.pp", (f"expected pp x vpp ({lay.pp} x {lay.vpp}) to divide {shape.name}'s "
                                            f"{shape.layers} layers (or first_stage_layers / last_stage_layers set: "
                                            f"Megatron's uneven pipeline), got {lay.pp * lay.vpp}"))
    if lay.ep > 1:
        if not shape.is_moe:
            raise ScenarioError(f"{where}.ep", f"expected 1 for the dense model {shape.name} (experts only), got {lay.ep}")
        dp_cp = pool.gpus // g * lay.cp
        if lay.etp is None and dp_cp % lay.ep:
            raise ScenarioError(f"{where}.ep", (f"expected ep to divide dp x cp ({dp_cp}: {count(pool.gpus, 'GPU')} of "
                                                f"pool {pool.name!r} over tp x pp {tp * lay.pp}; or etp set, Megatron's "
                                                f"expert_tensor_parallel_size), got {lay.ep}"))
        stage = pool.gpus // lay.pp
        if lay.etp is not None and stage % (lay.ep * lay.etp):
            raise ScenarioError(f"{where}.ep", (f"expected ep x etp ({lay.ep} x {lay.etp}) to divide a stage's tp x cp x dp "
                                                f"({stage}: {count(pool.gpus, 'GPU')} of pool {pool.name!r} over pp "
                                                f"{lay.pp}), got {lay.ep * lay.etp}"))
        if shape.num_experts % lay.ep:
            raise ScenarioError(f"{where}.ep", (f"expected ep to divide {shape.name}'s {shape.num_experts} routed "
                                                f"experts, got {lay.ep}"))


def _check_uneven(where: str, shape: ModelShape, pp: int, vpp: int, first: int | None, last: int | None) -> None:
    """An uneven pipeline's first and last stages against the model's layers, as Megatron-core's TransformerConfig
    checks them (one-line errors naming the field)."""
    field = f"{where}.{'first_stage_layers' if first is not None else 'last_stage_layers'}"
    if pp < 2:
        raise ScenarioError(field, f"expected pp >= 2 with a first or last stage's layers set, got pp {pp}")
    for name, n in (("first_stage_layers", first), ("last_stage_layers", last)):
        if n is not None and n % vpp:
            raise ScenarioError(f"{where}.{name}", f"expected a multiple of vpp ({vpp}: each virtual stage whole), got {n}")
    rest = shape.layers - (first or 0) - (last or 0)
    middle = pp - (first is not None) - (last is not None)
    if rest < 0 or bool(rest) != bool(middle) or (middle and (rest % middle or rest // middle % vpp)):
        given = " + ".join(f"{n} ({k})" for k, n in (("first", first), ("last", last)) if n is not None)
        need = (f"the {max(rest, 0)} layers left to split evenly over the {middle} middle stages"
                + (f" in multiples of vpp {vpp}" if vpp > 1 else "") if middle else f"all {shape.layers} layers")
        raise ScenarioError(field, f"expected stage layers that add up to {shape.name}'s {shape.layers} ({need}), got {given} over pp {pp}")


def _gb(x: float) -> str:
    return f"{x / 2**30:.1f} GiB"  # memory in GiB, as the catalog and `rlhfsim gpus` give it


def _expand_pools(sc: Scenario, roles: list[str], total: int) -> list[tuple[str, int, list[str], str]]:
    """(name, gpus, roles, yaml path) per pool."""
    pl = sc.placement
    if isinstance(pl, Colocated):
        return [("all", total, roles + ["rollout"], "placement")]
    if isinstance(pl, DedicatedReward):
        if "reward" not in roles:
            raise ScenarioError("placement.kind", "expected a reward model for dedicated_reward placement, got models.reward.kind: rule (use colocated or pools)")
        if pl.reward_gpus >= total:
            raise ScenarioError("placement.reward_gpus", f"expected fewer than the cluster's {count(total, 'GPU')}, got {pl.reward_gpus}")
        rest = [r for r in roles if r != "reward"] + ["rollout"]
        return [("actor", total - pl.reward_gpus, rest, "placement"), ("reward", pl.reward_gpus, ["reward"], "placement.reward_gpus")]
    assert isinstance(pl, CustomPlacement)
    return [(p.name, p.gpus, list(p.roles), f"placement.pools[{i}]") for i, p in enumerate(pl.pools)]


def _check_execution(sc: Scenario, shapes: dict) -> None:
    """``execution`` settings that cannot apply to this scenario, each named by its YAML path."""
    ex = sc.execution
    m = ex.micro_batch
    if m.use_dynamic_bsz and m.ppo_max_token_len_per_gpu is None:
        raise ScenarioError("execution.micro_batch.ppo_max_token_len_per_gpu",
                            "expected a token budget with use_dynamic_bsz: true, got none")
    for role, fields in (("critic", ("param", "grad", "optimizer")), ("reference", ("param",))):
        cfg = getattr(ex.offload, role)
        for f in fields:
            if getattr(cfg, f) and role not in shapes:
                raise ScenarioError(f"execution.offload.{role}.{f}", f"expected false without a {role} model (models.{role}), got true")


# Encoder families without absolute position embeddings: DeBERTa-v2/v3 checkpoints set
# ``position_biased_input: false`` (microsoft/deberta-v3-large config.json; calibrate/measuring/models.py builds them
# so), and transformers' DebertaV2Embeddings then has no position table: relative attention over log
# buckets (``position_buckets``) runs any length (measured here: a DeBERTa-v3-configured model with
# max_position_embeddings 512 scored a 1,024-token row; an ELECTRA of the same size raised on it).
RELATIVE_POSITION_ENCODERS = ("deberta-v2",)


def reward_position_limit(rm: ModelShape) -> int | None:
    """The tokens a reward model's scoring call can take per row: None without a limit (decoders are
    checked against ``max_positions`` instead; relative-position encoders run any length), else the
    encoder's absolute position table (``max_positions``), which the frameworks truncate each row to:
    verl's RewardModelWorker tokenizes with ``max_length`` (the reward model's own) and
    ``truncation="right"`` (verl/workers/fsdp_workers.py, ``_switch_chat_template``), as a Hugging Face
    tokenizer does with ``truncation=True``."""
    if rm.arch != "encoder" or rm.hf_model_type in RELATIVE_POSITION_ENCODERS:
        return None
    return rm.max_positions


def _check_pairing(sc: Scenario, shapes: dict) -> tuple[str, bool, int | None]:
    """(the reward model's streaming strategy, whether it re-tokenizes, the tokens a scoring row is
    truncated to or None), refusing pairs that cannot run:

    * a reward model of another tokenizer than the actor's (``ModelShape.tokenizer_id``) gets the
      responses decoded and tokenized again (``retokenize``);
    * ``models.reward.streaming`` must be one the reward architecture can run (an encoder has no causal
      cache to extend);
    * a decoder reward model's positions must hold the longest prompt + response (the re-tokenized text
      keeps the actor's token count: docs/cost-model.md); an encoder with absolute positions (ELECTRA,
      RoBERTa, BERT) scores rows truncated to its positions, as the frameworks run it
      (``reward_position_limit``); DeBERTa-v3's relative positions take any length."""
    actor = shapes["actor"]
    if "reward" not in shapes:
        return "incremental", False, None
    rm = shapes["reward"]
    retokenize = rm.tokenizer_id != actor.tokenizer_id
    name = sc.models.reward.streaming or DEFAULT_STREAMING[rm.arch]
    if rm.arch not in STREAMING_ARCHS[name]:
        ok = [n for n, archs in STREAMING_ARCHS.items() if rm.arch in archs]
        raise ScenarioError("models.reward.streaming", (
            f"expected {' or '.join(ok)} for encoder reward model {rm.name!r} (bidirectional attention: a new "
            f"chunk changes every earlier token, so there is no causal KV cache to prefill onto), got {name}"))
    w = sc.workload
    longest = w.max_prompt_tokens + w.max_response_tokens
    if rm.arch == "encoder":
        limit = reward_position_limit(rm)
        return name, retokenize, (limit if limit is not None and longest > limit else None)
    if longest > rm.max_positions:
        raise ScenarioError("models.reward.model", (
            f"expected a reward model whose {rm.max_positions} positions hold the longest prompt + response "
            f"(workload.max_prompt_tokens + max_response_tokens = {longest}), got {rm.name!r}; lower the caps "
            f"or pick a reward model with more positions"))
    return name, retokenize, None


def _model(ref, role: str, base) -> ModelShape:
    """``models.ROLE``'s shape, with the scenario's expert imbalance where it sets one (a mixture-of-experts model's)."""
    shape = load_model(ref.model, f"models.{role}.model", base)
    if ref.expert_imbalance is None:
        return shape
    if not shape.is_moe:
        raise ScenarioError(f"models.{role}.expert_imbalance", f"expected a mixture-of-experts model, got dense {shape.name!r} (remove expert_imbalance)")
    return replace(shape, expert_imbalance=float(ref.expert_imbalance))


def build_setup(sc: Scenario) -> Setup:
    base = sc.base_dir
    gpu = get_gpu(sc.cluster.gpu)
    m = sc.models
    shapes: dict[str, ModelShape] = {"actor": _model(m.actor, "actor", base)}
    dtypes = {"actor": m.actor.dtype}
    for role in ("critic", "reference"):
        ref = getattr(m, role)
        if ref is not None:
            shapes[role] = _model(ref, role, base)
            dtypes[role] = ref.dtype
    rule = m.reward if isinstance(m.reward, RuleReward) else None
    if rule is None:
        shapes["reward"] = _model(m.reward, "reward", base)
        dtypes["reward"] = m.reward.dtype
    shapes["rollout"], dtypes["rollout"] = shapes["actor"], dtypes["actor"]
    for role, dt in dtypes.items():
        if role != "rollout" and dt not in gpu.peak_flops:
            raise ScenarioError(f"models.{role}.dtype", f"expected a dtype {gpu.name} has tensor cores for "
                                f"({', '.join(gpu.peak_flops)}), got {dt!r}")
    if shapes["actor"].arch != "decoder":
        raise ScenarioError("models.actor.model", f"expected a decoder (causal LM) actor, got encoder {shapes['actor'].name!r}")
    for role in ("critic", "reference"):
        if role in shapes and shapes[role].arch != "decoder":
            raise ScenarioError(f"models.{role}.model", f"expected a decoder model, got encoder {shapes[role].name!r}")
    if sc.algorithm.kind in ("grpo", "rloo") and "critic" in shapes:
        raise ScenarioError("models.critic", f"expected no critic with algorithm.kind {sc.algorithm.kind} (group-relative advantages: GRPO's group-normalized, RLOO's leave-one-out baseline), got a critic")

    _check_execution(sc, shapes)

    roles = [r for r in ("actor", "critic", "reference", "reward") if r in shapes]
    total = sc.cluster.nodes * sc.cluster.gpus_per_node
    raw_pools = _expand_pools(sc, roles, total)
    pools: list[PoolSpec] = []
    role_pool: dict[str, int] = {}
    used = 0
    # a pool "spans nodes" where it spans NVLink domains: an NVL72 rack's trays of 4 share one NVLink fabric
    domain = gpu.link_domain(sc.cluster.gpus_per_node)
    for i, (name, n, proles, path) in enumerate(raw_pools):
        used += n
        if used > total:
            raise ScenarioError(f"{path}.gpus", f"{count(used, 'GPU')} placed but the cluster has {total}")
        for j, r in enumerate(proles):
            if r != "rollout" and r not in shapes:
                raise ScenarioError(f"{path}.roles[{j}]", f"expected a role with a model in `models`, got {r!r}" + (" (the reward is a rule)" if r == "reward" else ""))
            if r in role_pool:
                raise ScenarioError(f"{path}.roles[{j}]", f"expected each role on one pool, got {r!r} again (also on pool {pools[role_pool[r]].name!r})")
            role_pool[r] = i
        first = used - n
        spans = first // domain != (used - 1) // domain
        pools.append(PoolSpec(name, n, tuple(proles), first, spans))
    for r in roles:
        if r not in role_pool:
            raise ScenarioError("placement", f"expected every role placed on a pool, got no pool for {r!r}")
    role_pool.setdefault("rollout", role_pool["actor"])
    if sc.execution.weight_sync.kind == "nccl" and role_pool["rollout"] == role_pool["actor"]:
        raise ScenarioError("execution.weight_sync.kind", "expected copy or reshard where generation shares the actor's "
                            "pool (nccl broadcasts to a generation pool of its own), got nccl")
    if sc.execution.weight_sync.packed and sc.execution.weight_sync.kind != "nccl":
        raise ScenarioError("execution.weight_sync.packed", "expected kind nccl with packed (the bucketed broadcast to "
                            f"a generation pool of its own), got kind {sc.execution.weight_sync.kind}")
    if sc.execution.offload.megatron_swap:   # NeMo RL's colocated step with a Megatron worker (rlhfsim.costs.hostswap)
        if role_pool["rollout"] != role_pool["actor"]:
            raise ScenarioError("execution.offload.megatron_swap", "expected generation on the actor's pool (NeMo RL "
                                "swaps the Megatron worker's state out for a colocated engine only), got a pool of its own")
        if sc.execution.sharding != "none":
            raise ScenarioError("execution.offload.megatron_swap", f"expected execution.sharding none (a Megatron "
                                f"worker), got {sc.execution.sharding}")

    tp = {r: getattr(sc.placement.tp, r) for r in ("actor", "critic", "reference", "reward")}
    tp["rollout"] = sc.placement.tp.rollout or tp["actor"]
    for r, t in tp.items():
        if r not in role_pool:
            continue
        pool = pools[role_pool[r]]
        if t > pool.gpus or pool.gpus % t:
            raise ScenarioError(f"placement.tp.{r}", f"expected a TP degree dividing the {count(pool.gpus, 'GPU')} of pool {pool.name!r}, got {t}")
        if t > domain and r == "rollout":
            # the generation engine's TP may span whole NVLink domains (vLLM across nodes; cost term tp_inter_node)
            if t % domain or pool.first_gpu % domain:
                raise ScenarioError(f"placement.tp.{r}", (
                    f"expected TP within one NVLink domain (<= {domain}) or whole domains (a multiple of {domain}, on a "
                    f"pool that starts at a domain's first GPU), got {t}"))
        elif t > domain:
            raise ScenarioError(f"placement.tp.{r}", f"expected TP within one NVLink domain (the node, or an NVL72 rack; <= {domain}), got {t}")
    sp = sc.execution.ulysses_sequence_parallel_size
    for r in SEQUENCE_PARALLEL:
        if sp > 1 and r in role_pool:
            pool, g = pools[role_pool[r]], tp[r] * sp
            if pool.gpus % g or g > domain:
                raise ScenarioError("execution.ulysses_sequence_parallel_size", (
                    f"expected TP x sp ({tp[r]} x {sp}) to divide the {count(pool.gpus, 'GPU')} of pool {pool.name!r} "
                    f"({r}) within one NVLink domain of {domain}, got {sp}"))

    for r in SEQUENCE_PARALLEL:
        if r in role_pool:
            _check_megatron(sc, r, shapes[r], pools[role_pool[r]], tp[r])
    _check_gen_parallel(sc, shapes["actor"], pools[role_pool["rollout"]], tp["rollout"], gpu)
    gen_par = sc.generation.parallel
    gen_ep = gen_par.ep > 1 or gen_par.dp_attention

    # Memory: weights of every model on the pool, optimizer state of trained ones, one sequence of KV.
    w = sc.workload
    resident: list[float] = []
    for i, pool in enumerate(pools):
        total_b = 0.0
        worst_role = None
        for r in pool.roles:
            if r == "rollout" and role_pool["actor"] == i:
                continue  # generation uses the actor's weights in place (TRL / hybrid engine)
            shape = shapes[r]
            b = shape.params(role_head(r)) * DTYPE_BYTES[dtypes[r]] / tp[r]
            if r == "rollout" and gen_ep:   # an expert-parallel engine: 1/t of the dense weights, (E + R) / ep experts
                b = engine_weight_bytes(shape, DTYPE_BYTES[dtypes[r]], _probe_layout(sc, tp[r]))
            if r in SEQUENCE_PARALLEL:   # Megatron: a GPU holds 1/ep of the routed experts, a stage 1/pp of the layers
                lay = getattr(sc.execution.megatron, r)
                if lay.ep > 1 and shape.is_moe:
                    routed = shape.routed_params
                    b -= routed * DTYPE_BYTES[dtypes[r]] / tp[r] * (1 - 1 / lay.ep)
                    if lay.etp is not None:   # the routed experts split over etp GPUs, not tp
                        b += routed * DTYPE_BYTES[dtypes[r]] / lay.ep * (1 / lay.etp - 1 / tp[r])
                if lay.pp > 1 and (lay.first_stage_layers is not None or lay.last_stage_layers is not None):
                    # an uneven pipeline: the largest stage's share (parallel.stage_layers)
                    b *= max(stage_layers(shape.layers, lay.pp, lay.first_stage_layers, lay.last_stage_layers)) / shape.layers
                elif lay.pp > 1:
                    b /= lay.pp
            if r in TRAINED:
                off = getattr(sc.execution.offload, r)  # offloaded state lives in host memory
                per_param = OPTIMIZER_BYTES_PER_PARAM - (OPTIMIZER_STATE_BYTES if off.optimizer else 0) - (2 if off.grad else 0)
                b += per_param * shape.params(role_head(r)) / pool.gpus
            total_b += b
            worst_role = worst_role or r
        resident.append(total_b)
        kv_min = 0.0
        if role_pool["rollout"] == i:
            kv_min = shapes["actor"].kv_bytes_per_token(dtypes["actor"]) * (w.max_prompt_tokens + w.max_response_tokens) / (
                kv_shards(shapes["actor"], tp["rollout"]) if gen_ep else tp["rollout"])
        if total_b + kv_min > gpu.mem_bytes:
            role = max((r for r in pool.roles if r in shapes), key=lambda r: shapes[r].params() / tp[r])
            raise ScenarioError(f"placement.tp.{role}", (
                f"models on pool {pool.name!r} need {_gb(total_b)} per GPU (weights at their TP degrees"
                f"{', optimizer state' if any(r in TRAINED for r in pool.roles) else ''}) plus {_gb(kv_min)} KV "
                f"for one {w.max_prompt_tokens + w.max_response_tokens}-token sequence, but a {gpu.name} has {_gb(gpu.mem_bytes)}; "
                f"raise the TP degree or use more GPUs"))

    rp = pools[role_pool["rollout"]]
    replicas = sc.generation.replicas or max(rp.gpus // tp["rollout"], 1)
    if replicas * tp["rollout"] > rp.gpus:
        raise ScenarioError("generation.replicas", f"expected at most {rp.gpus // tp['rollout']} replicas on {count(rp.gpus, 'GPU')} at TP {tp['rollout']}, got {replicas}")
    # a replica's cache over its tp GPUs; under expert parallelism split as the engine splits it (MLA's whole on each)
    shards = kv_shards(shapes["actor"], tp["rollout"]) if gen_ep else tp["rollout"]
    free = (gpu.mem_bytes - resident[role_pool["rollout"]]) * shards * sc.generation.kv_cache_fraction
    kv_cap = int(free // shapes["actor"].kv_bytes_per_token(dtypes["actor"]))

    rollouts = sc.workload.prompts_per_step * sc.algorithm.group_size
    if sc.algorithm.minibatch_size > rollouts:
        raise ScenarioError("algorithm.minibatch_size", f"expected at most the {rollouts} rollouts per step, got {sc.algorithm.minibatch_size}")
    streaming, retokenize, reward_max_tokens = _check_pairing(sc, shapes)
    sc.schedule.check(sc)
    if sc.warmup_steps >= sc.steps:
        raise ScenarioError("warmup_steps", f"expected fewer warm-up steps than steps ({sc.steps}), got {sc.warmup_steps}")

    setup = Setup(
        scenario=sc, gpu=gpu, shapes=shapes, dtypes=dtypes, pools=pools, role_pool=role_pool, tp=tp,
        replicas=replicas, kv_capacity_tokens=kv_cap,
        prompt_sampler=sampler_for(w.prompt_length, w.max_prompt_tokens, base, "workload.prompt_length"),
        response_sampler=sampler_for(w.response_length, w.max_response_tokens, base, "workload.response_length"),
        rule_reward=rule, rollouts_per_step=rollouts, resident_bytes=resident,
        trace=trace_for(w, sc.algorithm.group_size, base), reward_streaming=streaming, retokenize=retokenize,
        reward_max_tokens=reward_max_tokens,
    )
    setup.gen_parallel = layout_of(setup)
    return setup
