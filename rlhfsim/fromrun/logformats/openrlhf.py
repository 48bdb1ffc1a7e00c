"""OpenRLHF's console log: one ``Global step N: {...}`` line per step.

What OpenRLHF prints per step (``openrlhf/trainer/ppo_trainer.py``, ``PPOTrainer.fit``), by release:

* 0.8.5 to 0.9.5: ``logger.info(f"✨ Global step {steps}: {status}")``: the Python ``repr`` of the step's status
  dict (losses, ``reward``, ``response_length``, ``total_length``, ``kl``, ``actor_lr``, ...), no timers. Behind
  OpenRLHF's log prefix ``INFO 06-16 10:00:00 ppo_trainer.py:525]`` and Ray's ``(PPOTrainer pid=...)``. Before it,
  each step prints ``✨ Experience making completed in H:MM:SS`` (0.7.0 on): read as that step's
  ``timing/make_experience`` in whole seconds where the step line has none (a note says so).
* 0.9.6 on (commit 4908e6ee, 2026-03-19): the same line with per-phase timers in seconds: ``timing/generation`` (vLLM rollouts),
  ``timing/make_experience`` (reward, reference, critic values and the actor's log-probs, and the advantages),
  ``timing/ppo_train`` (actor and critic training), ``timing/broadcast`` (weights to vLLM) and
  ``timing/step_total`` (their sum), with rollout statistics (``rollout/response_length_mean``,
  ``rollout/truncated_rate``, ...).
* before 0.8.5: no per-step console line (metrics went to the tqdm bar, wandb and TensorBoard only; with
  ``--perf`` the wandb/TensorBoard keys ``perf/experience_maker/{generate_time,actor_value_rm_time,wait_time}``):
  read its wandb or TensorBoard export instead.

Evaluation: ``✨ Evaluation completed in H:MM:SS, global_step N, eval_metrics: {...}`` (0.8.5 on) is a
validation record of step N.

A value is read as a number (Python's float or int repr, ``np.float64(x)``, ``tensor(x)``); other values
(strings, lists) are not metrics. A line whose dict does not close (cut short), with bytes that are not text, or
whose entries are not ``'key': value`` is skipped with its reason.
"""

from __future__ import annotations

import re

from rlhfsim.fromrun.logformats.base import ANSI, BINARY, BadLine, LogRead, StepLine, excerpt, number

FORMAT = "OpenRLHF console"
GLOBAL_STEP = re.compile(r"Global step (\d+): (\{.*)$")
EXPERIENCE = re.compile(r"Experience making completed in (\d+):(\d\d):(\d\d)")
EVALUATION = re.compile(r"Evaluation completed in [^,]*, global_step (\d+), eval_metrics: (\{.*)$")
MARKER = re.compile(r"Global step \d+: \{")

# OpenRLHF's timers -> the simulator's phases each spans (contracts.PHASES); the fit compares sums over them.
PHASE_KEYS: dict[str, tuple[str, ...]] = {
    "timing/generation": ("generate",),
    "timing/make_experience": ("reward", "old_log_prob", "reference", "critic_fwd", "adv"),
    "timing/ppo_train": ("actor_train", "critic_train"),
    "timing/broadcast": ("weight_sync",),
    "perf/experience_maker/generate_time": ("generate",),
    "perf/experience_maker/actor_value_rm_time": ("reward", "old_log_prob", "reference", "critic_fwd"),
}
STEP_KEY = "timing/step_total"


def looks_like(text: str) -> bool:
    return MARKER.search(text) is not None


def split_dict(body: str) -> tuple[list[tuple[str, str]], str | None]:
    """The ``'key': value`` entries of a dict's repr (values as text), or a reason it cannot be read whole."""
    if not body.startswith("{"):
        return [], "expected a dict after the step"
    items, depth, quote, start = [], 0, None, 1
    i = 0
    for i, c in enumerate(body):
        if quote:
            if c == "\\":
                continue
            if c == quote and body[i - 1] != "\\":
                quote = None
        elif c in "'\"":
            quote = c
        elif c in "{[(":
            depth += 1
        elif c in "}])":
            depth -= 1
            if depth == 0:
                items.append(body[start:i])
                break
        elif c == "," and depth == 1:
            items.append(body[start:i])
            start = i + 1
    else:
        return [], "truncated line (the dict does not close)"
    if body[i + 1:].strip():
        return [], f"text after the dict ({body[i + 1:].strip()[:20]!r}; two lines run together?)"
    out = []
    for it in items:
        it = it.strip()
        if not it:
            continue
        m = re.match(r"""^(['"])(.*?)\1\s*:\s*(.*)$""", it, re.S)
        if m is None:
            return [], f"malformed entry {it[:30]!r} (expected 'key': value)"
        out.append((m.group(2), m.group(3).strip()))
    return out, None


def read(text: str, source: str) -> LogRead:
    """Every ``Global step`` and evaluation line of an OpenRLHF console log (module docstring)."""
    out = LogRead(source, FORMAT, framework="openrlhf")
    made: float | None = None        # the last "Experience making completed in H:MM:SS", seconds
    whole_seconds = False
    for i, raw in enumerate(text.split("\n"), 1):
        exp = EXPERIENCE.search(raw) if "Experience making" in raw else None
        if exp:
            made = int(exp.group(1)) * 3600 + int(exp.group(2)) * 60 + int(exp.group(3))
            continue
        low = raw.lower()
        if "global step" not in low and "global_step" not in low:
            continue
        line = ANSI.sub("", raw).rstrip("\r ")
        m = GLOBAL_STEP.search(line)
        kind = "train"
        if m is None:
            m = EVALUATION.search(line)
            kind = "validation"
        if m is None:
            continue
        step = int(m.group(1))
        if BINARY.search(line):
            out.bad.append(BadLine(i, "binary bytes in the line (not text)", excerpt(line), step))
            continue
        entries, why = split_dict(m.group(2))
        if why:
            out.bad.append(BadLine(i, why, excerpt(line), step))
            continue
        metrics = {}
        for k, v in entries:
            x = number(v)
            if x is not None:
                metrics[("eval/" + k) if kind == "validation" and not k.startswith("eval") else k] = x
            elif k.startswith("timing/"):
                why = f"non-numeric value {k}:{v[:24]!r}"
                break
        if why:
            out.bad.append(BadLine(i, why, excerpt(line), step))
            continue
        if kind == "train" and made is not None and "timing/make_experience" not in metrics:
            metrics["timing/make_experience"] = float(made)
            whole_seconds = True
        if kind == "train":
            made = None
        out.steps.append(StepLine(step, i, metrics, kind, source))
    if whole_seconds:
        out.notes.append(f"{source}: timing/make_experience from 'Experience making completed in H:MM:SS' lines "
                         f"(whole seconds; OpenRLHF before 0.9.6 has no timer on the step line)")
    return out
