"""``hf_generate``: transformers ``generate()`` with its default dynamic cache, called the way TRL's
GRPOTrainer calls it (``trl/trainer/grpo_trainer.py``, trl 1.16: a ``GenerationConfig`` of
``max_new_tokens``, ``do_sample=True``, ``pad_token_id``, ``bos_token_id``, ``eos_token_id``,
``temperature=1.0``, ``top_p=1.0``, ``top_k=0``, ``min_p=None``, ``repetition_penalty=1.0``,
``cache_implementation=None`` and ``disable_compile=True``, on left-padded prompts under ``no_grad``).
At these defaults ``generate`` adds no logits warper, so a step is: forward, last-token logits, softmax,
multinomial, EOS bookkeeping, stopping criteria. Timing points add ``min_new_tokens = max_new_tokens``
(one masked fill per step) so that a call always produces its token count.

Chunked continuation (how an OPPO intra-step implementation on top of ``generate`` hands k tokens per
row downstream): ``generate(sequences so far, extended mask, cache=<the returned cache>)``; ``generate``
then feeds only the uncached last token, so N tokens in N/k calls run the same N forwards as one call.

Also here, for the executor (``calibrate.executor.generation``): ``RowStop`` (exact per-row lengths: a
stopping criterion returning one bool per row; finished rows then emit pad, as HF does once an EOS
criterion exists) and ``LogprobRecorder`` (the sampled tokens' log-probs, O(batch) memory per step).
"""

from __future__ import annotations

import time
from dataclasses import fields
from typing import Any, ClassVar

import torch
from transformers import LogitsProcessor, LogitsProcessorList, StoppingCriteria, StoppingCriteriaList
from transformers.generation.utils import GenerateDecoderOnlyOutput

from calibrate.genruntimes.base import Generation, GenRuntime
from calibrate.measuring.models import PAD_ID
from rlhfsim.models.catalog import ModelShape

EOS_ID = PAD_ID   # our random-weight models: EOS = pad = 0 (as for Qwen2 base models, whose pad is EOS)
# transformers 5 renamed generate's ``past_key_values`` to ``cache`` (the old name still works, with a
# deprecation warning); use whichever the installed version returns.
CACHE_KW = "cache" if "cache" in {f.name for f in fields(GenerateDecoderOnlyOutput)} else "past_key_values"


def trl_kwargs(max_new_tokens: int, sample: bool, exact: bool) -> dict:
    """generate() keyword arguments of TRL's GRPOTrainer at its defaults (see the module docstring)."""
    kw: dict[str, Any] = dict(max_new_tokens=max_new_tokens, do_sample=sample, pad_token_id=PAD_ID,
                              bos_token_id=None, eos_token_id=EOS_ID, disable_compile=True)
    if sample:
        kw.update(temperature=1.0, top_p=1.0, top_k=0, min_p=None, repetition_penalty=1.0)
    if exact:
        kw["min_new_tokens"] = max_new_tokens
    return kw


class RowStop(StoppingCriteria):
    """Stops row i after ``remaining[i]`` new tokens of this call, and every row after ``stop_all_at``
    steps (the step at which the caller's target of finished rollouts is reached; None: never). Step
    counts are host-side, so the check never waits for the device. With a ``recorder``, hands it each
    step's sampled tokens."""

    def __init__(self, remaining: list[int], device, stop_all_at: int | None = None,
                 recorder: "LogprobRecorder | None" = None):
        self.remaining = torch.tensor(remaining, device=device)
        self.stop_all_at = stop_all_at
        self.recorder = recorder
        self.step = 0

    def __call__(self, input_ids: torch.LongTensor, scores, **kwargs) -> torch.BoolTensor:
        self.step += 1
        if self.recorder is not None:
            self.recorder.take(input_ids[:, -1])
        if self.stop_all_at is not None and self.step >= self.stop_all_at:
            return torch.ones_like(self.remaining, dtype=torch.bool)
        return self.remaining <= self.step


class LogprobRecorder(LogitsProcessor):
    """Last logits processor of a call: keeps the step's processed scores and their log-normalizer; the
    stopping criterion then hands it the sampled tokens (``take``), whose log-probs are gathered on the
    device and read once per call (``logprobs``). Sampling at temperature 1 with no top-k/top-p: no
    warper follows it, so these are the log-probs the tokens were drawn with (pad masked, like
    ``calibrate.measuring.decoder.sample_next``)."""

    def __init__(self):
        self.steps: list[torch.Tensor] = []
        self._scores: torch.Tensor | None = None
        self._lse: torch.Tensor | None = None

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        self._scores = scores
        self._lse = torch.logsumexp(scores.float(), -1)
        return scores

    def take(self, tokens: torch.Tensor) -> None:
        self.steps.append(self._scores.float().gather(1, tokens[:, None])[:, 0] - self._lse)

    def logprobs(self) -> list[list[float]]:
        """[B][steps] log-probs of this call's sampled tokens (one host copy)."""
        if not self.steps:
            return []
        return torch.stack(self.steps, 1).tolist()


class ForwardProbe(StoppingCriteria):
    """Times the first forward of a ``generate()`` call through to its first sampled token: from a
    forward pre-hook on the model (set in ``attach``) to the first stopping-criteria call (which comes
    after sampling). ``elapsed_s()`` of the last call; ``now`` synchronises the device first."""

    def __init__(self, device: str):
        self.cuda = torch.device(device).type == "cuda"
        self.device = device
        self.t0: float | None = None
        self.t1: float | None = None
        self.handle = None

    def now(self) -> float:
        if self.cuda:
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def attach(self, model) -> None:
        self.handle = model.register_forward_pre_hook(self._pre)

    def detach(self) -> None:
        if self.handle is not None:
            self.handle.remove()
            self.handle = None

    def reset(self) -> None:
        self.t0 = self.t1 = None

    def _pre(self, module, args) -> None:
        if self.t0 is None:
            self.t0 = self.now()

    def __call__(self, input_ids, scores, **kwargs) -> torch.BoolTensor:
        if self.t1 is None:
            self.t1 = self.now()
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)

    def elapsed_s(self) -> float | None:
        return None if self.t0 is None or self.t1 is None else self.t1 - self.t0


class HfGenerate(GenRuntime):
    """``model.generate(...)`` with TRL's arguments and the default DynamicCache."""

    NAME: ClassVar[str] = "hf_generate"
    LEFT_PADDED: ClassVar[bool] = True

    def __init__(self):
        self.model = None

    def load(self, model, shape: ModelShape, *, max_batch: int, max_len: int) -> None:
        self.model = model
        self.max_len = max_len

    def unload(self) -> None:
        self.model = None

    def fresh_cache_kwargs(self) -> dict:
        """generate() arguments that choose the cache of a fresh call (none: the default DynamicCache)."""
        return {}

    def generate(self, ids, mask, max_new_tokens, *, sample=True, exact=True, state=None, keep_state=False,
                 want_logits=False, stopping=(), processors=()) -> Generation:
        kw = trl_kwargs(max_new_tokens, sample, exact)
        if state is None:
            kw.update(self.fresh_cache_kwargs())
        else:
            kw[CACHE_KW] = state
        if keep_state or want_logits:
            kw.update(return_dict_in_generate=True, output_logits=want_logits)
        out = self.model.generate(input_ids=ids, attention_mask=mask, logits_processor=LogitsProcessorList(processors),
                                  stopping_criteria=StoppingCriteriaList(stopping), **kw)
        seq = out.sequences if isinstance(out, GenerateDecoderOnlyOutput) else out
        grown = seq.shape[1] - ids.shape[1]
        new_mask = torch.cat([mask, torch.ones((mask.shape[0], grown), dtype=mask.dtype, device=mask.device)], 1)
        if not isinstance(out, GenerateDecoderOnlyOutput):
            return Generation(seq, new_mask)
        return Generation(seq, new_mask, getattr(out, CACHE_KW) if keep_state else None,
                          torch.stack(out.logits, 1) if want_logits else None)
