"""Where a GPU step's time goes: the calibration's own operations against the executor's, one process.

``python lab/diagnostics/gpu_parts.py --device cuda --model qwen2.5-0.5b --out parts.json``

The first H200 validation (docs/accuracy.md, "H200") measured every phase 1.4-10x its price from the
bundled ``h200-measured`` profile, calibrated on another lease with another transformers. This measures,
in one process and in interleaved rounds (medians), each operation twice: the way the calibration timed
it (the profile's points: ``calibrate.measuring.genbench``'s decode round, ``calibrate.measuring.bench``'s decode and
training points) and the way the executor runs it in a step (``calibrate.executor``):

- ``dispatch``: host speed, 2,000 one-element additions on the device (microseconds per launch) and a
  pure-Python loop (no device), the two rates a small model's step is bound by;
- ``hf_generate``: per decode step, ``generate()`` on uniform prompts with no stopping criterion or
  recorder (the calibration's ``decode:hf_generate`` point: a call of 1 + n tokens less a call of 1),
  against the executor's call (left-padded prompts, ``RowStop`` and ``LogprobRecorder``);
- ``kv_decoder``: one decode step of ``StaticKVDecoder`` plus ``sample_next`` (the calibration's
  ``decode`` point and the executor's step alike) at the same rows and context;
- ``train``: one minibatch the calibration's way (float32 weights, bf16 autocast, Hugging Face's loss on
  ``labels``, backward; its AdamW step timed apart) against the executor's (weights in the model dtype,
  ``token_logprobs`` + PPO loss on right-padded rows, backward, AdamW step).

Each part's seconds per call are written with the shapes and the package versions; nothing is fitted.
``--device cpu --model tiny-qwen2`` rehearses it here in seconds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from calibrate.measuring.decoder import StaticKVDecoder, sample_next  # noqa: E402
from calibrate.executor import training as T  # noqa: E402
from calibrate.executor.timing import Clock  # noqa: E402
from calibrate.genruntimes.base import left_pad  # noqa: E402
from calibrate.genruntimes.hf_generate import HfGenerate, LogprobRecorder, RowStop  # noqa: E402
from calibrate.measuring.models import build_hf_model  # noqa: E402
from rlhfsim.models.catalog import load_model  # noqa: E402


def rounds(fns: dict, n: int, dev) -> dict:
    """Each of ``fns`` once per round, ``n`` rounds after one warm-up round: per name, the median seconds."""
    out = {k: [] for k in fns}
    clock = Clock(dev)   # the executor's clock: the stream synchronised before each reading
    for r in range(n + 1):
        for k, fn in fns.items():
            t0 = clock.now()
            fn()
            t = clock.now() - t0
            if r:
                out[k].append(t)
    return {k: {"median_s": statistics.median(v), "samples_s": v} for k, v in out.items()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--model", default="qwen2.5-0.5b")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--rows", type=int, default=16, help="Generation rows (the scenarios' max_batch).")
    ap.add_argument("--context", type=int, default=512, help="Prompt tokens before decoding.")
    ap.add_argument("--new", type=int, default=32, help="Decode steps per generate() call.")
    ap.add_argument("--train-rows", type=int, default=8)
    ap.add_argument("--train-len", type=int, default=512)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    dev = torch.device(a.device)
    dt = getattr(torch, a.dtype)
    shape = load_model(a.model)
    res: dict = {"args": vars(a), "torch": torch.__version__}
    import transformers
    res["transformers"] = transformers.__version__
    if dev.type == "cuda":
        res["gpu"] = torch.cuda.get_device_name(dev)

    def save():
        Path(a.out).write_text(json.dumps(res, indent=1))

    # -- host speed
    x = torch.zeros(1, device=dev)

    def adds():
        y = x
        for _ in range(2000):
            y = y + 1
        return y

    def pyloop():
        s = 0
        for i in range(200_000):
            s += i
        return s
    r = rounds({"adds_2000": adds, "python_200k": pyloop}, a.rounds, dev)
    res["dispatch"] = {"us_per_launch": r["adds_2000"]["median_s"] / 2000 * 1e6,
                       "python_200k_s": r["python_200k"]["median_s"], "raw": r}
    print(f"dispatch: {res['dispatch']['us_per_launch']:.2f} us/launch, python loop {r['python_200k']['median_s'] * 1e3:.1f} ms", flush=True)
    save()

    # -- hf_generate: the calibration's decode point against the executor's call
    g = torch.Generator().manual_seed(3)
    model = build_hf_model(shape, "lm", dt, dev, seed=1)
    rt = HfGenerate()
    rt.load(model, shape, max_batch=a.rows, max_len=a.context + a.new + 8)
    uni = torch.randint(1, shape.vocab, (a.rows, a.context), generator=g).to(dev)
    umask = torch.ones_like(uni)
    lens = [a.context - (i * a.context // (4 * a.rows)) for i in range(a.rows)]   # prompts 75-100% of the width
    pids, pmask = left_pad([torch.randint(1, shape.vocab, (n,), generator=g).tolist() for n in lens], dev)

    def cal_short():
        rt.generate(uni, umask, 1).sequences[:, -1:].tolist()

    def cal_long():
        rt.generate(uni, umask, 1 + a.new).sequences[:, a.context:].tolist()

    def executor_call():
        rec = LogprobRecorder()
        stop = RowStop([1 + a.new] * a.rows, dev, recorder=rec)
        gen = rt.generate(pids, pmask, 1 + a.new, stopping=(stop,), processors=(rec,))
        gen.sequences[:, pids.shape[1]:].tolist()
        rec.logprobs()

    def executor_short():
        rec = LogprobRecorder()
        stop = RowStop([1] * a.rows, dev, recorder=rec)
        rt.generate(pids, pmask, 1, stopping=(stop,), processors=(rec,)).sequences[:, -1:].tolist()
        rec.logprobs()

    with torch.no_grad():
        r = rounds({"cal_short": cal_short, "cal_long": cal_long, "exec_short": executor_short,
                    "exec_long": executor_call}, a.rounds, dev)
    res["hf_generate"] = {
        "rows": a.rows, "context": a.context, "new": a.new,
        "cal_decode_step_s": (r["cal_long"]["median_s"] - r["cal_short"]["median_s"]) / a.new,
        "exec_decode_step_s": (r["exec_long"]["median_s"] - r["exec_short"]["median_s"]) / a.new,
        "cal_call_s": r["cal_long"]["median_s"], "exec_call_s": r["exec_long"]["median_s"], "raw": r}
    h = res["hf_generate"]
    print(f"hf_generate decode step: calibration {h['cal_decode_step_s'] * 1e3:.2f} ms, executor {h['exec_decode_step_s'] * 1e3:.2f} ms", flush=True)
    save()

    # -- training: the calibration's point against the executor's minibatch (model reused as the executor's actor)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
    ids = torch.randint(1, shape.vocab, (a.train_rows, a.train_len), generator=g).to(dev)
    tlens = [a.train_len - (i * a.train_len // (3 * a.train_rows)) for i in range(a.train_rows)]

    class _S:
        def __init__(self, n):
            self.prompt = torch.randint(1, shape.vocab, (n // 4,), generator=g).tolist()
            self.tokens = torch.randint(1, shape.vocab, (n - n // 4,), generator=g).tolist()
    seqs = [_S(n) for n in tlens]
    b = T.pack(seqs, dev)
    old = b.scatter([torch.full((len(s.tokens),), -5.0, device=dev) for s in seqs])
    adv = b.scatter([torch.full((len(s.tokens),), 0.5, device=dev) for s in seqs])

    def exec_train():
        logp = T.token_logprobs(model, b)
        loss = T.actor_loss(logp, old, old, adv, b.resp)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    def exec_fwd_loss():
        logp = T.token_logprobs(model, b)
        loss = T.actor_loss(logp, old, old, adv, b.resp)
        opt.zero_grad(set_to_none=True)
        loss.backward()

    def exec_opt():
        opt.step()

    fmodel = build_hf_model(shape, "lm", "float32", dev, seed=1).train()
    fopt = torch.optim.AdamW(fmodel.parameters(), lr=1e-6)
    auto = (lambda: torch.autocast("cuda", dtype=dt)) if dev.type == "cuda" and dt != torch.float32 else None

    def cal_train():
        fmodel.zero_grad(set_to_none=True)
        if auto:
            with auto():
                loss = fmodel(input_ids=ids, labels=ids).loss
        else:
            loss = fmodel(input_ids=ids, labels=ids).loss
        loss.backward()

    def cal_opt():
        fopt.step()

    def cal_labels_model_dtype():
        model.zero_grad(set_to_none=True)
        model(input_ids=ids, labels=ids).loss.backward()

    r = rounds({"exec_train": exec_train, "exec_fwd_bwd": exec_fwd_loss, "exec_opt": exec_opt, "cal_train": cal_train,
                "cal_opt": cal_opt, "labels_in_model_dtype": cal_labels_model_dtype}, a.rounds, dev)
    res["train"] = {"rows": a.train_rows, "width": a.train_len, "exec_lengths": tlens,
                    **{k: v["median_s"] for k, v in r.items()}, "raw": r}
    if dev.type == "cuda":
        res["train"]["max_memory_allocated_gib"] = torch.cuda.max_memory_allocated(dev) / 2**30
    t = res["train"]
    print("train: " + ", ".join(f"{k} {t[k] * 1e3:.1f} ms" for k in r), flush=True)
    del fmodel, fopt, opt
    model.eval()
    save()

    # -- kv_decoder: one decode step at the same rows and context
    dec = StaticKVDecoder(shape, dtype=dt, device=str(dev), max_slots=a.rows, max_len=a.context + 64, seed=1)
    slots = torch.arange(a.rows)
    dec.reset(slots)
    dec.extend(slots, uni)
    nxt = torch.ones((a.rows, 1), dtype=torch.long, device=dev)

    def kv_step():
        dec.positions[slots] = a.context
        sample_next(dec.extend(slots, nxt))

    r = rounds({"kv_step": kv_step}, max(a.rounds * 4, 8), dev)
    res["kv_decoder"] = {"rows": a.rows, "context": a.context, "decode_step_s": r["kv_step"]["median_s"], "raw": r}
    print(f"kv_decoder decode step: {res['kv_decoder']['decode_step_s'] * 1e3:.2f} ms", flush=True)
    save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
