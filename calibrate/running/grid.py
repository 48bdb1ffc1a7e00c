"""What a calibration measures: the grid of (batch, length) points per operation, and the default models.

Shapes are (batch, tokens per sequence). Decode contexts are cached tokens per sequence; chunk points are
(batch, prefix tokens already cached, chunk tokens). Quick grids cover what the validation scenarios use
(batch 1-16, prompts and responses up to ~512 tokens); full grids add larger batches and lengths.

``quiet_wait_s`` (CPU) bounds how long a point waits for other processes to leave the cores alone
(``calibrate.running.session``), ``quiet_budget_s`` the seconds a whole calibration spends waiting so and measuring
disturbed points again (None: unbounded; on a host kept busy throughout, waiting only multiplies the time).
``point_budget_s`` bounds a point's timed samples: after ``min_iters`` samples, sampling stops once they
sum past the budget (at most ``max_iters``); ``bursts`` and ``burst_gap_s`` spread them over time
(``calibrate.measuring.measure.spread``: on a VM whose speed wanders from second to second). ``passes`` measures the
whole grid that many times over and pools each point's samples (``calibrate.running.journal.merge_passes``), so
every operation's samples span the whole calibration rather than the minute its turn came in (the
budget is per pass). ``runtime_models`` limits non-eager scoring runtimes to the
first N reward models of each family (None: all); the runtimes named in ``static_shape_runtimes``, whose
compiled artifacts are per input shape (AOTInductor packages: about 25 s of compilation per shape on two
CPU cores), measure ``runtime_score_static`` instead of ``runtime_score``. Scoring runtimes of one
(batch, length) are measured together in ``rounds`` interleaved rounds of ``per_round`` timed calls each
(``calibrate.measuring.interleave``), in ``launches`` separate process launches when > 1 (``calibrate.measuring.launch``).

Generation runtimes (``calibrate.measuring.genbench``; names in ``rlhfsim.costs.genruntimes.GEN_RUNTIMES``):
``gen_runtimes`` are measured on every decoder model: ``gen_prefill`` (batch, prompt tokens) one
``generate()`` call of one new token; ``gen_decode`` (batch, mean cached tokens per row over the timed
steps) the difference of calls of 1 and 1 + ``gen_decode_steps`` new tokens; ``handoff`` (batch, prompt
tokens, new tokens N, chunk k) N tokens in N/k calls against one call; ``gen_pad`` (batch, prompt width,
runtimes that take an attention mask) decode steps on left-padded prompts against uniform ones;
``gen_point_budget_s`` bounds each of these points (their samples are differences of two calls, so they
need more of them).
``handoff`` and ``gen_pad`` points, whose fits (a + c x batch) read no model, are taken on the first
``gen_host_models`` decoder models only (None: all).
Runtimes that compile per shape (``hf_static``: 15-45 s of compilation on two CPU cores) measure only the
points whose batch is ``gen_compiled_batch`` (None: all) on the first ``gen_compiled_models`` decoder
models (None: all).
``kv_decoder``'s costs are the plain ``prefill``/``decode`` points; it is only checked for correctness.

Co-running in the hand-over pattern (``calibrate.cpu.corun``): ``handover`` entries (runtime, actor, reward
model, batch, prompt, chunk), the actor generating with the runtime and handing each row's chunk to a
scorer thread at its boundary. The quick CPU grid measures ``kv_decoder`` and ``hf_generate`` at one
shape; the GPU grids measure none yet (a reward model sharing the actor's GPU is the exception there:
OPPO's scorer has a GPU of its own).

Sampling tails (``calibrate.measuring.sampling``): ``sampling`` (rows, vocabulary) points of the cost of turning
one step's logits into tokens, per generation runtime of the grid that has a sampler of its own
(``kv_decoder``, ``hf_generate``); vocabularies span the catalog's (CPU: 1,024-16,384; GPU: up to
Qwen's 151,936), so an unmeasured vocabulary is priced inside the measured range.

CPU host effects (``rlhfsim.costs.cpuhost``; the CPU grids only, ``CPU_ONLY_FIELDS``: a GPU price never applies
them). GEMM weight passes (``calibrate.cpu.gemm``): ``gemm`` (rows, out features, in features) linear-layer points at
1 row and more, whose time ratio is the passes over the weights a decode step of two rows or more makes;
again with each matrix cycled through copies adding up to ``gemm_footprints_mib`` (the passes
by the weights' footprint, in cache and beyond it).
Training rate by width (``calibrate.cpu.widths``): ``widths``, each a forward + backward of 1 and 3 layers of
that width (MLP ratio ``width_mlp_ratio``, ``width_tokens`` tokens), whose per-layer rates relative to the
fastest divide a training pass's body FLOPs.

Re-encode scoring (``calibrate.measuring.reencode``, encoder reward models only): one response's prefixes of the
lengths ``reencode_lengths``, each a batch-1 call from scratch, every scoring runtime interleaved at each
length; runtimes compiled per input shape take ``reencode_static_lengths`` only.

Roles (``rlhfsim validate``'s calibration of a scenario's own models): ``actor_models`` names the decoder
shapes measured as actors (prefill, decode, generation runtimes, LM-head training) and ``critic_models``
those measured with value-head training; a shape outside both (a reward model) is measured as a scorer
only (scoring, chunked scoring). None (the default) measures every decoder in every role.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

from rlhfsim.costs.genruntimes import GEN_RUNTIMES
from rlhfsim.errors import RlhfsimError

Shape2 = tuple[int, int]


@dataclass(frozen=True)
class Grid:
    """The measured points of one calibration (see the module docstring)."""

    score: tuple[Shape2, ...]
    runtime_score: tuple[Shape2, ...]
    runtime_score_static: tuple[Shape2, ...]
    strategies: tuple[Shape2, ...]                  # (batch, max length); lengths drawn in [max/8, max]
    prefill: tuple[Shape2, ...]
    decode: tuple[Shape2, ...]
    chunk_batches: tuple[int, ...]
    chunk_prefixes: tuple[int, ...]
    chunk_sizes: tuple[int, ...]
    train: tuple[Shape2, ...]
    interference: tuple[tuple[int, int, int, int], ...]  # (decode batch, decode context, prefill batch, prefill length)
    warmup: int = 1
    min_iters: int = 3
    max_iters: int = 20
    point_budget_s: float = 0.5
    runtime_models: int | None = 1
    static_shape_runtimes: tuple[str, ...] = ("aoti_python", "aoti_cpp")
    rounds: int = 6                                 # scoring runtimes of one shape: interleaved rounds ...
    per_round: int = 2                              # ... of this many timed calls each (calibrate.measuring.interleave)
    launches: int = 1                               # ... in this many separate process launches
    interference_s: float = 2.0                     # how long the co-running phase lasts
    quiet_wait_s: float = 0.0                       # CPU: longest wait per point for other processes to calm down
    quiet_budget_s: float | None = None             # ... and for all points together, with their retakes (None: no cap)
    passes: int = 1                                 # measure the whole grid this many times, samples pooled
    bursts: int = 1                                 # timed samples of a point taken in this many bursts ...
    burst_gap_s: float = 0.0                        # ... this far apart (calibrate.measuring.measure.spread)
    gen_runtimes: tuple[str, ...] = tuple(GEN_RUNTIMES)   # generation runtimes (calibrate.measuring.genbench)
    gen_prefill: tuple[Shape2, ...] = ((4, 64),)    # (batch, prompt tokens)
    gen_decode: tuple[Shape2, ...] = ((4, 64),)     # (batch, mean cached tokens per row)
    gen_decode_steps: int = 15                      # K: a decode step = (t(1 + K tokens) - t(1 token)) / K
    handoff: tuple[tuple[int, int, int, int], ...] = ((4, 32, 32, 8),)  # (batch, prompt, N new tokens, chunk k)
    # left padding (runtimes taking an attention mask: hf_generate, hf_static): (batch, prompt width) of
    # decode steps on left-padded prompts against the same steps on uniform ones (calibrate.measuring.genbench)
    gen_pad: tuple[Shape2, ...] = ((4, 64), (16, 64), (4, 256))
    gen_compiled_batch: int | None = None           # compiled runtimes: only points of this batch (None: all)
    gen_compiled_models: int | None = 1             # ... on the first N decoder models (None: all)
    gen_host_models: int | None = None              # handoff and pad points (fits that read no model): first N decoders
    gen_point_budget_s: float | None = None         # a generation point's budget (None: point_budget_s)
    step_iters: int = 7                             # samples per step-scalar timing (calibrate.measuring.stepbench; 0: skip)
    reencode_lengths: tuple[int, ...] = (16, 32, 64, 128, 224, 352, 480)  # encoder reward models: a growing prefix re-encoded
    reencode_static_lengths: tuple[int, ...] = (32, 128, 224, 352, 480)  # ... those runtimes compiled per shape take
    actor_models: tuple[str, ...] | None = None     # decoders measured as actors (generation, LM training); None: all
    critic_models: tuple[str, ...] | None = None    # decoders measured with value-head training; None: all
    # co-running in the hand-over pattern (calibrate.cpu.corun): (generation runtime, actor, reward model,
    # batch, prompt tokens, chunk tokens); "" names the first actor decoder / the first decoder
    handover: tuple[tuple[str, str, str, int, int, int], ...] = ()
    # sampling tails (calibrate.measuring.sampling): (rows, vocabulary) of each point, per runtime measured
    sampling: tuple[Shape2, ...] = ()
    # GEMM weight passes (calibrate.cpu.gemm): (rows, out features, in features) of each linear-layer point
    gemm: tuple[tuple[int, int, int], ...] = ()
    # ... and again with each matrix cycled through distinct copies adding up to these footprints, MiB
    # (a decode step's weights stay in cache only while the model fits there; calibrate.cpu.gemm)
    gemm_footprints_mib: tuple[int, ...] = ()
    # training rate by width (calibrate.cpu.widths): widths, their MLP ratio and the tokens of each point
    widths: tuple[int, ...] = ()
    width_mlp_ratio: int = 3
    width_tokens: int = 512
    width_mlp_ratios: tuple[int, ...] = ()   # further MLP ratios the widths are measured at (issue 16)
    # page faults of large tensors (calibrate.cpu.pagefaults): measured on a CPU with decoders
    page_faults: bool = False

    def chunk_points(self) -> list[tuple[int, int, int]]:
        """(batch, prefix, chunk) of every chunked point, plus the one-shot prefill (prefix 0, prefix +
        chunk tokens) it is compared with."""
        out: list[tuple[int, int, int]] = []
        for b in self.chunk_batches:
            for p in self.chunk_prefixes:
                for c in self.chunk_sizes:
                    for pt in ((b, p, c), (b, 0, p + c)):
                        if pt not in out:
                            out.append(pt)
        return out

    def max_context(self) -> int:
        lens = [n for _, n in self.prefill] + [n + self.max_iters + self.warmup + 2 for _, n in self.decode]
        lens += [p + c for _, p, c in self.chunk_points()] + [n + 2 for _, n, _, _ in self.interference]
        lens += [n for _, _, _, n in self.interference]
        lens += [p + c * 8 + 2 for _, _, _, _, p, c in self.handover]
        return max(lens)


SCORE_SMALL = ((1, 32), (1, 128), (1, 512), (4, 32), (4, 128), (4, 512), (16, 32), (16, 128))

QUICK_CPU = Grid(
    score=SCORE_SMALL,
    runtime_score=((1, 128), (4, 128), (16, 128), (4, 512)),
    runtime_score_static=((4, 128),),
    strategies=((8, 128), (8, 256)),
    prefill=((1, 32), (1, 128), (1, 512), (4, 32), (4, 128), (4, 512), (16, 32), (16, 128)),
    decode=((1, 64), (1, 512), (4, 256), (16, 64), (16, 512)),
    # two prefixes (none, and one past the chunk sizes) span the chunk fit's prefix term; the full grid adds 128, 896
    chunk_batches=(1, 8), chunk_prefixes=(0, 384), chunk_sizes=(32, 128),
    train=((1, 64), (4, 64), (1, 256), (4, 256)),
    interference=((8, 256, 4, 128),),
    handover=(("kv_decoder", "", "", 4, 64, 32), ("hf_generate", "", "", 4, 64, 32)),
    # waiting for quiet cores and retakes: at most a minute in all (a busy host would otherwise multiply the run)
    point_budget_s=0.3, quiet_wait_s=20.0, quiet_budget_s=60.0,
    # shapes shared with `prefill`/`decode` where they can be, so runtimes compare at equal shapes
    gen_prefill=((1, 64), (4, 32), (4, 128), (16, 64)),
    gen_decode=((1, 64), (4, 64), (4, 256), (16, 64)),
    # a boundary costs about one generate() call's overhead (~1 ms here): short calls with many
    # boundaries keep it above the calls' jitter; one chunk size (the fit, handoff_s + handoff_per_row_s x
    # batch, reads no chunk size; the full grid adds chunk 4)
    handoff=((1, 32, 16, 2), (4, 32, 16, 2), (16, 32, 16, 2)),
    # a generation point's samples are differences of calls (noisier), so it gets more than point_budget_s
    # the runtimes compiled per shape (hf_static; and the scoring runtimes aoti_python, aoti_cpp: calibrate.running.run.
    # default_runtimes) are left out: 15-45 s of compilation for two points, too few to fit three parameters
    gen_compiled_batch=4, gen_compiled_models=0, gen_point_budget_s=0.5,
    # left padding at batch 4 and 16 (the fit, pad_step_s + pad_step_per_row_s x batch, reads no width); it and
    # the handoff fit (the same form) read no model either, so their points are taken on the first three decoders
    gen_pad=((4, 64), (16, 64)), gen_host_models=3,
    sampling=((1, 1024), (4, 1024), (16, 1024), (1, 4096), (16, 4096), (1, 16384), (4, 16384), (16, 16384)),
    gemm=tuple((r, o, i) for o, i in ((512, 128), (1024, 256), (256, 1024), (2048, 512), (4096, 256)) for r in (1, 2, 4)),
    gemm_footprints_mib=(4, 8, 16, 32, 64),
    widths=(64, 128, 192, 256, 384, 512),
    width_mlp_ratios=(2, 4),
    page_faults=True,
)

FULL_CPU = replace(
    QUICK_CPU,
    score=SCORE_SMALL + ((16, 512), (32, 128), (32, 512), (1, 1024), (8, 1024)),
    runtime_score=SCORE_SMALL,
    runtime_score_static=((1, 128), (4, 128), (16, 128), (4, 512)),
    strategies=((8, 128), (8, 512), (32, 256), (32, 1024)),
    prefill=QUICK_CPU.prefill + ((16, 512), (32, 128), (1, 1024), (8, 1024)),
    decode=QUICK_CPU.decode + ((1, 1024), (8, 1024), (32, 256), (64, 128)),
    chunk_batches=(1, 8, 16), chunk_prefixes=(0, 128, 384, 896), chunk_sizes=(16, 32, 128),
    train=QUICK_CPU.train + ((8, 256), (2, 1024), (16, 128)),
    interference=((8, 256, 4, 128), (16, 512, 8, 256)),
    warmup=2, min_iters=5, max_iters=50, point_budget_s=1.5, runtime_models=None, interference_s=4.0,
    quiet_wait_s=60.0, quiet_budget_s=None, rounds=10, per_round=3, handoff=QUICK_CPU.handoff + ((4, 32, 16, 4),),
    gen_point_budget_s=0.8, gen_compiled_models=1, gen_pad=Grid.gen_pad, gen_host_models=None,
)

QUICK_GPU = Grid(
    score=((1, 128), (1, 512), (8, 128), (8, 512), (32, 512), (8, 2048), (64, 256)),
    runtime_score=((1, 128), (8, 512), (32, 512), (8, 2048)),
    runtime_score_static=((8, 512),),
    strategies=((32, 512), (32, 2048)),
    prefill=((1, 128), (1, 1024), (8, 128), (8, 1024), (32, 512), (4, 4096), (64, 256)),
    decode=((1, 256), (1, 2048), (16, 512), (64, 512), (64, 2048), (256, 256)),
    chunk_batches=(8, 32), chunk_prefixes=(0, 512, 2048), chunk_sizes=(128, 512),
    train=((1, 512), (8, 512), (4, 2048), (16, 1024)),
    interference=((64, 1024, 8, 512),),
    warmup=3, min_iters=5, max_iters=30, point_budget_s=0.5, runtime_models=1, interference_s=3.0,
    rounds=10, per_round=5,
    gen_prefill=((1, 128), (8, 1024), (64, 256), (64, 1024), (256, 256)),
    gen_decode=((1, 256), (16, 512), (64, 512), (64, 2048), (256, 256)),
    gen_decode_steps=31,
    handoff=((8, 256, 256, 32), (64, 256, 256, 32), (256, 256, 256, 32), (64, 256, 256, 64)),
    gen_compiled_batch=64, gen_compiled_models=1,
    sampling=((8, 32768), (64, 32768), (256, 32768), (8, 151936), (64, 151936), (256, 151936)),
)

FULL_GPU = replace(
    QUICK_GPU,
    score=QUICK_GPU.score + ((1, 2048), (32, 128), (64, 1024), (128, 512), (16, 4096)),
    runtime_score=QUICK_GPU.score,
    runtime_score_static=QUICK_GPU.runtime_score,
    strategies=((32, 512), (32, 2048), (128, 1024)),
    prefill=QUICK_GPU.prefill + ((16, 2048), (128, 512), (1, 8192), (32, 2048)),
    decode=QUICK_GPU.decode + ((1, 8192), (32, 4096), (128, 1024), (256, 2048), (512, 512)),
    chunk_batches=(8, 32, 64), chunk_prefixes=(0, 512, 2048, 6144), chunk_sizes=(64, 256, 1024),
    train=QUICK_GPU.train + ((32, 1024), (8, 4096), (2, 8192)),
    interference=((64, 1024, 8, 512), (256, 1024, 32, 512), (16, 4096, 8, 2048)),
    warmup=5, min_iters=10, max_iters=100, point_budget_s=2.0, runtime_models=None, interference_s=6.0,
    gen_prefill=QUICK_GPU.gen_prefill + ((1, 2048), (32, 2048), (128, 512)),
    gen_decode=QUICK_GPU.gen_decode + ((1, 8192), (32, 4096), (128, 1024), (256, 2048)),
    handoff=QUICK_GPU.handoff + ((16, 1024, 512, 64), (128, 1024, 512, 64), (64, 256, 256, 16)),
    gen_compiled_models=None,
)

# The fields of the CPU-only sweeps: the host effects a GPU price never applies (GEMM weight passes and footprints,
# cold fixed costs, training rate by width, page faults: rlhfsim.costs.cpuhost) and co-running in the hand-over
# pattern (calibrate.cpu.corun); the GPU grids leave them empty.
CPU_ONLY_FIELDS = ("gemm", "gemm_footprints_mib", "widths", "width_mlp_ratios", "page_faults", "handover")


def cpu_only_sweeps(grid: Grid) -> list[str]:
    """The CPU-only fields (``CPU_ONLY_FIELDS``) that ``grid`` sets: none for a GPU's grid."""
    return [f for f in CPU_ONLY_FIELDS if getattr(grid, f)]


def within(shapes, max_positions: int) -> tuple[Shape2, ...]:
    """The (batch, length) shapes a model with ``max_positions`` positions can take (DeBERTa: 512)."""
    return tuple(x for x in shapes if x[1] <= max_positions)


DEFAULT_MODELS = {
    ("cpu", True): ("tiny-qwen2", "small-qwen2", "tiny-qwen2-l4", "small-qwen2-l2", "small-qwen2-l3-mha",
                    "tiny-qwen2-v8k", "tiny-deberta", "small-deberta"),
    ("cpu", False): ("tiny-qwen2", "small-qwen2", "tiny-qwen2-l4", "small-qwen2-l2", "small-qwen2-l3-mha",
                     "tiny-qwen2-v8k", "tiny-deberta", "small-deberta", "qwen2.5-0.5b"),
    ("cuda", True): ("qwen2.5-0.5b", "qwen2.5-1.5b", "deberta-v3-large"),
    ("cuda", False): ("qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-3b", "qwen2.5-7b", "deberta-v3-large"),
}


def default_grid(kind: str, quick: bool) -> Grid:
    return {("cpu", True): QUICK_CPU, ("cpu", False): FULL_CPU, ("cuda", True): QUICK_GPU,
            ("cuda", False): FULL_GPU}[(kind, quick)]


# the measured cost terms' point fields (calibrate.measuring.sampling, calibrate.cpu.gemm): what each entry names
COST_TERM_POINTS = {"sampling": ("rows", "vocabulary"), "gemm": ("rows", "out features", "in features")}


def with_overrides(grid: Grid, overrides: dict | None) -> Grid:
    """The grid with some fields replaced (lists become tuples); unknown fields are an error."""
    if not overrides:
        return grid
    known = {f.name for f in fields(Grid)}
    bad = sorted(set(overrides) - known)
    if bad:
        raise RlhfsimError(f"grid: unknown field(s) {', '.join(bad)}; expected some of {', '.join(sorted(known))}")

    def tup(v):
        return tuple(tup(x) for x in v) if isinstance(v, (list, tuple)) else v

    def pos_int(x):
        return isinstance(x, int) and not isinstance(x, bool) and x >= 0

    out = {}
    for k, v in overrides.items():
        cur = getattr(grid, k)
        v = tup(v)
        if k in ("actor_models", "critic_models"):
            ok, want = v is None or (isinstance(v, tuple) and all(isinstance(x, str) for x in v)), "null or a list of model names"
        elif k == "handover":
            ok = isinstance(v, tuple) and all(
                isinstance(x, tuple) and len(x) == 6 and x[0] in GEN_RUNTIMES and all(isinstance(y, str) for y in x[1:3])
                and all(pos_int(y) and y >= 1 for y in x[3:]) for x in v)
            want = "a list of [runtime, actor model or \"\", reward model or \"\", batch, prompt, chunk]"
        elif k in COST_TERM_POINTS:
            names = COST_TERM_POINTS[k]
            ok = isinstance(v, tuple) and all(isinstance(x, tuple) and len(x) == len(names)
                                              and all(pos_int(y) and y >= 1 for y in x) for x in v)
            want = f"a list of [{', '.join(names)}] (may be empty)"
        elif k == "widths":
            ok, want = isinstance(v, tuple) and all(pos_int(x) and x >= 64 for x in v), "a list of widths >= 64 (may be empty)"
        elif k == "gemm_footprints_mib":
            ok = isinstance(v, tuple) and all(pos_int(x) and x >= 1 for x in v) and list(v) == sorted(set(v))
            want = "an increasing list of footprints in MiB >= 1 (may be empty)"
        elif k == "width_mlp_ratios":
            ok, want = isinstance(v, tuple) and all(pos_int(x) and x >= 1 for x in v), "a list of MLP ratios >= 1 (may be empty)"
        elif k in ("width_mlp_ratio", "width_tokens"):
            ok, want = pos_int(v) and v >= 1, "an int >= 1"
        elif k == "page_faults":
            ok, want = isinstance(v, bool), "true or false"
        elif k == "gen_runtimes":
            ok = isinstance(v, tuple) and all(x in GEN_RUNTIMES for x in v)
            want = f"a list of generation runtimes ({', '.join(GEN_RUNTIMES)})"
        elif isinstance(cur, tuple) and k != "static_shape_runtimes":
            arity = len(cur[0]) if cur and isinstance(cur[0], tuple) else 0
            ok = isinstance(v, tuple) and len(v) > 0 and all(
                (isinstance(x, tuple) and len(x) == arity and all(pos_int(y) for y in x)) if arity else pos_int(x)
                for x in v)
            want = f"a non-empty list of [{', '.join(['int'] * arity)}]" if arity else "a non-empty list of ints"
        elif k == "static_shape_runtimes":
            ok, want = isinstance(v, tuple) and all(isinstance(x, str) for x in v), "a list of runtime names"
        elif k in ("gen_point_budget_s", "quiet_budget_s"):
            ok = v is None or (isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0)
            want = "null or a number >= 0"
        elif k in ("runtime_models", "gen_compiled_batch", "gen_compiled_models", "gen_host_models"):
            ok, want = v is None or pos_int(v), "null or an int"
        elif k in ("rounds", "per_round", "launches"):
            ok, want = pos_int(v) and v >= 1, "an int >= 1"
        elif k == "gen_decode_steps":
            ok, want = pos_int(v) and v >= 1, "an int >= 1"
        else:
            ok, want = isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0, "a non-negative number"
        if not ok:
            raise RlhfsimError(f"grid.{k}: expected {want}, got {v!r}")
        out[k] = v
    return replace(grid, **out)
