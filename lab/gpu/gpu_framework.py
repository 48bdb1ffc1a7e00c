"""The framework's calls on a lent GPU, in one prepared run (``python lab/gpu/gpu_framework.py --out DIR``):
what the public per-operation data does not give, for ``rlhfsim.costs.framework`` (issue 47, item 6).

For each model (default ``qwen2.5-0.5b`` and ``qwen2.5-7b`` shapes, random weights, bf16) and each piece size
(``--tokens``, rows of 512 tokens each, so 1, 4 and 16 rows by default):

* ``forward``: one forward-only micro-batch as verl's workers run it: the model over the rows, then verl's
  log-prob head on every position's logits: ``logits.div_(temperature)``, ``log_softmax`` + ``gather`` in float32,
  and ``entropy_from_logits`` (logsumexp - sum(softmax x logits)); under ``torch.no_grad``.
* ``train`` and ``train_ckpt``: one training micro-batch: the same head, a PPO clipped loss with an entropy bonus,
  ``backward``; without and with gradient checkpointing.
* each of the three again with the model wrapped by FSDP (FULL_SHARD, one unit per decoder layer, bf16
  parameters, fp32 gradient reduction: verl's settings) on a one-process group, where nothing is gathered from
  other ranks but every hook runs: ``fsdp_*``, the wrapper's own host time beside the plain call;
* ``reshard``: the trained weights copied into a second model of the same shape (``load_state_dict`` from the
  FSDP full state dict, verl's hybrid engine's copy on one GPU), seconds and bytes.

Every call is timed with CUDA events after one untimed call (its time is kept as ``first_s``), ``--iters`` times,
raw samples kept; a model that does not fit or a piece that fails records its error and the run goes on. The
output is one JSON file, ``DIR/framework.json``, with the device, torch and transformers versions. Needs torch and
transformers only (the device image has no simpy or pydantic). On a CPU (``--device cpu``, for tests) FSDP is
skipped with its reason.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

# Run as a script from a checkout (``python lab/gpu/NAME.py``): the repository root on the import path, so a
# bare device image needs no install; children get it through PYTHONPATH (Session.run).
ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [p for p in (str(ROOT), str(Path(__file__).resolve().parent)) if p not in sys.path]

import torch

from calibrate.measuring.measure import time_calls
from calibrate.measuring.models import build_hf_model, random_batch
from rlhfsim.models.catalog import load_model

ROW_TOKENS = 512
DEFAULT_MODELS = ("qwen2.5-0.5b", "qwen2.5-7b")
DEFAULT_TOKENS = (512, 2048, 8192)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """verl's ``verl.utils.torch_functional.entropy_from_logits``."""
    pd = torch.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - torch.sum(pd * logits, dim=-1)


def head(logits: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """verl's log-prob head: temperature, float32 log-probs of the next tokens, and the entropy."""
    logits = logits[:, :-1].div_(1.0).float()
    lp = torch.log_softmax(logits, dim=-1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    return lp, entropy_from_logits(logits)


def _calls(model, ids, mask):
    """(forward, train) closures over one micro-batch."""
    old = torch.zeros(ids.shape[0], ids.shape[1] - 1, device=ids.device)
    adv = torch.ones_like(old)

    def forward():
        with torch.no_grad():
            return head(model(input_ids=ids, attention_mask=mask).logits, ids)[0]

    def train():
        lp, ent = head(model(input_ids=ids, attention_mask=mask).logits, ids)
        ratio = torch.exp(lp - old)
        loss = torch.maximum(-adv * ratio, -adv * torch.clamp(ratio, 0.8, 1.2)).mean() - 1e-3 * ent.mean()
        loss.backward()

    return forward, train


def _timed(fn, device: str, iters: int) -> dict:
    t0 = time.perf_counter()
    fn()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    first = time.perf_counter() - t0
    samples = time_calls(fn, device=device, warmup=0, iters=iters).samples_s
    return {"first_s": first, "samples_s": samples, "median_s": statistics.median(samples)}


def _fsdp(model, device: str):
    """The model wrapped as verl wraps it (one FSDP unit per decoder layer), or raise with the reason."""
    if not device.startswith("cuda"):
        raise RuntimeError("FSDP measured on CUDA only")
    import torch.distributed as dist
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, MixedPrecision, ShardingStrategy
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    if not dist.is_initialized():
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29517")
        dist.init_process_group("nccl", rank=0, world_size=1)
    layer = type(model.model.layers[0])
    return FSDP(model.float(), auto_wrap_policy=ModuleWrapPolicy({layer}), sharding_strategy=ShardingStrategy.FULL_SHARD,
                mixed_precision=MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.float32,
                                               buffer_dtype=torch.float32),
                device_id=torch.device(device), use_orig_params=False)


def measure_model(name: str, tokens: tuple[int, ...], device: str, iters: int) -> dict:
    """Every piece of one model, plain and under FSDP (module docstring)."""
    shape = load_model(name)
    out: dict = {"model": name, "layers": shape.layers, "params": shape.params("lm"), "pieces": []}
    model = build_hf_model(shape, "lm", "bfloat16", device).train()
    for wrapped in (False, True):
        if wrapped:
            try:
                model = _fsdp(model, device)
            except Exception as e:  # noqa: BLE001 - recorded, the plain pieces stand
                out["fsdp_error"] = f"{type(e).__name__}: {e}"[:300]
                break
        for n in tokens:
            rows = max(n // ROW_TOKENS, 1)
            ids, mask = random_batch(shape.vocab, [min(n, ROW_TOKENS)] * rows, device, seed=n)
            rec = {"fsdp": wrapped, "rows": rows, "tokens": rows * min(n, ROW_TOKENS)}
            for kind in ("forward", "train", "train_ckpt"):
                try:
                    inner = model.module if wrapped else model
                    if kind == "train_ckpt":
                        inner.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
                    fwd, train = _calls(model, ids, mask)
                    rec[kind] = _timed(fwd if kind == "forward" else train, device, iters)
                except Exception as e:  # noqa: BLE001 - an out-of-memory piece is a result, not the end of the run
                    rec[kind] = {"error": f"{type(e).__name__}: {e}"[:300]}
                finally:
                    if kind == "train_ckpt":
                        (model.module if wrapped else model).gradient_checkpointing_disable()
                    model.zero_grad(set_to_none=True)
                    if device.startswith("cuda"):
                        torch.cuda.empty_cache()
            out["pieces"].append(rec)
            print(f"{name} fsdp={wrapped} tokens={rec['tokens']}: " + ", ".join(
                f"{k} {rec[k]['median_s'] * 1e3:.1f} ms" if "median_s" in rec[k] else f"{k} failed"
                for k in ("forward", "train", "train_ckpt")), flush=True)
    out["reshard"] = _reshard(model, shape, device, iters)
    return out


def _reshard(model, shape, device: str, iters: int) -> dict:
    """The trained weights into a second model of the shape (verl's hybrid engine's copy on one GPU)."""
    try:
        if hasattr(model, "module"):  # FSDP: the full state dict, gathered (from one rank here)
            from torch.distributed.fsdp import FullStateDictConfig, FullyShardedDataParallel as FSDP, StateDictType
            with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT, FullStateDictConfig(offload_to_cpu=False)):
                state = model.state_dict()
        else:
            state = model.state_dict()
        target = build_hf_model(shape, "lm", "bfloat16", device)
        nbytes = sum(v.numel() * v.element_size() for v in state.values())
        return {"bytes": nbytes, **_timed(lambda: target.load_state_dict(state, strict=False), device, iters)}
    except Exception as e:  # noqa: BLE001
        return {"error": f"{type(e).__name__}: {e}"[:300]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python lab/gpu/gpu_framework.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="directory for framework.json")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--models", default=",".join(DEFAULT_MODELS), help="catalog names, comma-separated")
    ap.add_argument("--tokens", default=",".join(map(str, DEFAULT_TOKENS)), help="piece sizes in tokens")
    ap.add_argument("--iters", type=int, default=5)
    a = ap.parse_args(argv)
    try:
        tokens = tuple(int(t) for t in a.tokens.split(","))
        if not tokens or min(tokens) < 2:
            raise ValueError
    except ValueError:
        print(f"--tokens: expected comma-separated whole numbers >= 2, got {a.tokens!r}", file=sys.stderr)
        return 2
    if a.device.startswith("cuda") and not torch.cuda.is_available():
        print("--device: cuda asked for, but torch sees no CUDA device", file=sys.stderr)
        return 2
    out_dir = Path(a.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    import transformers
    doc = {"device": torch.cuda.get_device_name(0) if a.device.startswith("cuda") else a.device,
           "torch": torch.__version__, "transformers": transformers.__version__, "iters": a.iters,
           "row_tokens": ROW_TOKENS, "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "models": []}
    path = out_dir / "framework.json"
    for name in a.models.split(","):
        try:
            doc["models"].append(measure_model(name.strip(), tokens, a.device, a.iters))
        except Exception as e:  # noqa: BLE001 - the next model still runs, and what ran is written
            doc["models"].append({"model": name, "error": f"{type(e).__name__}: {e}"[:300]})
        path.write_text(json.dumps(doc, indent=1))  # after every model: a cut run keeps what it measured
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
