"""A launch and a log that disagree: refused before anything is fitted, one line per disagreement.

A fit prices the launch and compares it with the log, so the two must be one run. Checked (``check_agreement``):

* **algorithm**: a launch with a critic (verl ``algorithm.adv_estimator=gae``: PPO) and a log with no critic metric
  in any steady step (``timing_s/values``, ``timing_s/update_critic``, ``critic/vf_loss``, ``critic/vpred_mean``,
  ``perf/mfu/critic``; OpenRLHF: ``critic_loss``), or a critic-free launch (GRPO, RLOO, ...) whose log has them;
* **roles**: the reference policy's pass: a launch that runs it (a KL loss or KL reward) and a log with no
  ``timing_s/ref``, or the reverse (verl times ``ref`` whenever it runs one; a log without per-phase timers is not
  checked);
* **caps**: a logged ``response_length/max`` above the launch's response cap (verl ``data.max_response_length``:
  a response is never longer) or ``prompt_length/max`` above its prompt cap, in any training step.

Each disagreement is one line naming the launch setting, what the launch says and what the log says, with the log
line that shows it; all of them are raised together as one ``LaunchLogMismatch`` (exit 2).
"""

from __future__ import annotations

from rlhfsim.errors import ScenarioError
from rlhfsim.fromrun.logs import Steady

CRITIC_KEYS = ("timing_s/values", "timing_s/update_critic", "critic/vf_loss", "critic/vpred_mean", "perf/mfu/critic",
               "critic_loss")
REFERENCE_KEY = "timing_s/ref"
TIMERS = ("timing_s/gen", "timing_s/update_actor")   # a log with these times its phases one by one (verl)

# The launch's own names for what is checked, by framework.
SETTINGS = {
    "verl": {"algorithm": "algorithm.adv_estimator", "reference": "actor_rollout_ref.actor.use_kl_loss / "
             "algorithm.use_kl_in_reward", "response": "data.max_response_length", "prompt": "data.max_prompt_length"},
    "openrlhf": {"algorithm": "--advantage_estimator / --critic_pretrain", "reference": "--init_kl_coef / --use_kl_loss",
                 "response": "--generate_max_len", "prompt": "--prompt_max_len"},
}


class LaunchLogMismatch(ScenarioError):
    """A launch and a log that are not one run: the first disagreement, with the others in ``more``."""


def _first(steps, key: str, above: float | None = None):
    for s in steps:
        v = s.metrics.get(key)
        if v is not None and (above is None or v > above):
            return s, v
    return None, None


def check_agreement(steady: Steady, scenario, framework: str = "verl", launch: str = "launch") -> None:
    """Raise ``LaunchLogMismatch`` listing every disagreement of ``scenario`` (the imported launch) with the log's
    steps (module docstring); return None when they agree."""
    names = SETTINGS.get(framework, SETTINGS["verl"])
    src = steady.source
    unit = steady.unit
    kept = steady.kept
    keys = set().union(*(s.metrics for s in kept)) if kept else set()
    out: list[tuple[str, str]] = []
    kind = scenario.algorithm.kind
    critic_launch = scenario.models.critic is not None
    critic_log = sorted(k for k in CRITIC_KEYS if k in keys)
    if critic_launch and not critic_log:
        out.append((names["algorithm"], f"the launch ({launch}) runs {kind.upper()} with a critic, but the log ({src}) "
                    f"has no critic metric ({', '.join(CRITIC_KEYS[:3])}, ...) in its {len(kept)} steady steps ("
                    f"{steady.lines()}): a critic-free (GRPO-style) run's log?"))
    elif not critic_launch and critic_log:
        s, _ = _first(kept, critic_log[0])
        out.append((names["algorithm"], f"the launch ({launch}) runs {kind.upper()} without a critic, but the log ({src}) "
                    f"has critic metrics ({', '.join(critic_log[:3])}; {unit} {s.line}): a PPO run's log?"))
    if all(k in keys for k in TIMERS):
        ref_launch = scenario.models.reference is not None
        if ref_launch and REFERENCE_KEY not in keys:
            out.append((names["reference"], f"the launch ({launch}) runs the reference policy's pass, but the log ({src}) "
                        f"has no {REFERENCE_KEY} in its steady steps ({steady.lines()})"))
        elif not ref_launch and REFERENCE_KEY in keys:
            s, v = _first(kept, REFERENCE_KEY)
            out.append((names["reference"], f"the launch ({launch}) runs no reference pass (no KL term), but the log "
                        f"({src}) times one ({REFERENCE_KEY}:{v:g} at {unit} {s.line}); set the KL option the run used "
                        f"(verl before 0.3 ran the reference always)"))
    train = steady.logged or kept     # every training step of the log (a subset's Steady has only its kept ones)
    for what, key, cap in (("response", "response_length/max", scenario.workload.max_response_tokens),
                           ("prompt", "prompt_length/max", scenario.workload.max_prompt_tokens)):
        s, v = _first(sorted(train, key=lambda x: x.line), key, above=cap)
        if s is not None:
            out.append((names[what], f"the launch ({launch}) caps {what}s at {cap} tokens, but the log ({src}) has "
                        f"{key}:{v:g} (step {s.step}, {unit} {s.line}): another run's launch, or a cap set "
                        f"elsewhere (pass it with --set)"))
    if out:
        errs = [LaunchLogMismatch(p, m) for p, m in out]
        raise LaunchLogMismatch(out[0][0], out[0][1], more=errs[1:])
