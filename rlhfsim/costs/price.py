"""The price of one call as the simulator charges it: one home for the composition of ``CostModel``'s
methods into a forward piece, a training piece, an optimizer step, a scorer call and the generation
runtime's calls, so that the simulator (``rlhfsim.sim.stages``) and the validation's per-call tables
(``calibrate.validation.compare``: each call the executor timed inside a real step priced at its own shape)
read one formula and cannot drift apart.

A framework call is one micro-batch (piece) of one data-parallel rank (``rlhfsim.costs.framework``)::

    forward piece   = framework_call(forward, role's head, every position's log-probs, the role's runtime).total_s
                      + microbatch_forward_s                     (the framework's host time per piece)
    training piece  = framework_call(training, log-probs with an LM head, checkpointing x (1 + checkpoint_extra_frac)).total_s
                      + microbatch_train_s
    optimizer step  = optimizer(...)         once per minibatch (no gradient all-reduce under FSDP: every
                      call reduce-scattered its gradients already)
    scorer call     = the reward streaming strategy's price (+ re-tokenizing its tokens for a reward model
                      of another tokenizer: host time)

A generation runtime's calls (tp 1, no co-running scoring; ``rlhfsim.sim.engines.static`` composes the same
terms event by event)::

    prefill         = forward(n_tokens, n_seqs, LM head, the runtime's prefill fit and sampling tail)
    decode steps    = decoder(...).price(batch, kv0, k)                       (closed form over k steps)
    generate() call = call_overhead_s [+ pad_prefill_s] + prefill(b x w, b) + decode steps(b, b (w + 1), k - 1)
                      [+ (k - 1) pad_step_s(b)]                                  (first call of a batch)
                    = handoff_s(b) + decode steps(b, b w, k) [+ k pad_step_s(b)] (a continuation under streaming)

The bracketed terms apply to a left-padded batch (rows of different contexts). Units: seconds, tokens.

Each function returns a ``Price`` (``rlhfsim.costs.terms``): the seconds charged, their device-busy share, and
``terms()``, the same seconds by cost term (they sum to the price up to rounding), so that validate's per-call
tables show what a predicted call is made of from the very function that priced it.
"""

from __future__ import annotations

from functools import partial

from rlhfsim.costs.framework import CallParts
from rlhfsim.costs import parallel
from rlhfsim.costs.parallel import stage_shape
from rlhfsim.costs.terms import FRAMEWORK_PIECE, GEN_CALL_OVERHEAD, HANDOFF, LEFT_PADDING, OPTIMIZER, RETOKENIZE, Price, add_terms
from rlhfsim.errors import RlhfsimError


def piece_s(cost, training: bool) -> float:
    """The framework's host time per piece beyond the fitted call (``microbatch_train_s`` or
    ``microbatch_forward_s``; 0 in profiles that did not measure it)."""
    return cost.step_scalar("microbatch_train_s" if training else "microbatch_forward_s")


def forward_call(cost, setup, role: str, n_tokens: float, n_rows: float, *, runtime: str | None, tp: int = 1,
                 attn_pairs: float | None = None, sp: int = 1, fsdp_n: int = 0, inter_node: bool = False,
                 layout=None) -> CallParts:
    """One forward piece of ``role`` (reward, reference, critic values, the actor's old log-probs) by part:
    every position's logits with an LM head, verl's entropy beside the log-probs when
    ``execution.entropy`` (not for the reward model). ``runtime``: the role's forward runtime
    (``rlhfsim.sim.simulation.forward_runtime``); ``layout``: one pipeline stage's GPU under Megatron's
    parallelism (``rlhfsim.costs.parallel.layout_of``)."""
    return cost.framework_call(False, setup.shapes[role], setup.dtypes[role], n_tokens, n_rows, tp, setup.head(role),
                               attn_pairs, sp, runtime=runtime, logprob=True,
                               entropy=setup.scenario.execution.entropy and role != "reward", fsdp_n=fsdp_n,
                               inter_node=inter_node, layout=layout)


def train_call(cost, setup, role: str, n_tokens: float, n_rows: float, *, tp: int = 1, attn_pairs: float | None = None,
               sp: int = 1, fsdp_n: int = 0, inter_node: bool = False, ckpt_frac: float | None = None,
               layout=None) -> CallParts:
    """One training piece of ``role`` (forward, loss, backward) by part: log-probs with an LM head, the
    entropy for the actor when ``execution.entropy``, gradient checkpointing as the scenario sets it.
    ``ckpt_frac``: the profile's ``checkpoint_extra_frac`` when the caller has it already (a hot loop);
    ``layout``: one pipeline stage's GPU under Megatron's parallelism (``rlhfsim.costs.parallel.layout_of``)."""
    exe, head = setup.scenario.execution, setup.head(role)
    frac = cost.step_scalar("checkpoint_extra_frac") if ckpt_frac is None else ckpt_frac
    return cost.framework_call(True, setup.shapes[role], setup.dtypes[role], n_tokens, n_rows, tp, head, attn_pairs,
                               sp, logprob=head == "lm", entropy=exe.entropy and role == "actor",
                               checkpointing=exe.gradient_checkpointing, ckpt_frac=frac, fsdp_n=fsdp_n,
                               inter_node=inter_node, layout=layout)


def optimizer_step(cost, setup, role: str, tp: int = 1, dp: int = 1, inter_node: bool = False,
                   fsdp_n: int = 0, layout: "parallel.Layout | None" = None) -> Price:
    """One minibatch's optimizer step of ``role``: the gradient all-reduce over ``dp`` replicas (none under FSDP)
    and AdamW on this GPU's shard. Under Megatron's ``layout``: one pipeline stage's shard (``parallel.stage_shape``;
    an uneven pipeline's largest stage, ``parallel.largest_stage``), the dense gradients all-reduced over the dp x cp
    GPUs that hold the same weights and an expert-parallel rank's own experts' over its expert-data-parallel group
    (``CostModel.optimizer``)."""
    m = setup.shapes[role]
    if layout is None:
        return cost.optimizer(m, setup.dtypes[role], tp, dp, setup.head(role), inter_node, grad_allreduce=fsdp_n == 0)
    return cost.optimizer(stage_shape(m, layout.pp, parallel.largest_stage(m, layout)), setup.dtypes[role], tp, dp,
                          setup.head(role), inter_node, grad_allreduce=fsdp_n == 0, cp=layout.cp, ep=layout.ep,
                          etp=layout.etp)


def forward_piece(cost, setup, role: str, n_tokens: float, n_rows: float, runtime: str | None) -> Price:
    """A forward call timed inside a real step, priced alone (one device, no sharding): the piece and the
    framework's host time per piece (framework_piece)."""
    return forward_call(cost, setup, role, n_tokens, n_rows, runtime=runtime).price().add(FRAMEWORK_PIECE,
                                                                                          piece_s(cost, False))


def train_piece(cost, setup, role: str, n_tokens: float, n_rows: float) -> Price:
    """A training call (one minibatch on one device) timed inside a real step, priced alone: the piece, the
    host time per piece (framework_piece) and the minibatch's optimizer step (optimizer)."""
    return (train_call(cost, setup, role, n_tokens, n_rows).price().add(FRAMEWORK_PIECE, piece_s(cost, True))
            .add(OPTIMIZER, optimizer_step(cost, setup, role).total_s))


def scorer_call(cost, strategy, model, dtype: str, tokens: float, n_seqs: int, prefix: float, tp: int, head: str,
                runtime: str | None, retokenize: bool, new: float | None = None) -> Price:
    """One scorer call of ``n_seqs`` rows alone (no co-running slowdown): the streaming strategy's price
    (``rlhfsim.sim.streaming``), plus the host's re-tokenizing of the call's tokens when the reward model reads
    another tokenizer (retokenize: host time, not active). ``new``: the call's tokens no earlier call scored, for
    its terms (None: all of them, so a re-encoding strategy shows no ``reencode_prefix``)."""
    p = strategy.price(cost, model, dtype, tokens, n_seqs, prefix, tp, head, runtime, new)
    return p.add(RETOKENIZE, cost.retokenize_s(n_seqs, tokens)) if retokenize else p


def prefill(cost, model, dtype: str, runtime: str | None, n_tokens: float, n_seqs: int, logprobs: bool = False) -> Price:
    """A generation runtime's prefill of ``n_tokens`` in ``n_seqs`` rows, each row's first token sampled
    (``logprobs``: its log-prob recorded)."""
    return cost.forward(model, dtype, n_tokens, n_seqs, 1, op="prefill", head="lm", gen_runtime=runtime,
                        gen_logprobs=logprobs)


def decode_steps(cost, model, dtype: str, runtime: str | None, batch: int, kv0: float, steps: int,
                 logprobs: bool = False) -> Price:
    """``steps`` decode steps of ``batch`` rows from ``kv0`` cached tokens in all (``CostModel.decode_steps``)."""
    return cost.decode_steps(model, dtype, batch, kv0, steps, runtime=runtime, logprobs=logprobs)


def generate_call(cost, model, dtype: str, runtime: str | None, rows: int, width: int, steps: int, first: bool,
                  padded: bool = False, logprobs: bool = False) -> Price:
    """One ``generate()`` call of ``rows`` rows at context ``width`` making ``steps`` tokens per row (the
    module docstring): the first call of a batch pays its host overhead (gen_call_overhead), the prefill (its
    first token) and ``steps - 1`` decode steps; a continuation under streaming pays the chunk hand-over (handoff)
    and ``steps`` steps on the cached prefix. ``padded``: the rows' contexts differ, so HF left-pads them and
    applies the mask at every step (left_padding)."""
    pad = cost.pad_step_s(runtime, rows) if padded else 0.0
    if first:
        fixed, pad0 = cost.call_overhead_s(runtime), (cost.pad_prefill_s(runtime) if padded else 0.0)
        pre = prefill(cost, model, dtype, runtime, rows * width, rows, logprobs)
        dec = decode_steps(cost, model, dtype, runtime, rows, rows * (width + 1), steps - 1, logprobs)
        total = fixed + pad0 + pre.total_s + dec.total_s + (steps - 1) * pad
        return Price(total, pre.active_s + dec.active_s,
                     partial(_call_terms, {GEN_CALL_OVERHEAD: fixed, LEFT_PADDING: pad0 + (steps - 1) * pad}, pre, dec))
    hand = cost.handoff_s(runtime, rows)
    dec = decode_steps(cost, model, dtype, runtime, rows, rows * width, steps, logprobs)
    return Price(hand + dec.total_s + steps * pad, dec.active_s,
                 partial(_call_terms, {HANDOFF: hand, LEFT_PADDING: steps * pad}, dec))


def _call_terms(fixed: dict, *prices: Price) -> dict[str, float]:
    out = dict(fixed)
    for p in prices:
        add_terms(out, p.terms())
    return out


def generation_op(cost, model, dtype: str, runtime: str | None, name: str, shape: dict, logprobs: bool = False) -> Price:
    """A generation operation timed inside a real step (``calibrate.executor``'s ``StepLog.op``: ``prefill``,
    ``decode`` (one step), ``generate_call``) priced at its shape, as the simulator's engines price the same
    work (tp 1, no co-running scoring)."""
    if name == "prefill":
        return prefill(cost, model, dtype, runtime, shape["n_tokens"], shape["n_seqs"], logprobs)
    if name == "decode":
        return decode_steps(cost, model, dtype, runtime, shape["batch"], shape["kv0"], 1, logprobs)
    if name == "generate_call":
        return generate_call(cost, model, dtype, runtime, shape["rows"], shape["width"], shape["steps"], shape["first"],
                             bool(shape.get("padded")), logprobs)
    raise RlhfsimError(f"generation_op: expected prefill, decode or generate_call, got {name!r}")
