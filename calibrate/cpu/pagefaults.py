"""Page faults of large tensors on a CPU: what a log-prob pass pays beyond its arithmetic.

Found on generated validation scenarios (``rlhfsim validate --generate``): the
reference pass and actor training of small-vocabulary models with long padded minibatches took up to
2.6x their price, and the excess grew with the size of the logits tensor, not with the model. Timed
apart, the LM head and the log-softmax over logits of 14 x 200 x 4,096 (44 MiB) cost 2.2 ns per logit,
over 8 x 128 x 4,096 (16 MiB) 0.5 ns. PyTorch's CPU allocator takes memory from glibc's ``malloc``, which
serves a request above its mmap threshold (32 MiB at most, adjusted at run time) with fresh pages from
the kernel and returns them on ``free``; every such tensor is faulted in page by page, zero-filled, each
time it is allocated. Below the threshold the heap reuses the same pages and nothing faults. So a tensor
of the logits' size costs about 0.2 ns per byte on top of its arithmetic on this VM, once for every such
tensor an operation allocates, and only when it is larger than the threshold.

Measured here (``measure_page_faults``; ``kernels.page_faults`` in the profile):

- ``fault_s_per_byte``: a fresh allocation filled, less the same fill of a reused tensor, per byte,
  median over 64, 96 and 128 MiB;
- ``threshold_bytes``: the largest size of a ladder (8-128 MiB) below the first from which every larger
  size faults (a fresh fill costing a third of ``fault_s_per_byte`` or more); tensors larger than it
  fault (sizes below glibc's largest threshold fault in some runs and not others: not priced);
- ``tensors``: how many logits-sized tensors each pattern faults in per call, counted by the process's
  minor page faults (``ru_minflt`` x the page size) over the bytes of its float32 logits, on a model of
  the first calibrated decoder's family with one layer of width 64 and a 16,384-entry vocabulary (so that
  its other tensors stay far under the threshold), 8 rows of 192 tokens, 96 MiB of logits: ``logprob_forward`` (the reference and
  old-log-prob pass of the executor and of TRL: ``logits[:, :-1].float().log_softmax(-1).gather``, about 3),
  ``logprob_train`` (the same with its backward, about 6.5) and ``labels_train`` (the calibration's
  ``train`` points: Hugging Face's loss on ``labels``), measured, not read from the code, since kernels
  allocate tensors of their own (``log_softmax`` copies a non-contiguous input) that no Python-level
  count sees.

- ``logprob_tail`` (``measure_logprob_tail``): the log-softmax and gather after the LM head, timed alone on
  logits already in memory, in seconds per logit; it runs after the head's product, so the simulator adds it to
  a pass with every logit instead of counting its bytes inside the roofline's max with the pass's FLOPs, where
  the FLOPs hid it (3-10% of the generated scenarios' reference passes).

The simulator adds ``tensors x logits bytes x fault_s_per_byte`` to a forward pass with every logit
(``CostModel.forward``, ``all_logits``) and to a training pass of an LM head (``train``)
whenever one logits tensor of the call is above the threshold; the fit of ``train`` takes the
``labels_train`` faults off its points (``calibrate.fitting.fit.fitted_value``). CPU only: CUDA's caching
allocator keeps its blocks, and a profile without the key prices nothing.
"""

from __future__ import annotations

import os
import resource
from dataclasses import replace
import statistics

import torch

from calibrate.measuring.devstate import median_call_s
from rlhfsim.costs.cpuhost import FAULT_PATTERNS
from rlhfsim.models.catalog import ModelShape

LADDER_MIB = (8, 16, 24, 32, 40, 48, 64, 96, 128)
TOP_MIB = (64, 96, 128)      # sizes whose per-byte excess is the fault cost
COUNT_LOGITS_MIB = 96        # the float32 logits the counting shape aims at
PATTERNS = FAULT_PATTERNS


def fault_costs(calls: int = 9) -> dict:
    """Per ladder size (MiB): seconds per byte of a fresh allocation's fill beyond a reused one's."""
    out = {}
    for mib in LADDER_MIB:
        n = mib * 2**20 // 4
        pre = torch.empty(n)
        fresh = median_call_s(lambda: torch.empty(n).fill_(1.0), calls)
        reuse = median_call_s(lambda: pre.fill_(1.0), calls)
        out[mib] = max(fresh - reuse, 0.0) / (n * 4)
        del pre
    return out


def threshold_of(costs: dict[int, float], per_byte: float) -> int:
    """Bytes: the largest ladder size below the first one from which every larger size faults (a fresh
    fill costing a third of ``per_byte`` or more). Below glibc's largest threshold a size may fault in
    one run and not in the next (the threshold and the heap's trimming move with what was freed before),
    so only the sizes that always fault count."""
    sizes = sorted(costs)
    first = len(sizes)
    while first > 0 and costs[sizes[first - 1]] >= per_byte / 3:
        first -= 1
    return (sizes[first - 1] if first > 0 else 0) * 2**20


def _minflt() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def count_tensors(fn, logits_bytes: int) -> float:
    """Logits-sized tensors faulted in by one call of ``fn`` (after two untimed calls): the minor page
    faults of the call times the page size, over ``logits_bytes``; the median of three calls."""
    page = os.sysconf("SC_PAGE_SIZE")
    fn()
    fn()
    counts = []
    for _ in range(3):
        f0 = _minflt()
        fn()
        counts.append((_minflt() - f0) * page / logits_bytes)
    return statistics.median(counts)


def pattern_calls(model, ids: torch.Tensor) -> dict:
    """The three patterns of the module docstring on ``model`` (an LM-head decoder) and ``ids``."""
    attn = torch.ones_like(ids)

    def logprob_forward():
        with torch.no_grad():
            lg = model(input_ids=ids, attention_mask=attn).logits[:, :-1].float()
            return lg.log_softmax(-1).gather(-1, ids[:, 1:, None])

    def logprob_train():
        model.zero_grad(set_to_none=True)
        lg = model(input_ids=ids, attention_mask=attn).logits[:, :-1].float()
        lp = lg.log_softmax(-1).gather(-1, ids[:, 1:, None])[..., 0]
        (-lp.mean()).backward()

    def labels_train():
        model.zero_grad(set_to_none=True)
        model(input_ids=ids, labels=ids).loss.backward()

    return {"logprob_forward": logprob_forward, "logprob_train": logprob_train, "labels_train": labels_train}


COUNT_VOCAB = 16384          # the counting model's vocabulary: 96 MiB of logits in 8 x 192 tokens


def count_shape(decoders: list[ModelShape]) -> ModelShape:
    """The model the tensors are counted on: the first calibrated decoder's family (its Hugging Face
    code path, tied or untied embeddings), one layer of width 64 and a vocabulary of ``COUNT_VOCAB``, so
    that the logits are the only tensors of the call above the threshold and the count takes a fraction
    of a second whatever the calibrated models are (the count is of the pattern's allocations, which do
    not depend on the body)."""
    base = decoders[0]
    return replace(base, name=f"{base.name}-pagefaults", layers=1, hidden=64, intermediate=128, heads=1,
                   kv_heads=1, vocab=COUNT_VOCAB)


def measure_page_faults(shape: ModelShape, threads: int | None = None, calls: int = 9) -> dict:
    """``kernels.page_faults`` on this CPU (see the module docstring), counting with ``shape``'s model."""
    from calibrate.measuring.models import build_hf_model

    old = torch.get_num_threads()
    if threads:
        torch.set_num_threads(int(threads))
    try:
        costs = fault_costs(calls)
        per_byte = statistics.median(costs[m] for m in TOP_MIB)
        threshold = threshold_of(costs, per_byte)
        rows = 8
        seq = max(16, int(COUNT_LOGITS_MIB * 2**20 / (4 * rows * shape.vocab)))
        ids = torch.randint(1, shape.vocab, (rows, seq), generator=torch.Generator().manual_seed(31))
        model = build_hf_model(shape, "lm", "float32", "cpu").train()
        with torch.inference_mode(False):
            logits_bytes = rows * seq * shape.vocab * 4
            tensors = {name: count_tensors(fn, logits_bytes) for name, fn in pattern_calls(model, ids).items()}
        del model
        tail = measure_logprob_tail(per_byte, calls)
    finally:
        torch.set_num_threads(old)
    thp = _thp()
    return {"fault_s_per_byte": per_byte, "threshold_bytes": threshold, "tensors": tensors, "logprob_tail": tail,
            "ladder_s_per_byte": {str(m): c for m, c in costs.items()},
            "count_shape": {"model": shape.name, "rows": rows, "seq_len": seq, "vocab": shape.vocab,
                            "logits_bytes": logits_bytes},
            "page_bytes": os.sysconf("SC_PAGE_SIZE"), "transparent_hugepage": thp, "threads": int(threads or old),
            "source": "measured",
            "method": "fresh-vs-reused fill per byte (64-128 MiB); threshold: the ladder size below the first "
                      "that faults; tensors: minor page faults x page size / float32 logits bytes per call"}


TAIL_SHAPES = ((1024, 2), (1024, 8), (1024, 16), (8192, 2), (8192, 8), (8192, 16))   # (vocab, MiB of logits)
TAIL_ROWS = 4


def measure_logprob_tail(fault_s_per_byte: float = 0.0, calls: int = 9) -> dict:
    """``kernels.page_faults.logprob_tail``: what the executor's (and TRL's) log-prob pass does after its LM head,
    ``logits[:, :-1].float().log_softmax(-1).gather(-1, targets)``, timed alone on logits already in memory, per
    logit (one vocabulary entry of one position). The pass runs after the head's product, not beside it, so a
    roofline that takes the max of the pass's FLOPs and bytes hides it; measured here at 2-16 MiB of float32 logits
    and two vocabularies (the generated scenarios' range), below the allocator's threshold, with whatever minor page
    faults its calls took subtracted at ``fault_s_per_byte`` (the faults are priced apart). On the 2-vCPU VM
    0.34-0.66 ns per logit wherever nothing faulted. ``s_per_logit``: the median
    over the shapes."""
    page = os.sysconf("SC_PAGE_SIZE")
    points = []
    g = torch.Generator().manual_seed(7)
    for vocab, mib in TAIL_SHAPES:
        seq = max(2, int(mib * 2**20 / (4 * TAIL_ROWS * vocab)))
        logits = torch.randn(TAIL_ROWS, seq, vocab, generator=g)
        targets = torch.randint(0, vocab, (TAIL_ROWS, seq - 1, 1), generator=g)

        def tail():
            return logits[:, :-1].float().log_softmax(-1).gather(-1, targets)

        tail()   # the first calls of a new size grow the heap; count the faults of the calls after them
        tail()
        f0 = _minflt()
        s = median_call_s(tail, calls)
        faulted = (_minflt() - f0) * page / (calls + 2)
        n = TAIL_ROWS * (seq - 1) * vocab
        net = max(s - faulted * fault_s_per_byte, 0.0)
        points.append({"vocab": vocab, "rows": TAIL_ROWS, "seq_len": seq, "logits_mib": round(TAIL_ROWS * seq * vocab * 4 / 2**20, 2),
                       "s": s, "fault_bytes_per_call": faulted, "s_per_logit": net / n})
        del logits, targets
    return {"s_per_logit": statistics.median(p["s_per_logit"] for p in points), "points": points,
            "method": "logits[:, :-1].float().log_softmax(-1).gather on float32 logits already in memory; median of "
                      f"{calls} calls per shape after two, less its minor faults x fault_s_per_byte; median per logit over the shapes"}


def _thp() -> str | None:
    """The kernel's transparent huge page mode (``[madvise]`` here): with ``always`` one fault may map
    2 MiB, and counting faults x 4 KiB would under-count the tensors."""
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            return f.read().strip()
    except OSError:
        return None
