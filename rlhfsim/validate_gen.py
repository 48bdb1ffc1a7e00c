"""Generated validation scenarios (``rlhfsim validate --generate N --seed S``): N scenarios drawn from the
documented ranges in ``RANGES``, each small enough to run for real on this CPU in about a minute.

A draw is a pure function of (seed, index, attempt): scenario i of seed S is the same whatever N is, on
every machine, so anyone can rerun the same set from the seed and the ranges written next to it
(``generated.json``). Models outside the catalog are written as Hugging Face ``config.json`` files
under ``models/`` of the output directory and referenced by relative path; a model's name encodes its
shape, so two draws of the same shape share one file (and one cached calibration).

What is drawn is what ``calibrate.executor`` runs on a CPU: a decoder actor (Qwen2 or Llama family) and
reference of the same shape; a reward that is a decoder (its own shape), an encoder (DeBERTa-v2) or a
rule; for PPO a critic with the actor's or the reward decoder's shape; the static or continuous engine
with ``kv_decoder`` or ``hf_generate`` (static only, never with ``inter.keep_kv``); sync or OPPO with
fixed knobs. Pairings the executor cannot run are never drawn: the reward model's and critic's
vocabulary covers the actor's tokens, an encoder reward is never streamed to under intra-step and its
512 positions cover the longest prompt + response.

A candidate is re-drawn (attempt + 1) when it fails ``rlhfsim.scenario.load_scenario`` or when the
bundled ``cpu`` profile predicts its real steps to take more than ``max_run_s``; re-draws are counted by
reason. The run-time bound selects on the blind profile's prediction of the run's length only, never on
an error: no measurement is involved in drawing.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from rlhfsim.errors import RlhfsimError, ScenarioError

# Every range with the reason it has the bounds it has. ``choices``: drawn uniformly (or by ``weights``);
# ``range``: integers drawn uniformly in [lo, hi]; ``log_range``: reals drawn log-uniformly in [lo, hi].
RANGES: dict[str, dict] = {
    "layers": {"range": [2, 4], "why": "decoder depth; 4 layers of hidden 320 keep a real step near a second on two CPU cores"},
    "hidden": {"choices": [128, 192, 256, 320], "why": "around the catalog's tiny-qwen2 (128) and small-qwen2 (256), plus shapes no profile saw"},
    "head_dim": {"choices": [32, 64], "why": "heads = hidden / head_dim (both divide every hidden size above)"},
    "kv_heads": {"choices": "divisors of heads", "why": "MHA to MQA: any grouping the HF Qwen2/Llama attention accepts"},
    "intermediate_ratio": {"choices": [2, 3, 4], "why": "MLP width over hidden (Qwen2.5-0.5B: 5.4, small-qwen2: 4)"},
    "vocab": {"choices": [1024, 2048, 4096, 8192], "why": "the LM head is a large share of a tiny model's FLOPs; 8192 is 4x the catalog's"},
    "tied_embeddings": {"choices": [True, False], "why": "tied (Qwen2.5 <= 3B) and untied (7B+, Llama) LM heads"},
    "model_type": {"choices": ["qwen2", "llama"], "why": "decoder families the executor builds (q/k/v biases or none)"},
    "reward": {"choices": ["decoder", "encoder", "rule"], "weights": [0.6, 0.2, 0.2],
               "why": "reward model (a decoder with a score head, a DeBERTa-v2 encoder) or a CPU rule checker"},
    "reward_vocab": {"choices": "vocab choices >= the actor's", "why": "the executor feeds the actor's token ids to the reward model"},
    "encoder_layers": {"range": [1, 3], "why": "DeBERTa-v2 reward model depth (tiny-deberta: 2)"},
    "encoder_hidden": {"choices": [128, 256], "why": "DeBERTa-v2 reward model width, heads = hidden / 64 (MHA)"},
    "rule_cpu_s_per_sample": {"log_range": [0.001, 0.01], "why": "a Python answer checker on one worker (the executor's rule runs in process)"},
    "critic_from": {"choices": ["actor", "reward"], "why": "PPO critics start from the policy or the reward model (reward only when it is a decoder)"},
    "algorithm": {"choices": ["ppo", "grpo"], "why": "with a critic (group 1) or group-normalized advantages without one"},
    "group_size": {"choices": [2, 4], "why": "GRPO rollouts per prompt"},
    "rollouts_per_step": {"range": [4, 16], "why": "prompts_per_step x group_size; drawn prompts per step are cut to fit"},
    "prompts_per_step": {"range": [2, 8], "why": "B"},
    "ppo_epochs": {"choices": [1, 2], "why": "passes over the batch per step"},
    "minibatch_size": {"choices": [2, 4, 8], "why": "rollouts per optimizer step (at most the rollouts per step)"},
    "engine": {"choices": ["static", "continuous"], "why": "the two batching engines the executor runs"},
    "runtime": {"choices": ["kv_decoder", "hf_generate"], "why": "the executor's CPU generation runtimes; hf_generate with the static engine only, never with inter.keep_kv"},
    "max_batch": {"choices": [2, 4, 8], "why": "generation slots (static batch rows)"},
    "prompt_length": {"choices": ["fixed", "normal", "lognormal"], "why": "prompt length families"},
    "prompt_center": {"range": [16, 96], "why": "mean (normal), median (lognormal) or value (fixed) of prompt tokens"},
    "response_length": {"choices": ["normal", "lognormal", "pareto", "mixture"], "why": "response length families, up to heavy tails"},
    "response_center": {"range": [16, 96], "why": "mean (normal), median (lognormal), scale x 2 (pareto), short component mean (mixture)"},
    "response_tail": {"log_range": [2.0, 5.0], "why": "lognormal p99 / median; pareto alpha = 1 + 1 / (tail - 1); mixture long mode / short mean"},
    "max_prompt_tokens": {"choices": [128], "why": "prompt cap; prompt + response stays within an encoder's 512 positions"},
    "max_response_tokens": {"choices": [128, 192, 256], "why": "response cap, where heavy tails are cut"},
    "schedule": {"choices": ["sync", "oppo-intra", "oppo-inter", "oppo"], "why": "the schedules the executor runs, OPPO's knobs one at a time and together"},
    "chunk_tokens": {"choices": [16, 32, 64], "why": "OPPO intra-step chunk size"},
    "delta": {"range": [1, 4], "why": "OPPO inter-step extra prompts in flight"},
    "keep_kv": {"choices": [True, False], "why": "carried rollouts keep their KV cache or are re-prefilled"},
    "steps": {"range": [4, 6], "why": "real steps per scenario, the first a warm-up"},
    "max_run_s": {"value": 60.0, "why": "bound on the bundled cpu profile's prediction of a scenario's real steps (10 scenarios in ~10-20 minutes)"},
}

MAX_ATTEMPTS = 200   # per scenario; a range set that needs more is mis-specified


@dataclass
class Drawn:
    """A drawn set: the scenario mappings (``models/`` references resolve against the output
    directory), the configs to write beside them, the re-draws by reason and the predicted run times."""

    seed: int
    scenarios: list[dict]
    configs: dict[str, dict] = field(default_factory=dict)   # relative path -> HF config.json content
    redraws: dict[str, int] = field(default_factory=dict)
    estimated_run_s: list[float] = field(default_factory=list)

    @property
    def redraw_count(self) -> int:
        return sum(self.redraws.values())


class _Rng:
    """Draws named quantities from ``RANGES`` (or the caller's override) with one numpy Generator."""

    def __init__(self, ranges: dict, seed: int, index: int, attempt: int):
        self.r, self.g = ranges, np.random.default_rng([seed, index, attempt])

    def choice(self, name: str, choices=None):
        spec = self.r[name]
        opts = list(choices if choices is not None else spec["choices"])
        w = spec.get("weights") if choices is None else None
        p = np.asarray(w, dtype=float) / sum(w) if w else None
        return opts[int(self.g.choice(len(opts), p=p))]

    def integer(self, name: str, lo: int | None = None, hi: int | None = None) -> int:
        a, b = self.r[name]["range"]
        return int(self.g.integers(max(a, lo if lo is not None else a), min(b, hi if hi is not None else b) + 1))

    def log_real(self, name: str) -> float:
        a, b = self.r[name]["log_range"]
        return float(math.exp(self.g.uniform(math.log(a), math.log(b))))


class _Redraw(Exception):
    """A candidate the ranges cannot complete (its message: the re-draw's reason)."""


def _decoder(d: _Rng, vocab: int) -> dict:
    hidden = d.choice("hidden")
    heads = hidden // d.choice("head_dim")
    kv = d.choice("kv_heads", [k for k in range(1, heads + 1) if heads % k == 0])
    inter = d.choice("intermediate_ratio") * hidden
    layers = d.integer("layers")
    mtype = d.choice("model_type")
    tied = bool(d.choice("tied_embeddings"))
    name = f"gen-{mtype}-l{layers}-h{hidden}-a{heads}-kv{kv}-i{inter}-v{vocab}{'-tied' if tied else ''}"
    return {"_name_or_path": name, "model_type": mtype, "num_hidden_layers": layers,
            "hidden_size": hidden, "intermediate_size": inter, "num_attention_heads": heads,
            "num_key_value_heads": kv, "vocab_size": vocab, "tie_word_embeddings": tied,
            "max_position_embeddings": 4096}


def _encoder(d: _Rng, vocab: int) -> dict:
    hidden = d.choice("encoder_hidden")
    layers = d.integer("encoder_layers")
    name = f"gen-deberta-l{layers}-h{hidden}-v{vocab}"
    return {"_name_or_path": name, "model_type": "deberta-v2", "num_hidden_layers": layers, "hidden_size": hidden,
            "intermediate_size": 4 * hidden, "num_attention_heads": hidden // 64, "vocab_size": vocab,
            "max_position_embeddings": 512}


def _length(d: _Rng, family: str, center: int, tail: float) -> dict:
    if family == "fixed":
        return {"kind": "fixed", "value": center}
    if family == "normal":
        return {"kind": "normal", "mean": center, "std": round(center / 4, 1)}
    if family == "lognormal":
        return {"kind": "lognormal", "median": center, "p99": round(center * tail, 1)}
    if family == "pareto":
        return {"kind": "pareto", "scale": round(center / 2, 1), "alpha": round(1 + 1 / (tail - 1), 3)}
    # mixture: mostly short answers, a weighted long mode
    return {"kind": "mixture", "components": [
        {"weight": 0.8, "dist": {"kind": "normal", "mean": center, "std": round(center / 4, 1)}},
        {"weight": 0.2, "dist": {"kind": "lognormal", "median": round(center * tail, 1), "p99": round(center * tail * 2, 1)}}]}


def _candidate(d: _Rng, seed: int, index: int) -> tuple[dict, dict[str, dict]]:
    """One scenario mapping and the model configs it references (not yet checked)."""
    vocabs = list(d.r["vocab"]["choices"])
    vocab = d.choice("vocab")
    actor = _decoder(d, vocab)
    configs = {f"models/{actor['_name_or_path']}.json": actor}
    ref = lambda c: {"model": f"models/{c['_name_or_path']}.json", "dtype": "float32"}   # noqa: E731
    models: dict = {"actor": ref(actor), "reference": ref(actor)}
    kind = d.choice("reward")
    reward_cfg = None
    if kind == "rule":
        models["reward"] = {"kind": "rule", "cpu_s_per_sample": round(d.log_real("rule_cpu_s_per_sample"), 5), "workers": 1}
    else:
        rvocab = d.choice("reward_vocab", [v for v in vocabs if v >= vocab])
        reward_cfg = _decoder(d, rvocab) if kind == "decoder" else _encoder(d, rvocab)
        configs[f"models/{reward_cfg['_name_or_path']}.json"] = reward_cfg
        models["reward"] = ref(reward_cfg)
    algo = d.choice("algorithm")
    group = 1 if algo == "ppo" else d.choice("group_size")
    if algo == "ppo":
        src = d.choice("critic_from", ["actor", "reward"] if kind == "decoder" else ["actor"])
        models["critic"] = ref(actor if src == "actor" else reward_cfg)
    lo, hi = d.r["rollouts_per_step"]["range"]
    b = d.integer("prompts_per_step", lo=math.ceil(lo / group), hi=hi // group)
    rollouts = b * group
    engine = d.choice("engine")
    runtime = d.choice("runtime") if engine == "static" else "kv_decoder"
    scheds = [s for s in d.r["schedule"]["choices"] if kind == "decoder" or s in ("sync", "oppo-inter")]
    if not scheds:   # --ranges left no schedule this reward can run with (intra-step needs a decoder reward)
        raise _Redraw(f"no schedule in ranges.schedule for a {kind} reward")
    sched_kind = d.choice("schedule", scheds)
    schedule: dict = {"kind": "sync"}
    if sched_kind != "sync":
        intra, inter = sched_kind in ("oppo-intra", "oppo"), sched_kind in ("oppo-inter", "oppo")
        schedule = {"kind": "oppo", "intra": {"enabled": intra}, "inter": {"enabled": inter}}
        if intra:
            schedule["intra"]["chunk_tokens"] = d.choice("chunk_tokens")
        if inter:
            keep = bool(d.choice("keep_kv")) if runtime == "kv_decoder" else False
            schedule["inter"].update(delta=d.integer("delta"), keep_kv=keep)
    steps = d.integer("steps")
    pc, rc = d.integer("prompt_center"), d.integer("response_center")
    doc = {
        "name": f"gen-{seed}-{index:02d}",
        "description": f"drawn by rlhfsim validate --generate (seed {seed}, scenario {index})",
        "cluster": {"gpu": "cpu", "nodes": 1, "gpus_per_node": 1},
        "placement": {"kind": "colocated"},
        "models": models,
        "algorithm": {"kind": algo, "group_size": group, "ppo_epochs": d.choice("ppo_epochs"),
                      "minibatch_size": d.choice("minibatch_size", [m for m in d.r["minibatch_size"]["choices"] if m <= rollouts])},
        "workload": {"prompts_per_step": b,
                     "prompt_length": _length(d, d.choice("prompt_length"), pc, 2.0),
                     "response_length": _length(d, d.choice("response_length"), rc, d.log_real("response_tail")),
                     "max_prompt_tokens": d.choice("max_prompt_tokens"),
                     "max_response_tokens": d.choice("max_response_tokens")},
        "generation": {"engine": engine, "max_batch": d.choice("max_batch"), "runtime": runtime},
        "schedule": schedule,
        "steps": steps, "warmup_steps": 1,
        "seed": int(d.g.integers(0, 2**31 - 1)),
    }
    return doc, configs


def estimate_run_s(sc) -> float:
    """The bundled cpu profile's prediction of the scenario's real steps, summed (seconds)."""
    from rlhfsim.sim.run import simulate

    return float(sum(r.step_time_s for r in simulate(sc, profile="cpu").steps))


def _write_configs(out_dir: Path, configs: dict[str, dict]) -> None:
    for rel, cfg in configs.items():
        p = out_dir / rel
        if not p.is_file():
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(json.dumps(cfg, indent=1) + "\n")


def draw(n: int, seed: int, out_dir: Path, ranges: dict | None = None, max_attempts: int = MAX_ATTEMPTS) -> Drawn:
    """N scenarios for ``seed`` (see the module docstring); their model configs are written under
    ``out_dir/models/`` (each candidate's are needed to load it). ``ranges``: RANGES with some entries
    replaced (tests draw from narrower ones)."""
    from rlhfsim.scenario import load_scenario

    if n < 1:
        raise RlhfsimError(f"--generate: expected at least 1 scenario, got {n}")
    rng_spec = {**RANGES, **(ranges or {})}
    out_dir = Path(out_dir)
    out = Drawn(seed=seed, scenarios=[])
    bound = float(rng_spec["max_run_s"]["value"])
    for i in range(n):
        for attempt in range(max_attempts):
            try:
                doc, configs = _candidate(_Rng(rng_spec, seed, i, attempt), seed, i)
            except _Redraw as e:
                out.redraws[str(e)] = out.redraws.get(str(e), 0) + 1
                continue
            _write_configs(out_dir, configs)
            try:
                sc = load_scenario(doc, base_dir=out_dir)
            except ScenarioError as e:
                reason = f"scenario check: {e.path or 'scenario'}"
            else:
                est = estimate_run_s(sc)
                if est <= bound:
                    out.scenarios.append(doc)
                    out.configs.update(configs)
                    out.estimated_run_s.append(est)
                    break
                reason = "predicted run time over max_run_s"
            out.redraws[reason] = out.redraws.get(reason, 0) + 1
        else:
            raise RlhfsimError(f"--generate: scenario {i} of seed {seed}: no feasible draw in {max_attempts} attempts "
                               f"(re-draws: {out.redraws}); the ranges are too wide for max_run_s {bound}")
    used = {out_dir / rel for rel in out.configs}
    for p in (out_dir / "models").glob("*.json"):   # configs of rejected candidates only
        if p not in used:
            p.unlink()
    return out


def write_set(drawn: Drawn, out_dir: Path, ranges: dict | None = None) -> list[Path]:
    """Write the scenarios as YAML and ``generated.json`` (seed, N, ranges, re-draws, files) into
    ``out_dir``; returns the scenario paths."""
    import yaml

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    _write_configs(out_dir, drawn.configs)
    paths = []
    for doc in drawn.scenarios:
        p = out_dir / f"{doc['name']}.yaml"
        p.write_text(f"# {doc['description']}\n" + yaml.safe_dump(doc, sort_keys=False))
        paths.append(p)
    meta = {"seed": drawn.seed, "n": len(drawn.scenarios), "ranges": {**RANGES, **(ranges or {})},
            "redraws": drawn.redraw_count, "redraw_reasons": drawn.redraws,
            "scenarios": [p.name for p in paths], "models": sorted(drawn.configs),
            "estimated_run_s": drawn.estimated_run_s,
            "rerun": f"rlhfsim validate --device cpu --generate {len(paths)} --seed {drawn.seed}"}
    (out_dir / "generated.json").write_text(json.dumps(meta, indent=1) + "\n")
    return paths
