"""The generation-runtime interface, the eager reference and the correctness check.

Every runtime generates from a batch of LEFT-padded prompts (``ids``, ``mask`` [B, T]; pad id
``calibrate.measuring.models.PAD_ID`` = 0, which is also the EOS id of our random-weight models), the way TRL hands
prompts to ``generate()``:

    gen = rt.generate(ids, mask, n)                       # one call: n new tokens per row
    more = rt.generate(gen.sequences, gen.mask, k, state=gen.state)   # k more, on the cached prefix

``Generation.sequences`` [B, T + n] are the prompts followed by the new tokens; ``mask`` extends the
attention mask with ones (as ``generate`` does internally, finished rows included); ``state`` is what a
continuation needs (a KV cache). ``exact=True`` makes every row produce exactly ``n`` tokens
(``min_new_tokens = n``: the EOS logit is masked, so EOS never ends a row early); ``sample=False`` is
greedy decoding.

Correctness first (``check_runtime``): greedy tokens of a runtime on a few prompts of unequal lengths
(left-padded) must equal the eager reference's (``eager_greedy``: a plain HF forward over the whole
sequence per token, no cache, positions from the attention mask as ``generate`` computes them, token 0
masked like ``min_new_tokens`` masks it). A random-weight model with tied embeddings argmaxes its own
last input token, so plain greedy decoding would only repeat the prompt's last token; the check adds
the same fixed Gumbel noise to every runtime's logits (``GumbelNoise``, a logits processor: greedy on
logits + Gumbel noise is a sample of softmax(logits) with that noise as its randomness), so its tokens
range over the vocabulary and depend on every cached position. A continuation in two calls must give
the same tokens as one call. Tolerance policy: in float32 the tokens must match exactly; in
bfloat16/float16 (GPU) a near-tie may flip one argmax and every later token with it, so each row must
match for its first ``LOW_PRECISION_PREFIX`` tokens and the first divergence is recorded.
``max_abs_diff`` is the largest |difference| of the raw logits of every step against eager's along the
same tokens (null where a runtime returns no logits: vllm, sglang, which also take no noise).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from transformers import LogitsProcessor

from calibrate.measuring.models import PAD_ID
from rlhfsim.costs.genruntimes import GEN_RUNTIMES
from rlhfsim.models.catalog import ModelShape

LOW_PRECISION_PREFIX = 4   # bf16/fp16: tokens per row that must match eager before a divergence is tolerated
CHECK_TOKENS = 8           # greedy tokens per row in the correctness check


@dataclass
class Generation:
    """The result of one ``generate`` call (see the module docstring)."""

    sequences: torch.Tensor
    mask: torch.Tensor
    state: Any = None
    logits: torch.Tensor | None = None     # [B, n, V] raw logits of every step (``want_logits``)

    def new_tokens(self, width: int) -> torch.Tensor:
        """The tokens after the first ``width`` columns."""
        return self.sequences[:, width:]


class GenRuntime(ABC):
    """One way of generating rollouts. Subclasses set ``NAME`` (a key of
    ``rlhfsim.costs.genruntimes.GEN_RUNTIMES``) and are listed in ``calibrate.genruntimes.GEN_RUNTIMES_IMPL``.

    ``load(model, shape, max_batch=, max_len=)`` binds the runtime to an HF ``*ForCausalLM`` (the weights
    generation uses; ``max_batch`` rows and ``max_len`` tokens per row at most); ``unload()`` releases
    what ``load`` built. ``COMPILED`` runtimes compile per shape and are measured on fewer shapes
    (``Grid.gen_compiled_batch``/``gen_compiled_models``); ``HOST_CLOCK`` runtimes launch work torch's
    stream does not see, so they are timed on the host clock after a device synchronize."""

    NAME: ClassVar[str]
    COMPILED: ClassVar[bool] = False
    HOST_CLOCK: ClassVar[bool] = False
    PROBES_FORWARD: ClassVar[bool] = True    # its forward can be timed inside generate (HF runtimes)
    TAKES_PROCESSORS: ClassVar[bool] = True  # applies ``processors`` (the check's noise) to its logits
    LEFT_PADDED: ClassVar[bool] = False      # takes left-padded prompts with an attention mask (HF generate)

    @property
    def semantics(self) -> str:
        return GEN_RUNTIMES[self.NAME]

    def available(self, device: str) -> tuple[bool, str]:
        """(True, "") if this runtime can run on ``device`` here, else (False, the reason)."""
        return True, ""

    @abstractmethod
    def load(self, model, shape: ModelShape, *, max_batch: int, max_len: int) -> None: ...

    def unload(self) -> None:
        """Release what ``load`` built."""

    @abstractmethod
    def generate(self, ids: torch.Tensor, mask: torch.Tensor, max_new_tokens: int, *, sample: bool = True,
                 exact: bool = True, state: Any = None, keep_state: bool = False, want_logits: bool = False,
                 stopping: tuple = (), processors: tuple = ()) -> Generation:
        """``max_new_tokens`` new tokens per row (see the module docstring). ``keep_state``: return what a
        continuation needs; ``want_logits``: every step's raw logits; ``stopping``/``processors``: extra
        HF stopping criteria / logits processors (HF runtimes and kv_decoder; vllm and sglang ignore them)."""


def left_pad(rows: list[list[int]], device) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded ``input_ids`` and ``attention_mask`` [len(rows), longest] (pad id 0), as TRL builds them."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), PAD_ID, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        if r:
            ids[i, width - len(r):] = torch.tensor(r, dtype=torch.long)
            mask[i, width - len(r):] = 1
    return ids.to(device), mask.to(device)


def check_prompts(vocab: int, batch: int, device, seed: int = 5) -> tuple[torch.Tensor, torch.Tensor]:
    """``batch`` prompts of unequal lengths (8 to 8 + 3 x (batch - 1) tokens), left-padded."""
    g = torch.Generator().manual_seed(seed)
    rows = [torch.randint(1, vocab, (8 + 3 * i,), generator=g).tolist() for i in range(batch)]
    return left_pad(rows, device)


class GumbelNoise(LogitsProcessor):
    """Adds fixed Gumbel noise [n, B, V] (drawn from ``seed``) to step i's scores: greedy decoding then
    samples softmax(logits) with the same randomness in every runtime. Call ``reset()`` before each
    fresh generation; a continuation goes on from the step it reached."""

    def __init__(self, n: int, batch: int, vocab: int, device, seed: int = 11):
        g = torch.Generator().manual_seed(seed)
        u = torch.rand((n, batch, vocab), generator=g).clamp_(1e-9, 1 - 1e-9)
        self.noise = (-torch.log(-torch.log(u))).to(device)
        self.step = 0

    def reset(self) -> None:
        self.step = 0

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        out = scores + self.noise[self.step].to(scores.dtype)
        self.step += 1
        return out


@torch.no_grad()
def eager_greedy(model, ids: torch.Tensor, mask: torch.Tensor, n: int,
                 noise: GumbelNoise | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference: ``n`` greedy tokens per row [B, n] (on logits + ``noise``) by a full forward per
    token (no cache), and every step's raw logits [B, n, V] (float32, CPU)."""
    toks, raw = [], []
    if noise is not None:
        noise.reset()
    for _ in range(n):
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        logits = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False).logits[:, -1].float()
        raw.append(logits.cpu().clone())
        logits[:, PAD_ID] = float("-inf")     # what min_new_tokens does to the EOS (= pad) logit
        if noise is not None:
            logits = noise(ids, logits)
        nxt = logits.argmax(-1)
        toks.append(nxt)
        ids = torch.cat([ids, nxt[:, None]], 1)
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], 1)
    return torch.stack(toks, 1).cpu(), torch.stack(raw, 1)


def first_divergence(a: torch.Tensor, b: torch.Tensor) -> int | None:
    """The first token index at which any row of ``a`` and ``b`` [B, n] differ (None: identical)."""
    diff = (a != b).any(0).nonzero()
    return int(diff[0]) if len(diff) else None


def check_runtime(rt: GenRuntime, ids: torch.Tensor, mask: torch.Tensor, ref_tokens: torch.Tensor,
                  ref_logits: torch.Tensor, dtype: str, noise: GumbelNoise | None) -> dict:
    """Greedy tokens of ``rt`` (on logits + ``noise``) against the eager reference's, one call and a
    two-call continuation (see the module docstring). Returns the journal fields: valid, reason,
    tokens_match_eager, chunked_match, first_divergence, max_abs_diff, tolerance."""
    n = ref_tokens.shape[1]
    width = ids.shape[1]
    procs = (noise,) if noise is not None else ()
    for p in procs:
        p.reset()
    one = rt.generate(ids, mask, n, sample=False, want_logits=True, processors=procs)
    toks = one.new_tokens(width).cpu()
    for p in procs:
        p.reset()
    half = rt.generate(ids, mask, n // 2, sample=False, keep_state=True, processors=procs)
    rest = rt.generate(half.sequences, half.mask, n - n // 2, sample=False, state=half.state, processors=procs)
    chunked = rest.new_tokens(width).cpu()
    div = first_divergence(toks, ref_tokens)
    low = dtype != "float32"
    match = div is None or (low and div >= LOW_PRECISION_PREFIX)
    cdiv = first_divergence(chunked, toks)
    chunked_match = cdiv is None or (low and cdiv >= LOW_PRECISION_PREFIX)
    diff = None
    if one.logits is not None and div is None:   # same tokens, so the same positions were computed
        diff = float((one.logits.float().cpu() - ref_logits).abs().max())
    tol = "exact tokens" if not low else f"tokens equal for the first {LOW_PRECISION_PREFIX} of {n} per row"
    reasons = []
    if not match:
        reasons.append(f"greedy tokens differ from eager at token {div} of {n} ({tol} required)")
    if not chunked_match:
        reasons.append(f"a two-call continuation differs from one call at token {cdiv} of {n}")
    return {"valid": match and chunked_match, "reason": "; ".join(reasons), "tokens_match_eager": div is None,
            "chunked_match": cdiv is None, "first_divergence": div, "max_abs_diff": diff, "tolerance": tol,
            "check_batch": int(ids.shape[0]), "check_tokens": n}
