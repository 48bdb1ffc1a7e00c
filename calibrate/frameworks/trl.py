"""TRL adapter: run ``GRPOTrainer`` or ``RLOOTrainer`` for a scenario's steps and record what happened.

``run_trl(spec) -> list[FrameworkStep]`` builds everything from shapes, offline, in a temporary directory:

* a word-level tokenizer (``tokenizers`` ``WordLevel`` wrapped in ``PreTrainedTokenizerFast``): token 0 is
  ``<|endoftext|>`` (EOS and pad, as for Qwen2 base models), 1 ``<unk>``, 2.. ``w2`` .. ``wV-1``, so a
  prompt of n words is n tokens and decoding joins words with spaces;
* the actor (``*ForCausalLM``, random weights from ``calibrate.measuring.models``), saved with ``save_pretrained``;
  TRL loads it from that path, and with ``beta > 0`` (the scenario has a reference) builds the reference
  from the same path; the reward model (``*ForSequenceClassification``, one label) likewise, or a rule
  function (``rule_reward``: a cheap word-count rule) for ``models.reward.kind: rule``;
* a dataset of ``prompts_per_step x steps`` distinct prompts of the spec's lengths (each used once).

Long-tailed lengths, the honest way: the actor samples freely (TRL's defaults: temperature 1, no
top-k/top-p) and only the EOS row of its output embedding (tied with the input embedding in these shapes)
is changed, before training: drawn like the other rows (EOS doubles as the pad token, whose row starts
at zero) and scaled by a factor s (``eos_scale``), so the EOS logit h . w_eos becomes s (h . w_eos). In
these random-weight models the final hidden state h is dominated by a per-sequence component, so each
completion keeps about the same EOS probability from token to token: its length is roughly geometric with
a probability of its own, and over many completions the lengths are a long-tailed mixture (many end
within a few tokens, many run to ``max_completion_length``). s is chosen by bisection so that the mean
capped geometric length over random contexts equals the scenario's mean response length. Nothing in TRL
is patched to force lengths.

What is recorded per optimizer step (``FrameworkStep``), with ``time.perf_counter`` on the host:

* ``wall_s``: ``on_step_begin`` to ``on_step_end`` of a ``TrainerCallback`` (the step's ``training_step``
  with generation inside it, gradient clipping, the optimizer and scheduler steps, ``zero_grad``); TRL's own
  ``step_time`` metric (``training_step`` only) is kept beside it as ``framework_step_time_s``;
* phases, by wrapping the trainer's own methods on the instance (the same methods TRL's
  ``profiling/Time taken: ...`` timers wrap; those timers go only to W&B/MLflow/Trackio):
  ``_generate`` -> generate (tokenizing the prompts, ``transformers.generate``, decoding completions),
  ``_calculate_rewards`` -> reward, ``_get_per_token_logps_and_entropies`` on the reference model ->
  reference, on the actor inside batch preparation -> old_logprobs, the rest of ``_prepare_inputs`` ->
  other, and the step's wall time after ``_prepare_inputs`` -> actor_train (forward with log-probs,
  backward, clipping, optimizer), itself split in ``detail_s`` into train_forward (``compute_loss``),
  train_backward (the rest of ``training_step``), optimizer (``on_pre_optimizer_step`` to
  ``on_optimizer_step``) and clip_and_rest;
* every completion's prompt (dataset row), its index in the group, and the prompt and completion token
  counts TRL itself computed (the completion counts its EOS token when it has one).
"""

from __future__ import annotations

import json
import math
import tempfile
import time
import warnings
from collections import defaultdict
from pathlib import Path

from calibrate.frameworks.base import FrameworkSpec, FrameworkStep, RolloutLength

EOS_ID = 0
UNK_ID = 1
EOS_TOKEN = "<|endoftext|>"
REF_BETA = {"grpo": 0.04, "rloo": 0.05}  # KL weights when the scenario has a reference (TRL's RLOO default)


def build_tokenizer(vocab: int):
    """A word-level tokenizer of ``vocab`` tokens (module docstring); no hub, no files."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = {EOS_TOKEN: EOS_ID, "<unk>": UNK_ID, **{f"w{i}": i for i in range(2, vocab)}}
    tk = Tokenizer(models.WordLevel(words, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tk, eos_token=EOS_TOKEN, pad_token=EOS_TOKEN, unk_token="<unk>")


def capped_geometric_mean(p, cap: int):
    """Mean length of a completion that ends after each token with probability p, cut at ``cap``:
    (1 - (1 - p)^cap) / p (elementwise on a tensor)."""
    return (1 - (1 - p) ** cap) / p


def eos_scale(model, target_mean: float, cap: int, seed: int, rows: int = 32, length: int = 64) -> float:
    """Scale the EOS row of the model's output embedding so that completions average ``target_mean``
    tokens (cut at ``cap``); returns the factor s.

    The EOS logit of a context with final hidden state h becomes s (h . w_eos). In these random-weight
    models h is dominated by a per-sequence component, so a sequence keeps about the same EOS probability
    p_i from token to token: its length is roughly geometric with its own p_i. s is found by bisection on
    log s so that the mean over ``rows`` random contexts of capped_geometric_mean(p_i, cap) is the target,
    p_i being the mean EOS probability over the positions of context i. A zero row (EOS doubles as the
    pad token, whose embedding starts at zero) is first drawn like the others, N(0, initializer_range)."""
    import torch

    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(seed)
    row = model.get_output_embeddings().weight[EOS_ID]
    with torch.no_grad():
        if not row.any():
            row.copy_(torch.randn(row.shape, generator=g) * model.config.initializer_range)
        ids = torch.randint(2, vocab, (rows, length), generator=g)
        logits = model(input_ids=ids).logits.float()
    z = logits[..., EOS_ID]
    rest = torch.logsumexp(logits[..., 1:], dim=-1)
    target = min(max(target_mean, 1.0), cap - 0.5)

    def mean_len(log_s: float) -> float:
        p = torch.sigmoid(z * math.exp(log_s) - rest).mean(dim=1).clamp_min(1e-12)
        return capped_geometric_mean(p, cap).mean().item()

    lo, hi = -7.0, 9.0   # mean_len falls as s grows over this range
    for _ in range(60):
        mid = (lo + hi) / 2
        if mean_len(mid) > target:
            lo = mid
        else:
            hi = mid
    s = math.exp((lo + hi) / 2)
    with torch.no_grad():
        model.get_output_embeddings().weight[EOS_ID].mul_(s)
    return s


def rule_reward(completions, **kwargs):
    """A rule-based reward (a stand-in for an answer checker): the word count modulo 5."""
    return [float(len(c.split()) % 5) for c in completions]


def _prompts(spec: FrameworkSpec, vocab: int) -> list[str]:
    import numpy as np

    rng = np.random.default_rng([spec.seed, 5])
    return [" ".join(f"w{t}" for t in rng.integers(2, vocab, n)) for n in spec.prompt_lens]


def _save_models(spec: FrameworkSpec, tok, root: Path) -> tuple[str, str | None, float]:
    from calibrate.measuring.models import build_hf_model

    actor = build_hf_model(spec.actor, "lm", spec.dtype, "cpu", seed=spec.seed)
    actor.generation_config.eos_token_id = EOS_ID
    actor.generation_config.pad_token_id = EOS_ID
    actor.generation_config.bos_token_id = None
    scale = eos_scale(actor, spec.mean_response_tokens, spec.max_response_tokens, spec.seed)
    actor.save_pretrained(root / "actor")
    tok.save_pretrained(root / "actor")
    reward = None
    if spec.reward is not None:
        rm = build_hf_model(spec.reward, "value", spec.dtype, "cpu", seed=spec.seed + 1)
        rm.save_pretrained(root / "reward")
        tok.save_pretrained(root / "reward")
        reward = str(root / "reward")
    return str(root / "actor"), reward, scale


class _Recorder:
    """Timers and lengths of the current step, filled by the wrappers and the callback."""

    def __init__(self, prompt_index: dict[str, int]):
        self.prompt_index = prompt_index
        self.steps: list[FrameworkStep] = []
        self.texts: list[list[dict]] = []
        self.logs: dict[int, dict] = {}
        self._reset()

    def _reset(self):
        self.phases: dict[str, float] = defaultdict(float)
        self.rollouts: list[RolloutLength] = []
        self.step_texts: list[dict] = []
        self.in_prepare = False
        self.t0 = self.t_opt = None

    def timed(self, phase: str, fn):
        def wrapper(*a, **kw):
            t = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                self.phases[phase] += time.perf_counter() - t
        return wrapper

    def generated(self, prompts, out) -> None:
        # GRPOTrainer._generate returns (prompt_ids, completion_ids, tool_mask, completions, ...);
        # RLOOTrainer._generate (prompt_ids, completion_ids, completions).
        prompt_ids, completion_ids = out[0], out[1]
        completions = out[2] if len(out) == 3 else out[3]
        seen: dict[int, int] = defaultdict(int)
        for text, p, c, ctext in zip(prompts, prompt_ids, completion_ids, completions):
            pid = self.prompt_index[text]
            self.rollouts.append(RolloutLength(pid, seen[pid], len(p), len(c)))
            self.step_texts.append({"prompt": text, "completion": ctext})
            seen[pid] += 1

    def end_step(self, wall_s: float) -> None:
        ph = dict(self.phases)
        prep = ph.pop("prepare", 0.0)
        out = {k: ph.get(k, 0.0) for k in ("generate", "reward", "reference", "old_logprobs")}
        out["other"] = max(prep - sum(out.values()), 0.0)
        out["actor_train"] = max(wall_s - prep, 0.0)
        ts, fwd, opt = ph.get("training_step", 0.0), ph.get("train_forward", 0.0), ph.get("optimizer", 0.0)
        detail = {"train_forward": fwd, "train_backward": max(ts - prep - fwd, 0.0), "optimizer": opt,
                  "clip_and_rest": max(wall_s - ts - opt, 0.0)}
        self.steps.append(FrameworkStep(len(self.steps), wall_s, None, out, tuple(self.rollouts), detail))
        self.texts.append(self.step_texts)
        self._reset()


def _instrument(trainer, rec: _Recorder) -> None:
    """Wrap the trainer's own methods on the instance (module docstring)."""
    gen, prep, logps, log = trainer._generate, trainer._prepare_inputs, trainer._get_per_token_logps_and_entropies, trainer.log

    def _generate(prompts, *a, **kw):
        out = gen(prompts, *a, **kw)
        rec.generated(prompts, out)
        return out

    def _prepare_inputs(*a, **kw):
        rec.in_prepare = True
        try:
            return prep(*a, **kw)
        finally:
            rec.in_prepare = False

    def _logps(model, *a, **kw):
        if not rec.in_prepare:
            return logps(model, *a, **kw)   # the training forward: part of actor_train
        phase = "reference" if model is trainer.ref_model else "old_logprobs"
        return rec.timed(phase, logps)(model, *a, **kw)

    def _log(logs, *a, **kw):
        out = log(logs, *a, **kw)   # TRL adds its averaged metrics (step_time among them) to ``logs``
        if "step_time" in logs:
            rec.logs[trainer.state.global_step] = {**logs, "step": trainer.state.global_step}
        return out

    trainer._generate = rec.timed("generate", _generate)
    trainer._calculate_rewards = rec.timed("reward", trainer._calculate_rewards)
    trainer._prepare_inputs = rec.timed("prepare", _prepare_inputs)
    trainer._get_per_token_logps_and_entropies = _logps
    trainer.log = _log
    trainer.compute_loss = rec.timed("train_forward", trainer.compute_loss)
    trainer.training_step = rec.timed("training_step", trainer.training_step)


def _callback(rec: _Recorder):
    from transformers import TrainerCallback

    class StepTimer(TrainerCallback):
        """Wall time of each optimizer step: on_step_begin to on_step_end."""

        def on_step_begin(self, args, state, control, **kw):
            rec.t0 = time.perf_counter()

        def on_pre_optimizer_step(self, args, state, control, **kw):
            rec.t_opt = time.perf_counter()

        def on_optimizer_step(self, args, state, control, **kw):
            rec.phases["optimizer"] += time.perf_counter() - rec.t_opt

        def on_step_end(self, args, state, control, **kw):
            rec.end_step(time.perf_counter() - rec.t0)

    return StepTimer()


def _trainer(spec: FrameworkSpec, root: Path, rec: "_Recorder", actor_path: str, reward_path: str | None,
             prompts: list[str], tok):
    """TRL's trainer for the spec: one generation of prompts_per_step x group_size completions and one
    optimizer step over all of them per step (per_device_train_batch_size = that many rollouts,
    gradient_accumulation_steps = steps_per_generation = 1, num_iterations = 1)."""
    import transformers
    import trl
    from datasets import Dataset

    common = dict(
        output_dir=str(root / "out"), per_device_train_batch_size=spec.rollouts_per_step,
        gradient_accumulation_steps=1, num_generations=spec.group_size,
        max_completion_length=spec.max_response_tokens, max_steps=spec.steps, learning_rate=1e-6,
        beta=REF_BETA[spec.algorithm] if spec.reference is not None else 0.0, logging_steps=1,
        save_strategy="no", report_to=[], use_cpu=True, seed=spec.seed, disable_tqdm=True,
        dataloader_num_workers=0, log_completions=False, bf16=False, fp16=False,
        model_init_kwargs={"dtype": spec.dtype})
    config, cls = (trl.GRPOConfig, trl.GRPOTrainer) if spec.algorithm == "grpo" else (trl.RLOOConfig, trl.RLOOTrainer)
    trainer = cls(model=actor_path, reward_funcs=[reward_path] if reward_path else [rule_reward], args=config(**common),
                  train_dataset=Dataset.from_dict({"prompt": prompts}), processing_class=tok,
                  reward_processing_classes=[tok] if reward_path else None, callbacks=[_callback(rec)])
    # Keep stdout for the caller (--format json): no per-step log dicts printed, no progress bars.
    trainer.remove_callback(transformers.PrinterCallback)
    trainer.remove_callback(transformers.ProgressCallback)
    _instrument(trainer, rec)
    return trainer


def run_trl(spec: FrameworkSpec, workdir: str | Path | None = None) -> list[FrameworkStep]:
    """Train ``spec.steps`` steps with TRL (module docstring) and return one FrameworkStep per step.
    ``workdir``: where the models and TRL's output go (default: a temporary directory, removed after)."""
    from rlhfsim.errors import RlhfsimError

    if spec.device != "cpu":
        raise RlhfsimError(f"--framework trl: expected --device cpu (the adapter runs TRL on the CPU), got {spec.device!r}")
    try:
        import trl
    except ImportError:
        raise RlhfsimError("--framework trl: expected trl to be installed (pip install -e '.[trl]'), it is not") from None
    if workdir is None:
        with tempfile.TemporaryDirectory(prefix="rlhfsim-trl-") as d:
            return run_trl(spec, d)
    import torch
    import transformers

    if spec.threads:
        torch.set_num_threads(spec.threads)
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    root = Path(workdir)
    tok = build_tokenizer(spec.actor.vocab)
    actor_path, reward_path, scale = _save_models(spec, tok, root)
    prompts = _prompts(spec, spec.actor.vocab)
    rec = _Recorder({p: i for i, p in enumerate(prompts)})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)   # transformers 5 renames (gradient checkpointing)
        _trainer(spec, root, rec, actor_path, reward_path, prompts, tok).train()
    steps = [FrameworkStep(s.step, s.wall_s, rec.logs.get(s.step + 1, {}).get("step_time"), s.phases_s, s.rollouts,
                           s.detail_s, rec.logs.get(s.step + 1, {})) for s in rec.steps]
    if spec.log_path:
        write_completions_log(spec.log_path, steps, rec.texts, {"framework": "trl", "trl_version": trl.__version__,
                                                                "algorithm": spec.algorithm, "eos_scale": scale,
                                                                "scenario": spec.name})
    return steps


def write_completions_log(path: str | Path, steps: list[FrameworkStep], texts: list[list[dict]] | None,
                          meta: dict) -> None:
    """The adapter's completions log: JSONL, a first line ``{"meta": {...}}``, then one line per completion
    (step, prompt_id, rollout, prompt_len, response_len, and the prompt and completion text when known).
    ``rlhfsim lengths import --format trl`` reads it."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    with open(p, "w") as f:
        f.write(json.dumps({"meta": meta}) + "\n")
        for s in steps:
            for i, r in enumerate(s.rollouts):
                row = {"step": s.step, "prompt_id": r.prompt_id, "rollout": r.rollout,
                       "prompt_len": r.prompt_len, "response_len": r.response_len}
                if texts is not None and s.step < len(texts) and i < len(texts[s.step]):
                    row.update(texts[s.step][i])
                f.write(json.dumps(row) + "\n")
