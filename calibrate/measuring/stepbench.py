"""Step-scalar measurements: what a training framework's step costs beyond the fitted operations, on this
device, written as ``profile["step"]`` (names, defaults and meaning: ``rlhfsim.costs.stepcosts``).

Each scalar comes from paired timings on one small random-weight decoder (the calibration's first decoder
shape; ``tiny-qwen2`` by default), samples kept in ``step.samples``:

* ``microbatch_forward_s``: one forward piece as verl runs it (the piece sliced out of a larger batch,
  the forward, log-softmax of the logits in float32 and the gather of each token's log-prob, the result
  moved off the piece) minus the plain forward of the same piece; median of the paired differences,
  clipped at 0 (what the fitted ``prefill``/``score:eager`` operations do not already charge).
* ``microbatch_train_s``: one training piece as verl runs it (forward, log-probs, PPO's clipped
  surrogate with a mask, the loss scaled by the accumulation count, backward, no zero_grad: gradients
  accumulate) minus the plain training call the ``train`` operation is fitted to (zero_grad, forward
  with labels, backward); median paired difference, clipped at 0.
* ``checkpoint_extra_frac``: the plain training call with ``gradient_checkpointing_enable()`` against
  without: median(t_ckpt) / median(t_plain) - 1, clipped at 0.
* ``host_copy_eff``: a pinned host buffer copied to the device and back (CUDA: ``.to(device,
  non_blocking=True)`` of pinned memory, synchronized); on CPU a memcpy of one buffer into another of
  the same size: bytes / median time / the catalog's ``host_link_bw`` of the profile's device.
* ``reshard_eff``: every parameter of the model copied into a separate pre-allocated engine copy
  (``dst.copy_(src)`` per tensor, as an engine's ``load_weights`` does; the model's tensors repeated
  until they pass 64 MiB on CPU, 1 GiB on CUDA, so the copy runs from device memory, not caches):
  2 W / median time / mem_bw.
* ``kv_realloc_s``, ``kv_realloc_s_per_gib``: a KV-cache-sized buffer freed and allocated again at two
  sizes (CUDA: ``del``, ``empty_cache``, ``torch.empty`` on the device, synchronized; CPU: ``torch.empty``
  and a first write of every page, since the OS maps pages at first touch); a line through the two
  medians (intercept and slope per GiB, each clipped at 0).
* ``adv_per_op_s``, ``adv_per_strided_s``, ``adv_per_element_s``, ``adv_per_row_s``: verl's advantage code paths
  on the driver's CPU tensors, one thread (``calibrate.measuring.advbench``, its small shapes). The driver does this work,
  so it is timed on the host CPU whatever the device.
* ``retokenize_s``, ``retokenize_per_token_s``: ``calibrate.measuring.retokenize.Retokenizer`` from the model's
  tokenizer to tiny-deberta's (the actor's ids decoded to text, the texts encoded for the reward model;
  Rust ``tokenizers``) at five (rows, tokens per row) points; least squares of t = a + c x tokens. Host
  CPU work whatever the device.

Timing: ``calibrate.measuring.measure`` (host clock, the device synchronized before each reading; the first call
timed apart and dropped). Runs in a few seconds on a CPU with ``quick``.
"""

from __future__ import annotations

import statistics
import time

import numpy as np
import torch

from calibrate.measuring import advbench
from calibrate.measuring.measure import time_calls
from calibrate.measuring.models import build_hf_model, random_batch
from rlhfsim.costs.stepcosts import GIB, STEP_SCALARS
from rlhfsim.hardware.catalog import GpuSpec
from rlhfsim.models.catalog import ModelShape


def _median(xs) -> float:
    return float(statistics.median(xs))


def _paired(fn_a, fn_b, device: str, iters: int) -> tuple[list[float], list[float]]:
    """Alternating timings of two calls (so drift hits both alike): (samples of a, samples of b)."""
    a, b = [], []
    for fn in (fn_a, fn_b):  # one untimed call each: allocation and first-call costs
        fn()
    for _ in range(iters):
        a += time_calls(fn_a, device=device, warmup=0, iters=1).samples_s
        b += time_calls(fn_b, device=device, warmup=0, iters=1).samples_s
    return a, b


def _forward_piece(shape: ModelShape, device: str, dtype: str, iters: int) -> dict:
    model = build_hf_model(shape, "lm", dtype, device)
    rows, piece, n = 8, 2, 64
    ids, mask = random_batch(shape.vocab, [n] * rows, device, seed=41)

    def plain():
        with torch.no_grad():
            return model(input_ids=ids[:piece], attention_mask=mask[:piece]).logits

    def framework():
        out = []
        with torch.no_grad():
            for i in range(0, piece, piece):  # the piece sliced out of the batch, as verl's split does
                x, m = ids[i:i + piece], mask[i:i + piece]
                logits = model(input_ids=x, attention_mask=m).logits[:, :-1].float()
                lp = torch.log_softmax(logits, dim=-1).gather(-1, x[:, 1:, None]).squeeze(-1)
                out.append(lp.to("cpu", non_blocking=True))
        return torch.cat(out)

    f, p = _paired(framework, plain, device, iters)
    return {"framework_s": f, "plain_s": p, "rows": piece, "tokens": n}


def _train_calls(shape: ModelShape, device: str, iters: int) -> dict:
    model = build_hf_model(shape, "lm", "float32", device).train()
    piece, n = 2, 64
    ids, mask = random_batch(shape.vocab, [n] * piece, device, seed=43)
    old = torch.zeros(piece, n - 1, device=device)
    adv = torch.ones(piece, n - 1, device=device)

    def plain():
        model.zero_grad(set_to_none=True)
        model(input_ids=ids, labels=ids).loss.backward()

    def framework():
        logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1].float()
        lp = torch.log_softmax(logits, dim=-1).gather(-1, ids[:, 1:, None]).squeeze(-1)
        ratio = torch.exp(lp - old)
        surrogate = torch.maximum(-adv * ratio, -adv * torch.clamp(ratio, 0.8, 1.2))
        m = mask[:, 1:].float()
        loss = (surrogate * m).sum() / m.sum() / 4  # scaled by the accumulation count
        loss.backward()

    f, p = _paired(framework, plain, device, iters)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    ckpt = time_calls(plain, device=device, warmup=1, iters=iters).samples_s
    model.gradient_checkpointing_disable()
    again = time_calls(plain, device=device, warmup=1, iters=iters).samples_s
    return {"framework_s": f, "plain_s": p, "checkpointed_s": ckpt, "plain_again_s": again}


def _host_copy(device: str, n_bytes: int, iters: int) -> dict:
    n = n_bytes // 4
    if device.startswith("cuda"):
        host = torch.empty(n, dtype=torch.float32).pin_memory()
        dev = torch.empty(n, dtype=torch.float32, device=device)

        def copy():
            dev.copy_(host, non_blocking=True)
            host.copy_(dev, non_blocking=True)
        moved = 2 * n_bytes
    else:
        src, dst = torch.ones(n, dtype=torch.float32), torch.empty(n, dtype=torch.float32)

        def copy():
            dst.copy_(src)
        moved = n_bytes
    samples = time_calls(copy, device=device, warmup=1, iters=iters).samples_s
    return {"samples_s": samples, "bytes": moved}


def _reshard(shape: ModelShape, device: str, dtype: str, iters: int, min_bytes: int) -> dict:
    model = build_hf_model(shape, "lm", dtype, device)
    params = [p.detach() for p in model.state_dict().values()]
    w = sum(p.numel() * p.element_size() for p in params)
    # copies of the model's tensors until they outgrow the caches (a small model would be copied
    # cache to cache, faster than device memory)
    src = [p.clone() for _ in range(max(-(-min_bytes // w), 1)) for p in params]
    dst = [torch.empty_like(p) for p in src]
    nbytes = sum(p.numel() * p.element_size() for p in src)

    def load():
        for d, s in zip(dst, src):
            d.copy_(s)

    samples = time_calls(load, device=device, warmup=1, iters=iters).samples_s
    return {"samples_s": samples, "weight_bytes": nbytes}


def _kv_realloc(device: str, sizes_gib: tuple[float, float], iters: int) -> dict:
    cuda = device.startswith("cuda")
    out = {}
    for gib in sizes_gib:
        n = int(gib * GIB) // 2
        samples = []
        for _ in range(iters):
            buf = torch.empty(n, dtype=torch.float16, device=device)
            if cuda:
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            del buf
            if cuda:
                torch.cuda.empty_cache()
                buf = torch.empty(n, dtype=torch.float16, device=device)
                torch.cuda.synchronize()
            else:
                buf = torch.empty(n, dtype=torch.float16)
                buf.view(-1)[:: 2048].fill_(0)  # one write per 4 KiB page: the OS maps it on first touch
            samples.append(time.perf_counter() - t0)
            del buf
        out[str(gib)] = samples
    return out


RETOKENIZE_POINTS = ((1, 64), (1, 480), (8, 32), (8, 128), (8, 480))   # (rows, tokens per row)


def _retokenize(shape: ModelShape, iters: int) -> dict:
    """One call of ``calibrate.measuring.retokenize.Retokenizer`` (decode the rows' ids with ``shape``'s tokenizer,
    encode the texts with a reward tokenizer of another family: tiny-deberta's) at each (rows, tokens per
    row) of ``RETOKENIZE_POINTS``; least squares of t = a + c x tokens (a per call, c per token)."""
    from calibrate.measuring.retokenize import Retokenizer
    from rlhfsim.models.catalog import CATALOG

    retok = Retokenizer(shape, CATALOG["tiny-deberta"])
    g = torch.Generator().manual_seed(43)
    med = {}
    for rows, n in RETOKENIZE_POINTS:
        ids = torch.randint(1, shape.vocab, (rows, n), generator=g).tolist()
        med[f"{rows}x{n}"] = _median(time_calls(lambda ids=ids: retok(ids), device="cpu", warmup=1, iters=iters).samples_s)
    x = np.array([[1.0, rows * n] for rows, n in RETOKENIZE_POINTS])
    y = np.array([med[f"{rows}x{n}"] for rows, n in RETOKENIZE_POINTS])
    (a, c), *_ = np.linalg.lstsq(x, y, rcond=None)
    return {"median_s": med, "retokenize_s": max(float(a), 0.0), "retokenize_per_token_s": max(float(c), 0.0),
            "pair": [shape.tokenizer_id, CATALOG["tiny-deberta"].tokenizer_id]}


def measure_step_scalars(device: str, dtype: str, shape: ModelShape, spec: GpuSpec, iters: int = 7) -> dict:
    """``profile["step"]``: every scalar of ``rlhfsim.costs.stepcosts.STEP_SCALARS`` measured here with
    ``iters`` samples per timing (``Grid.step_iters``), the raw samples under ``samples``."""
    iters = max(int(iters), 1)
    cuda = device.startswith("cuda")
    with torch.inference_mode(False):
        fwd = _forward_piece(shape, device, dtype, iters)
        trn = _train_calls(shape, device, iters)
        copy = _host_copy(device, (256 if cuda else 64) * 2**20, iters)
        load = _reshard(shape, device, dtype, iters, (1024 if cuda else 64) * 2**20)
        kv_sizes = (1.0, 4.0) if cuda else (0.0625, 0.25)
        kv = _kv_realloc(device, kv_sizes, max(iters // 2, 1))
        adv = advbench.measure(max(iters // 2, 1), quick=True)
        retok = _retokenize(shape, iters)
    kv_lo, kv_hi = (_median(kv[str(g)]) for g in kv_sizes)
    slope = max((kv_hi - kv_lo) / (kv_sizes[1] - kv_sizes[0]), 0.0)
    step = {
        "microbatch_forward_s": max(_median(a - b for a, b in zip(fwd["framework_s"], fwd["plain_s"])), 0.0),
        "microbatch_train_s": max(_median(a - b for a, b in zip(trn["framework_s"], trn["plain_s"])), 0.0),
        "checkpoint_extra_frac": max(_median(trn["checkpointed_s"]) / _median(trn["plain_again_s"]) - 1.0, 0.0),
        "host_copy_eff": min(copy["bytes"] / _median(copy["samples_s"]) / spec.host_link_bw, 1.5),
        "reshard_eff": min(2 * load["weight_bytes"] / _median(load["samples_s"]) / spec.mem_bw, 1.5),
        "kv_realloc_s": max(kv_lo - slope * kv_sizes[0], 0.0),
        "kv_realloc_s_per_gib": slope,
        **adv["scalars"],
        "retokenize_s": retok["retokenize_s"],
        "retokenize_per_token_s": retok["retokenize_per_token_s"],
    }
    assert set(step) == set(STEP_SCALARS)
    step["host_copy_eff"] = max(step["host_copy_eff"], 1e-6)  # an efficiency is > 0
    step["reshard_eff"] = max(step["reshard_eff"], 1e-6)
    return {**step, "source": "measured", "device": device, "model": shape.name, "dtype": dtype,
            "samples": {"forward_piece": fwd, "train_piece": trn, "host_copy": copy, "reshard_load": load,
                        "kv_realloc": kv, "advantage": adv, "retokenize": retok}}


def main(argv: list[str] | None = None) -> None:
    """``python -m calibrate.measuring.stepbench PROFILE.json [--device cpu|cuda] [--model tiny-qwen2]``: measure
    the step scalars here and write them into the profile (``profile["step"]``) in place."""
    import argparse
    import json

    from rlhfsim.costs.profile import validate_profile
    from rlhfsim.files import write_json_atomic
    from rlhfsim.hardware.catalog import get_gpu
    from rlhfsim.models.catalog import CATALOG

    ap = argparse.ArgumentParser(prog="python -m calibrate.measuring.stepbench", description=main.__doc__)
    ap.add_argument("profile")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--model", default="tiny-qwen2")
    ap.add_argument("--iters", type=int, default=7, help="samples per timing")
    args = ap.parse_args(argv)
    doc = json.loads(open(args.profile).read())
    spec = get_gpu(doc["gpu"], "profile.gpu")
    doc["step"] = measure_step_scalars(args.device, doc.get("dtype", "float32"), CATALOG[args.model], spec,
                                       iters=args.iters)
    validate_profile(doc, args.profile)
    write_json_atomic(args.profile, doc)
    print(json.dumps({k: doc["step"][k] for k in STEP_SCALARS}, indent=1))


if __name__ == "__main__":
    main()
