"""How the training framework runs a step's passes (the scenario's ``execution`` block): how a role's
rows are cut into calls, Ulysses groups, offload traffic, and which profile step scalars a scenario uses.
Pure functions of the Setup (and the CostModel for seconds); the processes live in ``stages``.
Equations: docs/cost-model.md, "A step as verl and OpenRLHF run it"."""

from __future__ import annotations

from rlhfsim.contracts import SEQUENCE_PARALLEL
from rlhfsim.costs import parallel
from rlhfsim.costs.stepcosts import OPTIMIZER_STATE_BYTES
from rlhfsim.models.catalog import DTYPE_BYTES


def sp_of(s, role: str) -> int:
    """Ulysses group size of ``role`` (1 for the reward model and the generation engine)."""
    return s.scenario.execution.ulysses_sequence_parallel_size if role in SEQUENCE_PARALLEL else 1


def data_ranks(s, role: str) -> tuple:
    """(tp, dp, sp, ranks, lay) of ``role`` on its pool: its TP degree, its data-parallel replicas (pool GPUs / tp), its
    Ulysses group, the ranks that take different rows (a Ulysses group shares them) and its Megatron layout (None:
    none); under Megatron's layout a pipeline of tp x pp x cp GPUs is one rank and one replica (``Layout.dp``). One
    rule for the simulator's passes (``stages``) and the planner's fast path (``rlhfsim.plan.fastpath``)."""
    tp = s.tp[role]
    sp = sp_of(s, role)
    lay = parallel.layout_of(s, role)
    if lay is not None:
        return tp, lay.dp, sp, lay.dp, lay
    dp = max(s.pool_of(role).gpus // tp, 1)
    return tp, dp, sp, max(dp // sp, 1), None


def framework_calls(s) -> bool:
    """Are calls cut by ``execution.micro_batch`` (then each pays the profile's per-piece host time)?"""
    m = s.scenario.execution.micro_batch
    return (m.log_prob_micro_batch_size_per_gpu is not None or m.ppo_micro_batch_size_per_gpu is not None
            or m.use_dynamic_bsz or m.use_remove_padding or bool(m.critic_use_remove_padding)
            or any(v is not None for v in (m.ref_log_prob_micro_batch_size_per_gpu, m.critic_forward_micro_batch_size_per_gpu,
                                           m.critic_ppo_micro_batch_size_per_gpu)))


def balanced(s) -> bool:
    """Are rows balanced over data-parallel ranks by tokens (``execution.balance_batch``: verl's balance_batch,
    ``rlhfsim.sim.balance``) rather than dealt round-robin?"""
    return s.scenario.execution.balance_batch


def packed_of(s, role: str) -> bool:
    """Does ``role`` pack its rows (the critic's own flag where the scenario sets one)?"""
    m = s.scenario.execution.micro_batch
    if role == "critic" and m.critic_use_remove_padding is not None:
        return m.critic_use_remove_padding
    return m.use_remove_padding


def pad_length(s) -> int | None:
    """The length every unpacked row is padded to (``micro_batch.pad_to: max_length``), or None: each
    piece's longest row."""
    s_ = s.scenario
    if s_.execution.micro_batch.pad_to != "max_length":
        return None
    return s_.workload.max_prompt_tokens + s_.workload.max_response_tokens


def fsdp_shards(s, role: str) -> int:
    """GPUs ``role``'s parameters are sharded over by FSDP (``execution.sharding: fsdp``): its pool's GPUs
    over its tensor-parallel degree; 0 (no FSDP: no per-call collectives or hooks) otherwise or for the reward
    model."""
    if s.scenario.execution.sharding != "fsdp" or role not in ("actor", "critic", "reference"):
        return 0
    return max(s.pool_of(role).gpus // s.tp[role], 1)


def forward_cuts(s, sp: int = 1, role: str = "actor") -> tuple[int, int | None, bool]:
    """(rows per call, token budget or None, packed) of a forward pass; a Ulysses group's token budget
    is sp times the per-GPU one (verl multiplies it so)."""
    m = s.scenario.execution.micro_batch
    own = {"critic": m.critic_forward_micro_batch_size_per_gpu, "reference": m.ref_log_prob_micro_batch_size_per_gpu}
    size = own.get(role) or m.log_prob_micro_batch_size_per_gpu or s.scenario.generation.max_batch
    budget = (m.log_prob_max_token_len_per_gpu or m.ppo_max_token_len_per_gpu) if m.use_dynamic_bsz else None
    if budget is not None and role == "critic" and m.critic_ppo_max_token_len_per_gpu:
        budget = m.critic_ppo_max_token_len_per_gpu
    return size, budget * sp if budget is not None else None, packed_of(s, role)


def train_cuts(s, sp: int = 1, role: str = "actor") -> tuple[int | None, int | None, bool]:
    """(rows per call or None for one call, token budget or None, packed) of training on one rank."""
    m = s.scenario.execution.micro_batch
    budget = m.ppo_max_token_len_per_gpu * sp if m.use_dynamic_bsz else None
    if budget is not None and role == "critic" and m.critic_ppo_max_token_len_per_gpu:
        budget = m.critic_ppo_max_token_len_per_gpu * sp
    size = m.critic_ppo_micro_batch_size_per_gpu if role == "critic" and m.critic_ppo_micro_batch_size_per_gpu else \
        m.ppo_micro_batch_size_per_gpu
    return size, budget, packed_of(s, role)


def offload_s(sim, role: str, phase: str, calls: int = 1) -> float:
    """Host-link seconds per GPU that offload adds to a phase of ``role`` (``execution.offload``);
    ZeRO-3/FSDP shards every model over its pool's GPUs n, W = params x dtype bytes:

    * trained model with ``param``: loaded before the phase and offloaded after, 2 W / n, in its forward
      pass (old_log_prob, critic values), its training and (actor) the weight sync;
    * ``grad`` (training): the gradients offloaded, W / n; ``optimizer`` (training): AdamW state
      loaded and offloaded, 2 x 12 P / n;
    * reference ``param``: streamed in on every forward call (FSDP CPUOffload), W / n per call."""
    s = sim.setup
    off = s.scenario.execution.offload
    if role not in ("actor", "critic", "reference"):
        return 0.0
    cfg = getattr(off, role)
    pool = s.pool_of(role)
    params = s.shapes[role].params(s.head(role))
    w = params * DTYPE_BYTES[s.dtypes[role]] / pool.gpus
    n_bytes = 0.0
    if role == "reference":
        n_bytes = w * calls if cfg.param and phase == "forward" else 0.0
    else:
        n_bytes = 2 * w if cfg.param else 0.0
        if phase == "train":
            n_bytes += (w if cfg.grad else 0.0) + (2 * OPTIMIZER_STATE_BYTES * params / pool.gpus if cfg.optimizer else 0.0)
    return sim.cost.host_copy_s(n_bytes)


PIECE_SCALARS = ("microbatch_forward_s", "microbatch_train_s")


def step_scalars_used(s, measured: tuple[str, ...] = ()) -> tuple[str, ...]:
    """The profile's step scalars (``rlhfsim.costs.stepcosts``) that price this scenario's step. Every
    forward and training call pays the per-piece scalars (``PIECE_SCALARS``); they are listed when the
    profile measured them (``measured``: the scalars with a profile value) or when ``execution.micro_batch``
    cuts the calls (then a default of 0 is an assumption worth flagging)."""
    ex = s.scenario.execution
    cut = framework_calls(s)
    used = [k for k in PIECE_SCALARS if cut or k in measured]
    if ex.gradient_checkpointing:
        used.append("checkpoint_extra_frac")
    off = ex.offload
    if (any(getattr(getattr(off, r), f) for r in ("actor", "critic") for f in ("param", "grad", "optimizer"))
            or off.reference.param or off.megatron_swap):
        used.append("host_copy_eff")
    if ex.weight_sync.kind in ("reshard", "nccl"):
        used.append("reshard_eff")
        if s.pool_of("actor") is s.pool_of("rollout"):
            used += ["kv_realloc_s", "kv_realloc_s_per_gib"]
    if ex.advantage.enabled:
        used += ["adv_per_op_s", "adv_per_strided_s"] if "critic" in s.shapes else ["adv_per_row_s"]
        used.append("adv_per_element_s")
    if s.retokenize:
        used += ["retokenize_s", "retokenize_per_token_s"]
    return tuple(used)
