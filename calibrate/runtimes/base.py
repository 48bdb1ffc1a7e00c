"""The scoring-runtime interface: every runtime times the same thing, a reward model's forward over a
right-padded batch, returning one float score per row.

``Runtime.prepare(model, input_ids, attention_mask, device=, cache_dir=)`` returns the scoring call
(``Prepared``); ``Runtime.sampler(...)`` wraps it in a ``Sampler`` (``calibrate.measuring.interleave``) whose
rounds the calibration interleaves with the other runtimes'. A runtime timed outside this process
(``aoti_cpp``) overrides ``sampler`` instead.
``Runtime.time_scoring(model, input_ids, attention_mask, device=, warmup=, iters=, cache_dir=)`` returns a
``Timing``: steady-state call durations (seconds, after the first call and ``warmup`` calls), the first call
timed on its own (where compilation lands), ``setup_s`` spent outside calls (export, package, build), and
the last call's scores as a float32 CPU tensor [batch] for the max-abs-difference check against eager.
A runtime keeps per-model state (an exported graph, a session) on the instance so that later points of the
same model reuse it; ``setup_s`` is then 0.
"""

from __future__ import annotations

from abc import ABC
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import torch

from calibrate.measuring.interleave import InProcessSampler, Prepared, Sampler


@dataclass
class Timing:
    """One scoring point as a runtime measured it (see the module docstring)."""

    samples_s: list[float]
    first_call_s: float
    setup_s: float
    output: torch.Tensor


class ScoreModule(torch.nn.Module):
    """``(input_ids, attention_mask) -> scores [batch]``: the reward model's single logit per row, as a
    plain module any exporter or compiler can take."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, attention_mask=attention_mask).logits[:, 0]


def eager_scores(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """The reference scores every runtime is checked against (float32, CPU)."""
    with torch.inference_mode():
        return ScoreModule(model)(input_ids, attention_mask).float().cpu()


def model_key(model: torch.nn.Module) -> str:
    """A cache key for exported artifacts: architecture, sizes and dtype, plus a fingerprint of the weights
    (so a different seed or checkpoint never reuses a stale export)."""
    cfg = model.config
    p = next(model.parameters())
    with torch.no_grad():
        fp = sum(float(t.float().flatten()[:64].sum()) for t in list(model.parameters())[:8])
    return (f"{cfg.model_type}-L{cfg.num_hidden_layers}-h{cfg.hidden_size}-i{cfg.intermediate_size}"
            f"-v{cfg.vocab_size}-{str(p.dtype).removeprefix('torch.')}-{fp:+.6e}")


class Runtime(ABC):
    """One way of running the reward model's forward. Subclasses set ``NAME`` and implement ``prepare``
    (or, for a runtime timed outside this process, ``sampler``); they are listed in
    ``calibrate.runtimes.RUNTIMES``."""

    NAME: ClassVar[str]

    def available(self, device: str) -> tuple[bool, str]:
        """(True, "") if this runtime can run on ``device`` here, else (False, the reason)."""
        return True, ""

    def prepare(self, model, input_ids, attention_mask, *, device: str, cache_dir: Path) -> Prepared:
        """The scoring call of this runtime for these inputs (export, compile, session set up here)."""
        raise NotImplementedError(f"{type(self).__name__} implements neither prepare nor sampler")

    def sampler(self, model, input_ids, attention_mask, *, device: str, warmup: int, cache_dir: Path) -> Sampler:
        """A ``Sampler`` of this runtime at one operating point (``calibrate.measuring.interleave``)."""
        p = self.prepare(model, input_ids, attention_mask, device=device, cache_dir=cache_dir)
        return InProcessSampler(p.call, device=device, warmup=warmup, setup_s=p.setup_s, host_clock=p.host_clock)

    def time_scoring(self, model, input_ids, attention_mask, *, device: str, warmup: int, iters: int,
                     cache_dir: Path) -> Timing:
        """One contiguous measurement (first call, ``warmup`` calls, ``iters`` timed calls)."""
        smp = self.sampler(model, input_ids, attention_mask, device=device, warmup=warmup, cache_dir=cache_dir)
        first = smp.first()
        samples = smp.round(iters)
        return Timing(samples, first, smp.setup_s, smp.output.detach().float().cpu().reshape(-1))
