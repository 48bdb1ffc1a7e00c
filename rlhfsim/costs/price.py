"""The price of one call as the simulator charges it: one home for the composition of ``CostModel``'s
methods into a forward piece, a training piece, an optimizer step, a scorer call and the generation
runtime's calls, so that the simulator (``rlhfsim.sim.stages``) and the validation's per-call tables
(``calibrate.validation.compare``: each call the executor timed inside a real step priced at its own shape)
read one formula and cannot drift apart.

A framework call is one micro-batch (piece) of one data-parallel rank (``rlhfsim.costs.framework``)::

    forward piece   = call_parts(forward, role's head, every position's log-probs, the role's runtime).total_s
                      + microbatch_forward_s                     (the framework's host time per piece)
    training piece  = call_parts(training, log-probs with an LM head, checkpointing x (1 + checkpoint_extra_frac)).total_s
                      + microbatch_train_s
    optimizer step  = optimizer(...)         once per minibatch (no gradient all-reduce under FSDP: every
                      call reduce-scattered its gradients already)
    scorer call     = the reward streaming strategy's price (+ re-tokenizing its tokens for a reward model
                      of another tokenizer: host time)

A generation runtime's calls (tp 1, no co-running scoring; ``rlhfsim.sim.engines.static`` composes the same
terms event by event)::

    prefill         = forward(n_tokens, n_seqs, LM head, the runtime's prefill fit and sampling tail)
    decode steps    = decode_sum(decoder(...).coeffs(batch, kv0), k)          (closed form over k steps)
    generate() call = call_overhead_s [+ pad_prefill_s] + prefill(b x w, b) + decode steps(b, b (w + 1), k - 1)
                      [+ (k - 1) pad_step_s(b)]                                  (first call of a batch)
                    = handoff_s(b) + decode steps(b, b w, k) [+ k pad_step_s(b)] (a continuation under streaming)

The bracketed terms apply to a left-padded batch (rows of different contexts). Units: seconds, tokens.

Each price has a twin ending in ``_terms`` that returns the same seconds by cost term (``rlhfsim.costs.terms``;
they sum to the price up to rounding): validate's per-call tables show what a predicted call is made of.
"""

from __future__ import annotations

from rlhfsim.costs.framework import CallParts
from rlhfsim.costs.terms import FRAMEWORK_PIECE, GEN_CALL_OVERHEAD, HANDOFF, LEFT_PADDING, OPTIMIZER, RETOKENIZE, Price, add_terms
from rlhfsim.errors import RlhfsimError


def piece_s(cost, training: bool) -> float:
    """The framework's host time per piece beyond the fitted call (``microbatch_train_s`` or
    ``microbatch_forward_s``; 0 in profiles that did not measure it)."""
    return cost.step_scalar("microbatch_train_s" if training else "microbatch_forward_s")


def forward_call(cost, setup, role: str, n_tokens: float, n_rows: float, *, runtime: str | None, tp: int = 1,
                 attn_pairs: float | None = None, sp: int = 1, fsdp_n: int = 0, inter_node: bool = False) -> CallParts:
    """One forward piece of ``role`` (reward, reference, critic values, the actor's old log-probs) by part:
    every position's logits with an LM head, verl's entropy beside the log-probs when
    ``execution.entropy`` (not for the reward model). ``runtime``: the role's forward runtime
    (``rlhfsim.sim.simulation.forward_runtime``)."""
    return cost.call_parts(False, setup.shapes[role], setup.dtypes[role], n_tokens, n_rows, tp, setup.head(role),
                           attn_pairs, sp, runtime=runtime, logprob=True,
                           entropy=setup.scenario.execution.entropy and role != "reward", fsdp_n=fsdp_n,
                           inter_node=inter_node)


def train_call(cost, setup, role: str, n_tokens: float, n_rows: float, *, tp: int = 1, attn_pairs: float | None = None,
               sp: int = 1, fsdp_n: int = 0, inter_node: bool = False, ckpt_frac: float | None = None) -> CallParts:
    """One training piece of ``role`` (forward, loss, backward) by part: log-probs with an LM head, the
    entropy for the actor when ``execution.entropy``, gradient checkpointing as the scenario sets it.
    ``ckpt_frac``: the profile's ``checkpoint_extra_frac`` when the caller has it already (a hot loop)."""
    exe, head = setup.scenario.execution, setup.head(role)
    frac = cost.step_scalar("checkpoint_extra_frac") if ckpt_frac is None else ckpt_frac
    return cost.call_parts(True, setup.shapes[role], setup.dtypes[role], n_tokens, n_rows, tp, head, attn_pairs, sp,
                           logprob=head == "lm", entropy=exe.entropy and role == "actor",
                           checkpointing=exe.gradient_checkpointing, ckpt_frac=frac, fsdp_n=fsdp_n,
                           inter_node=inter_node)


def optimizer_step(cost, setup, role: str, tp: int = 1, dp: int = 1, inter_node: bool = False,
                   fsdp_n: int = 0) -> Price:
    """One minibatch's optimizer step of ``role``: the gradient all-reduce over ``dp`` replicas (none under FSDP)
    and AdamW on this GPU's shard."""
    return cost.optimizer(setup.shapes[role], setup.dtypes[role], tp, dp, setup.head(role), inter_node,
                          grad_allreduce=fsdp_n == 0)


def forward_piece_s(cost, setup, role: str, n_tokens: float, n_rows: float, runtime: str | None) -> float:
    """A forward call timed inside a real step, priced alone (one device, no sharding): the piece and the
    framework's host time per piece."""
    return forward_call(cost, setup, role, n_tokens, n_rows, runtime=runtime).total_s + piece_s(cost, False)


def train_piece_s(cost, setup, role: str, n_tokens: float, n_rows: float) -> float:
    """A training call (one minibatch on one device) timed inside a real step, priced alone: the piece, the
    host time per piece and the minibatch's optimizer step."""
    return (train_call(cost, setup, role, n_tokens, n_rows).total_s + piece_s(cost, True)
            + optimizer_step(cost, setup, role)[0])


def forward_piece_terms(cost, setup, role: str, n_tokens: float, n_rows: float, runtime: str | None) -> dict[str, float]:
    """``forward_piece_s`` by cost term."""
    return {**forward_call(cost, setup, role, n_tokens, n_rows, runtime=runtime).terms(), FRAMEWORK_PIECE: piece_s(cost, False)}


def train_piece_terms(cost, setup, role: str, n_tokens: float, n_rows: float) -> dict[str, float]:
    """``train_piece_s`` by cost term."""
    return {**train_call(cost, setup, role, n_tokens, n_rows).terms(), FRAMEWORK_PIECE: piece_s(cost, True),
            OPTIMIZER: optimizer_step(cost, setup, role)[0]}


def scorer_call(cost, strategy, model, dtype: str, tokens: float, n_seqs: int, prefix: float, tp: int, head: str,
                runtime: str | None, retokenize: bool) -> tuple[float, float]:
    """(total_s, active_s) of one scorer call of ``n_seqs`` rows alone (no co-running slowdown): the
    streaming strategy's price (``rlhfsim.sim.streaming``), plus the host's re-tokenizing of the call's
    tokens when the reward model reads another tokenizer (host time, not active)."""
    total, active = strategy.price(cost, model, dtype, tokens, n_seqs, prefix, tp, head, runtime)
    if retokenize:
        total += cost.retokenize_s(n_seqs, tokens)
    return total, active


def scorer_call_terms(cost, strategy, model, dtype: str, tokens: float, n_seqs: int, prefix: float, tp: int, head: str,
                      runtime: str | None, retokenize: bool, new: float | None = None) -> dict[str, float]:
    """``scorer_call``'s total by cost term (``Streaming.parts``); ``new``: the call's tokens no earlier call
    scored (None: all of them, so a re-encoding strategy shows no ``reencode_prefix``)."""
    out = strategy.parts(cost, model, dtype, tokens, n_seqs, prefix, tokens if new is None else new, tp, head, runtime)
    if retokenize:
        out[RETOKENIZE] = cost.retokenize_s(n_seqs, tokens)
    return out


def prefill_s(cost, model, dtype: str, runtime: str | None, n_tokens: float, n_seqs: int, logprobs: bool = False) -> float:
    """A generation runtime's prefill of ``n_tokens`` in ``n_seqs`` rows, each row's first token sampled
    (``logprobs``: its log-prob recorded)."""
    return cost.forward(model, dtype, n_tokens, n_seqs, 1, op="prefill", head="lm", gen_runtime=runtime,
                          gen_logprobs=logprobs).total_s


def decode_steps_s(cost, model, dtype: str, runtime: str | None, batch: int, kv0: float, steps: int,
                   logprobs: bool = False) -> float:
    """``steps`` decode steps of ``batch`` rows from ``kv0`` cached tokens in all (``CostModel.decode_steps``)."""
    return cost.decode_steps(model, dtype, batch, kv0, steps, runtime=runtime, logprobs=logprobs).total_s


def generate_call_s(cost, model, dtype: str, runtime: str | None, rows: int, width: int, steps: int, first: bool,
                    padded: bool = False, logprobs: bool = False) -> float:
    """One ``generate()`` call of ``rows`` rows at context ``width`` making ``steps`` tokens per row (the
    module docstring): the first call of a batch pays its host overhead, the prefill (its first token) and
    ``steps - 1`` decode steps; a continuation under streaming pays the chunk hand-over and ``steps`` steps
    on the cached prefix. ``padded``: the rows' contexts differ, so HF left-pads them and applies the mask
    at every step."""
    pad = cost.pad_step_s(runtime, rows) if padded else 0.0
    if first:
        return (cost.call_overhead_s(runtime) + (cost.pad_prefill_s(runtime) if padded else 0.0)
                + prefill_s(cost, model, dtype, runtime, rows * width, rows, logprobs)
                + decode_steps_s(cost, model, dtype, runtime, rows, rows * (width + 1), steps - 1, logprobs)
                + (steps - 1) * pad)
    return (cost.handoff_s(runtime, rows) + decode_steps_s(cost, model, dtype, runtime, rows, rows * width, steps, logprobs)
            + steps * pad)


def prefill_terms(cost, model, dtype: str, runtime: str | None, n_tokens: float, n_seqs: int,
                  logprobs: bool = False) -> dict[str, float]:
    """``prefill_s`` by cost term."""
    return cost.forward(model, dtype, n_tokens, n_seqs, 1, op="prefill", head="lm", gen_runtime=runtime,
                              gen_logprobs=logprobs).terms()


def decode_steps_terms(cost, model, dtype: str, runtime: str | None, batch: int, kv0: float, steps: int,
                       logprobs: bool = False) -> dict[str, float]:
    """``decode_steps_s`` by cost term: each step's (``_Decode.steps_terms``), the cache growing by ``batch`` a step."""
    return cost.decoder(model, dtype, 1, runtime, logprobs).steps_terms(batch, kv0, steps)


def generate_call_terms(cost, model, dtype: str, runtime: str | None, rows: int, width: int, steps: int, first: bool,
                        padded: bool = False, logprobs: bool = False) -> dict[str, float]:
    """``generate_call_s`` by cost term: the call's host overhead (``gen_call_overhead``) or the chunk hand-over
    (``handoff``), left padding (``left_padding``), the prefill's and the decode steps' terms."""
    pad = cost.pad_step_s(runtime, rows) if padded else 0.0
    if first:
        out = {GEN_CALL_OVERHEAD: cost.call_overhead_s(runtime),
               LEFT_PADDING: (cost.pad_prefill_s(runtime) if padded else 0.0) + (steps - 1) * pad}
        add_terms(out, prefill_terms(cost, model, dtype, runtime, rows * width, rows, logprobs))
        add_terms(out, decode_steps_terms(cost, model, dtype, runtime, rows, rows * (width + 1), steps - 1, logprobs))
        return out
    out = {HANDOFF: cost.handoff_s(runtime, rows), LEFT_PADDING: steps * pad}
    add_terms(out, decode_steps_terms(cost, model, dtype, runtime, rows, rows * width, steps, logprobs))
    return out


def _generation_op(prefill, decode, generate, cost, model, dtype: str, runtime: str | None, name: str, shape: dict,
                   logprobs: bool, who: str):
    """A generation operation (``prefill``, ``decode``: one step, ``generate_call``) at its logged shape, priced by
    the given prefill, decode-steps and generate-call functions (the seconds, or their ``_terms`` twins)."""
    if name == "prefill":
        return prefill(cost, model, dtype, runtime, shape["n_tokens"], shape["n_seqs"], logprobs)
    if name == "decode":
        return decode(cost, model, dtype, runtime, shape["batch"], shape["kv0"], 1, logprobs)
    if name == "generate_call":
        return generate(cost, model, dtype, runtime, shape["rows"], shape["width"], shape["steps"], shape["first"],
                        bool(shape.get("padded")), logprobs)
    raise RlhfsimError(f"{who}: expected prefill, decode or generate_call, got {name!r}")


def generation_op_s(cost, model, dtype: str, runtime: str | None, name: str, shape: dict, logprobs: bool = False) -> float:
    """A generation operation timed inside a real step (``calibrate.executor``'s ``StepLog.op``: ``prefill``,
    ``decode`` (one step), ``generate_call``) priced at its shape, as the simulator's engines price the same
    work (tp 1, no co-running scoring)."""
    return _generation_op(prefill_s, decode_steps_s, generate_call_s, cost, model, dtype, runtime, name, shape, logprobs,
                          "generation_op_s")


def generation_op_terms(cost, model, dtype: str, runtime: str | None, name: str, shape: dict,
                        logprobs: bool = False) -> dict[str, float]:
    """``generation_op_s`` by cost term."""
    return _generation_op(prefill_terms, decode_steps_terms, generate_call_terms, cost, model, dtype, runtime, name,
                          shape, logprobs, "generation_op_terms")
