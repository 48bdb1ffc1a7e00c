"""``kv_decoder``: rlhfsim's own static-KV decoder (``calibrate.measuring.decoder.StaticKVDecoder``) with the HF
model's weights copied in. Its costs are the profile's plain ``prefill``/``decode`` operations
(``calibrate.measuring.bench``: the executor's own decode loop); here it only takes part in the correctness check.

Its decode loop hands every step's tokens to the host (``sample_next``'s ``.tolist()``), so there is no
call boundary: a chunk boundary costs nothing beyond the steps (the profile writes ``call_overhead_s``
and ``handoff_s`` = 0, source "derived"). Left-padded prompts are re-laid right-padded with per-row
lengths (``extend(..., lengths=)``), so every row sits at its true positions, as in ``generate``.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from calibrate.measuring.decoder import StaticKVDecoder, sample_next
from calibrate.genruntimes.base import Generation, GenRuntime
from calibrate.measuring.models import PAD_ID
from rlhfsim.models.catalog import ModelShape


class KvDecoder(GenRuntime):
    """``StaticKVDecoder`` generation: one prefill ``extend`` then one ``extend`` per token."""

    NAME: ClassVar[str] = "kv_decoder"
    PROBES_FORWARD: ClassVar[bool] = False

    def __init__(self):
        self.dec: StaticKVDecoder | None = None

    def load(self, model, shape: ModelShape, *, max_batch: int, max_len: int) -> None:
        p = next(model.parameters())
        self.dec = StaticKVDecoder(shape, dtype=p.dtype, device=str(p.device), max_slots=max_batch,
                                   max_len=max_len, head="lm")
        self.dec.load_hf_state_dict(model.state_dict())
        self.rng = torch.Generator(device=p.device).manual_seed(0)

    def unload(self) -> None:
        self.dec = None

    def _pick(self, ids: torch.Tensor, logits: torch.Tensor, sample: bool, processors, raw: list | None) -> torch.Tensor:
        if raw is not None:
            raw.append(logits.float().cpu().clone())
        if sample:
            return torch.tensor(sample_next(logits, self.rng, PAD_ID)[0], device=logits.device)
        logits = logits.float().clone()
        logits[:, PAD_ID] = float("-inf")
        for p in processors:      # HF logits processors: (input_ids so far, scores) -> scores
            logits = p(ids, logits)
        return logits.argmax(-1)

    def generate(self, ids, mask, max_new_tokens, *, sample=True, exact=True, state=None, keep_state=False,
                 want_logits=False, stopping=(), processors=()) -> Generation:
        b = ids.shape[0]
        slots = torch.arange(b)
        raw: list | None = [] if want_logits else None
        toks = []
        if state is None:
            lens = mask.sum(1).cpu()
            right = torch.full_like(ids, PAD_ID)
            for i in range(b):    # left padding -> right padding with lengths
                right[i, :int(lens[i])] = ids[i, mask[i].bool()]
            self.dec.reset(slots)
            logits = self.dec.extend(slots, right[:, :int(lens.max())], lengths=lens)
            toks.append(self._pick(ids, logits, sample, processors, raw))
        last = toks[-1] if toks else ids[:, -1]
        while len(toks) < max_new_tokens:
            seq = torch.cat([ids, torch.stack(toks, 1).to(ids.device)], 1) if toks else ids
            last = self._pick(seq, self.dec.extend(slots, last[:, None]), sample, processors, raw)
            toks.append(last)
        new = torch.stack(toks, 1).to(ids.device)
        seq = torch.cat([ids, new], 1)
        grown = torch.ones((b, new.shape[1]), dtype=mask.dtype, device=mask.device)
        return Generation(seq, torch.cat([mask, grown], 1), slots if keep_state else None,
                          torch.stack(raw, 1) if raw is not None else None)
