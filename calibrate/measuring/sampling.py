"""The sampling tail of a generation step, measured per runtime against rows x vocabulary.

After each forward a generation runtime turns the step's next-token logits into tokens: softmax over
the vocabulary, the multinomial draw, log-probs, stopping checks, the tokens handed to the host. That
work scales with rows x vocab, not with the model's weights or FLOPs, so the roofline of the forward
(``rlhfsim.costs.model``) cannot carry it: on the 2-core CPU it is about 22 ns per logit (2.8 ms of a
5.7 ms decode step of 16 rows at vocabulary 8,192), and a profile fitted with it folded into the
roofline under-priced the decode of an unseen vocab-4,096 model by 38% (``rlhfsim validate --generate
--seed 971985135``). So each runtime's tail is measured on its own, here, and

    tail(rows, V) = sample_s + sample_per_logit_s x rows x V

is subtracted from every prefill and decode point of that runtime before the roofline fit
(``calibrate.fitting.fit.point_value``) and added back by the simulator per decode step and per prefill call
(``rlhfsim.costs.model``; ``rlhfsim.costs.genruntimes.sample_tail``).

Points (op ``sample``, field ``runtime``; ``batch`` = rows, ``vocab`` = V; grid ``Grid.sampling``):

* ``kv_decoder``: ``calibrate.measuring.decoder.sample_next`` on [rows, V] logits of the calibration dtype, the
  call the executor's decode loop (``Generator._decode``) makes after each ``extend``.
* HF runtimes (``hf_generate``): one ``generate()`` call of 1 + K new tokens (TRL's arguments, exact
  lengths as in the decode points) on ``rows`` prompts of a one-layer model of vocabulary V (hidden 64:
  the forward is small, the tail is the same loop); forward hooks time each gap from one forward's end to
  the next forward's start (the logits copy, the logits processors, softmax, multinomial, the stopping
  criteria, the next step's input preparation). A sample is the mean of one call's K gaps, taken under
  the generation points' discipline (``calibrate.measuring.genbench.rounds``).
  ``hf_static`` runs the same ``generate()`` loop after its compiled forward and shares
  ``hf_generate``'s tail (``SAMPLING_AS``); compiling a model per vocabulary would cost minutes.
  Each round of a point also runs the same call the way rlhfsim's executor makes it
  (``calibrate.executor.generation``): with its ``LogprobRecorder`` as the last logits processor (a
  log-sum-exp over each row's logits per step) and a ``RowStop`` criterion handing it the sampled tokens
  (a gather per step), the call's log-probs read to the host at its end. Those rounds' gaps are the point's
  twin with field ``logprobs`` (``RECORDED_RUNTIMES``), measured in the same rounds (the two calls
  alternate which goes first), fitted alike and kept as ``generation[RT].sampling_logprobs``: the tail of a
  scenario with ``generation.sampling_logprobs`` (``rlhfsim.costs.genruntimes.sample_tail``).
* ``vllm``, ``sglang``, ``vllm_eager``: not measured (their sampler runs inside the engine step, whose
  decode points carry it): no tail, nothing subtracted.

The fit (``fit_tail``) is weighted least squares on relative residuals, with a k-fold held-out error.
"""

from __future__ import annotations

import itertools
import time

import numpy as np
import torch

from calibrate.measuring.decoder import sample_next
from calibrate.measuring.measure import summarize
from calibrate.running.session import Session, point_key
from rlhfsim.costs.genruntimes import SAMPLING_AS
from rlhfsim.models.catalog import ModelShape

HOOK_RUNTIMES = ("hf_generate",)        # measured through generate() with forward hooks
RECORDED_RUNTIMES = ("hf_generate",)    # ... also with the executor's log-prob recorder (field logprobs)
DIRECT_RUNTIMES = ("kv_decoder",)       # measured by calling their sampler on logits
PROMPT = 8                              # prompt tokens per row of the hooked generate() calls
STEPS = 8                               # K gaps per hooked call


def _variants(runtime: str) -> tuple[bool, ...]:
    """The points of ``runtime``'s tail at one shape: plain, and with the executor's log-prob recorder
    (``logprobs``) for the ``RECORDED_RUNTIMES``."""
    return (False, True) if runtime in RECORDED_RUNTIMES else (False,)


def sampled_runtimes(gen_runtimes) -> list[str]:
    """The runtimes of a grid whose tail is measured here (the others share one or have none)."""
    return [r for r in gen_runtimes if r in HOOK_RUNTIMES + DIRECT_RUNTIMES and SAMPLING_AS.get(r, r) == r]


def tail_shape(vocab: int) -> ModelShape:
    """The one-layer model the hooked runtimes generate with at vocabulary ``vocab``."""
    return ModelShape(f"sample-v{vocab}", "decoder", 1, 64, 128, 2, 1, vocab, True, True, "qwen2", 4096, "")


def _key(runtime: str, rows: int, vocab: int, dtype: str, logprobs: bool = False) -> str:
    return point_key("sample", f"v{vocab}", dtype, batch=rows, seq_len=1, head="lm", runtime=runtime,
                     strategy="logprobs" if logprobs else "")


def _fields(runtime: str, rows: int, vocab: int, logprobs: bool = False) -> dict:
    return {"op": "sample", "model": f"v{vocab}", "runtime": runtime, "batch": rows, "vocab": vocab,
            "logits": rows * vocab, "head": "lm", "seq_len": 1, "prefix_len": 0, "tokens": rows,
            **({"logprobs": True} if logprobs else {})}


class _Gaps:
    """Forward hooks on a model: the gaps between one forward's end and the next one's start."""

    def __init__(self, model, device: str):
        self.cuda = torch.device(device).type == "cuda"
        self.device = device
        self.end: float | None = None
        self.gaps: list[float] = []
        self.handles = [model.register_forward_pre_hook(self._pre), model.register_forward_hook(self._post)]

    def _now(self) -> float:
        if self.cuda:
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def _pre(self, module, args) -> None:
        if self.end is not None:
            self.gaps.append(self._now() - self.end)

    def _post(self, module, args, out) -> None:
        self.end = self._now()

    def start(self) -> None:
        self.end, self.gaps = None, []

    def close(self) -> None:
        for h in self.handles:
            h.remove()


def _hooked(s: Session, runtime: str, rows_list: list[int], vocab: int) -> None:
    from calibrate.measuring.genbench import rounds
    from calibrate.genruntimes import GEN_RUNTIMES_IMPL
    from calibrate.genruntimes.hf_generate import LogprobRecorder, RowStop

    shape = tail_shape(vocab)
    model = s.hf_model(shape, "lm")
    rt = GEN_RUNTIMES_IMPL[runtime]()
    rt.load(model, shape, max_batch=max(rows_list), max_len=PROMPT + STEPS + 2)
    gaps = _Gaps(model, s.device)
    try:
        for rows in rows_list:
            keys = {lp: _key(runtime, rows, vocab, s.dtype, lp) for lp in _variants(runtime)}
            todo = [lp for lp, k in keys.items() if s.pending(k)]
            if not todo:
                continue
            g = torch.Generator().manual_seed(rows + vocab)
            ids = torch.randint(1, vocab, (rows, PROMPT), generator=g).to(s.device)
            mask = torch.ones_like(ids)

            def call(logprobs: bool) -> tuple[float, float]:
                t0 = time.perf_counter()
                gaps.start()
                if logprobs:   # as calibrate.executor.generation.HfGenerator._call makes it
                    rec = LogprobRecorder()
                    rt.generate(ids, mask, 1 + STEPS, stopping=(RowStop([1 + STEPS] * rows, ids.device, recorder=rec),),
                                processors=(rec,)).sequences[:, PROMPT:].tolist()
                    rec.logprobs()
                else:
                    rt.generate(ids, mask, 1 + STEPS).sequences[:, PROMPT:].tolist()
                return float(np.mean(gaps.gaps)) if gaps.gaps else float("nan"), time.perf_counter() - t0

            turn = itertools.count()

            def one():
                # a round: the variants measured, in alternating order; (gap by variant..., wall time)
                order = list(keys) if next(turn) % 2 == 0 else list(keys)[::-1]
                got = {lp: call(lp) for lp in order}
                return (*[got[lp][0] for lp in keys], sum(w for _, w in got.values()))

            # the generation points' timing discipline (warm-up, budget on the calls' wall time, bursts)
            taken, first = s.guarded(lambda: rounds(s, one, cost=lambda r: r[-1]))
            for i, lp in enumerate(keys):
                if lp in todo:
                    s.record(keys[lp], {**_fields(runtime, rows, vocab, lp), "steps": STEPS,
                                        "timed": "mean gap between forwards inside generate()"
                                        + (" with the executor's LogprobRecorder and RowStop" if lp else "")},
                             timing=summarize([r[i] for r in taken], first[i]))
    finally:
        gaps.close()
        rt.unload()
        del model
        s.free()


def _direct(s: Session, runtime: str, rows_list: list[int], vocab: int) -> None:
    gen = torch.Generator(device=s.device).manual_seed(vocab)
    for rows in rows_list:
        key = _key(runtime, rows, vocab, s.dtype)
        if not s.pending(key):
            continue
        logits = torch.randn(rows, vocab, generator=torch.Generator().manual_seed(rows)).to(s.device, s.tdtype)
        s.measure(key, {**_fields(runtime, rows, vocab), "timed": "calibrate.measuring.decoder.sample_next"},
                  lambda x=logits: sample_next(x, gen))


def measure_sampling(s: Session, runtimes) -> None:
    """Every ``Grid.sampling`` point of each runtime whose tail is measured (``sampled_runtimes``)."""
    by_vocab: dict[int, list[int]] = {}
    for rows, vocab in s.grid.sampling:
        by_vocab.setdefault(int(vocab), []).append(int(rows))
    with torch.inference_mode():
        for rt in sampled_runtimes(runtimes):
            for vocab, rows_list in sorted(by_vocab.items()):
                keys = [_key(rt, r, vocab, s.dtype, lp) for r in rows_list for lp in _variants(rt)]
                if s.all_done(keys):
                    continue
                (_hooked if rt in HOOK_RUNTIMES else _direct)(s, rt, rows_list, vocab)


def plan_size(grid, runtimes) -> int:
    return len(grid.sampling) * sum(len(_variants(rt)) for rt in sampled_runtimes(runtimes))


def fit_tail(points: list[dict], value) -> dict | None:
    """``sample_s + sample_per_logit_s x logits`` fitted to one runtime's ``sample`` points (``value``: a
    point's measured seconds): weighted least squares on relative residuals, both terms >= 0 (a negative
    one is dropped and the other refitted); ``heldout_mape``: k-fold (k = min(5, n)) mean |error| / t."""
    pts = [p for p in points if not p.get("skipped") and value(p) > 0]
    if len(pts) < 2:
        return None
    x = np.array([float(p["batch"]) * float(p["vocab"]) for p in pts])
    t = np.array([value(p) for p in pts])

    def solve(xx, tt):
        a_mat = np.stack([np.ones_like(xx), xx], 1) / tt[:, None]
        c, *_ = np.linalg.lstsq(a_mat, np.ones_like(tt), rcond=None)
        if c[1] < 0:
            c = np.array([float(np.sum(1 / tt) / np.sum(1 / tt ** 2)), 0.0])
        elif c[0] < 0:
            c = np.array([0.0, float(np.sum(xx / tt) / np.sum((xx / tt) ** 2))])
        return c

    c = solve(x, t)
    fit_mape = float(np.mean(np.abs(c[0] + c[1] * x - t) / t))
    heldout = None
    if len(pts) >= 4:
        perm = np.random.default_rng(0).permutation(len(pts))
        errs = np.zeros(len(pts))
        for fold in np.array_split(perm, min(5, len(pts))):
            train = np.setdiff1d(perm, fold)
            cf = solve(x[train], t[train])
            errs[fold] = np.abs(cf[0] + cf[1] * x[fold] - t[fold]) / t[fold]
        heldout = float(np.mean(errs))
    return {"sample_s": float(c[0]), "sample_per_logit_s": float(c[1]), "fit_mape": fit_mape,
            "heldout_mape": heldout, "n_points": len(pts),
            "points": [{"rows": int(p["batch"]), "vocab": int(p["vocab"]), "ms": 1e3 * value(p)} for p in pts]}
