"""The shared contracts, in one place: phase and role names, the columns and file names of a run
directory and a plan directory, and the verl names of the step metrics. The simulator writes them, the
report reads them, the executor and validation compare against them; nothing else restates them.
Pure Python (no simpy, pydantic or plotly), so the simulator, the run reports, the planner, the importers
and ``calibrate/`` all import it.

A phase is the span of one kind of work in a step (first start to last end of its busy intervals).
Phases marked (opt-in) appear only when the scenario needs them (its ``execution`` block turns them on,
or its reward model reads another tokenizer than the actor's); a run without them records exactly the
phases it always did.
"""

from __future__ import annotations

# The phases of a step, in pipeline order (a ``<phase>_s`` column of steps.csv each).
PHASES: tuple[str, ...] = (
    "generate",       # rollout generation (the actor's engine)
    "retokenize",     # (opt-in) the actor's tokens decoded to text and tokenized for a reward model of another tokenizer
    "reward",         # reward model forward pass, or a rule-based checker on CPU workers
    "old_log_prob",   # (opt-in) the actor's forward pass recomputing log-probs under the rollout policy
    "reference",      # the reference model's log-prob forward pass
    "critic_fwd",     # the critic's value forward pass
    "adv",            # (opt-in) advantage computation (GAE / group-normalized) on the driver
    "actor_train",    # PPO epochs of actor forward + backward + optimizer steps
    "critic_train",   # the same for the critic
    "weight_sync",    # the trained weights reach the generation engine
)
OPT_IN_PHASES = ("retokenize", "old_log_prob", "adv")  # only when the scenario needs them (execution block; a
                                                       # reward model whose tokenizer is not the actor's)
BASE_PHASES = tuple(p for p in PHASES if p not in OPT_IN_PHASES)  # every run's; what the executor times
ROLES = ("actor", "critic", "reference", "reward", "rollout")
SEQUENCE_PARALLEL = ("actor", "critic", "reference")  # roles execution.ulysses_sequence_parallel_size applies to
CPU_POOL = "cpu"  # the pseudo-pool of driver-side work (rule rewards, advantages): intervals on no GPU

# Reward streaming strategies (``models.reward.streaming``; the classes are rlhfsim.sim.streaming.STREAMING,
# same names, same order) -> the reward-model architectures (ModelShape.arch) that can run each, and the
# strategy each architecture gets by default. Here so that the scenario schema and its checks need no
# simulator import; tests/unit/test_import_graph.py checks that the registry agrees.
STREAMING_ARCHS: dict[str, tuple[str, ...]] = {
    "incremental": ("decoder",),             # prefill onto the reward model's own causal KV cache
    "reencode": ("decoder", "encoder"),      # re-encode the whole prefix per chunk
    "final_only": ("decoder", "encoder"),    # score each response whole when it finishes
}
DEFAULT_STREAMING: dict[str, str] = {"decoder": "incremental", "encoder": "final_only"}

# Files of a run directory (``rlhfsim simulate --out DIR``).
SUMMARY_FILE = "summary.json"
STEPS_FILE = "steps.csv"
INTERVALS_FILE = "intervals.csv"
LENGTHS_FILE = "lengths.csv"
VERL_METRICS_FILE = "metrics.jsonl"  # one JSON object per step, verl's metric names
TENSORBOARD_DIR = "tensorboard"      # TensorBoard event files of the same metrics
RUN_FILES = (SUMMARY_FILE, STEPS_FILE, INTERVALS_FILE, LENGTHS_FILE)

# Files of the other commands' ``-o/--out DIR``.
PROFILE_FILE = "profile.json"        # rlhfsim calibrate
VALIDATION_FILE = "validation.json"  # rlhfsim validate
REPORT_FILE = "report.html"          # rlhfsim report
TRACE_FILE = "trace.json"            # rlhfsim report --trace
IMPORTED_SCENARIO_FILE = "scenario.yaml"  # rlhfsim import verl|openrlhf
IMPORT_JSON_FILE = "import.json"          # rlhfsim import ... --format json

# Files of a plan directory (``rlhfsim plan --out DIR``).
PLAN_FILE = "plan.json"
RESULTS_FILE = "results.csv"

# steps.csv: the fixed columns, then one ``<phase>_s`` per phase.
STEP_BASE_COLUMNS = ("step", "start_s", "end_s", "step_time_s", "generated_tokens", "trained_rollouts",
                     "deferred", "off_policy_token_frac", "chunk_tokens", "delta", "staleness")
PHASE_COLUMNS = tuple(f"{p}_s" for p in PHASES)
STEP_COLUMNS = STEP_BASE_COLUMNS + PHASE_COLUMNS
STEP_REQUIRED_COLUMNS = STEP_BASE_COLUMNS[:10]  # what the report needs (runs before ``staleness`` existed)
STEP_REQUIRED_VALUES = ("step", "start_s", "end_s", "step_time_s")  # the rest may be empty (NaN)
INTERVAL_COLUMNS = ("step", "pool", "gpu", "role", "phase", "start_s", "end_s", "active_s")
INTERVAL_REQUIRED_COLUMNS = INTERVAL_COLUMNS[:7]  # ``active_s`` came later
LENGTH_COLUMNS = ("step", "rollout_id", "prompt_len", "response_len")

# verl's names for our phases: its step metrics (``ray_trainer.py``: ``marked_timer("gen", ...)`` and so
# on, reported by ``verl/trainer/ppo/metric_utils.py``: compute_timing_metrics) under ``timing_s/``; the
# step itself is ``timing_s/step``. verl times reward scoring as ``timing_s/reward`` and the weight update
# of the rollout engine as ``timing_s/update_weights`` (older releases fold it into ``gen``). One dict, so
# that a new phase adds one line here and nowhere else; summary.verl_timing, ``simulate --names verl``,
# metrics.jsonl, the TensorBoard events and the importers' field table all read it.
VERL_PHASE_KEYS: dict[str, str] = {
    "generate": "timing_s/gen",
    "retokenize": "timing_s/retokenize",   # verl has no such timer (it sits inside timing_s/reward there)
    "reward": "timing_s/reward",
    "old_log_prob": "timing_s/old_log_prob",
    "reference": "timing_s/ref",
    "critic_fwd": "timing_s/values",
    "adv": "timing_s/adv",
    "actor_train": "timing_s/update_actor",
    "critic_train": "timing_s/update_critic",
    "weight_sync": "timing_s/update_weights",
}
VERL_STEP_KEY = "timing_s/step"
VERL_THROUGHPUT_KEY = "perf/throughput"        # tokens (prompt + response) per second per GPU
VERL_TOTAL_TOKENS_KEY = "perf/total_num_tokens"
VERL_RESPONSE_LENGTH_KEY = "response_length/mean"
VERL_PROMPT_LENGTH_KEY = "prompt_length/mean"

# Short descriptions of the phases (reports, the planner's one-line explanation).
PHASE_DESCRIPTIONS: dict[str, str] = {
    "generate": "generation",
    "retokenize": "re-tokenizing responses for the reward model",
    "reward": "reward scoring",
    "old_log_prob": "the actor's old-log-prob pass",
    "reference": "the reference pass",
    "critic_fwd": "the critic forward pass",
    "adv": "advantage computation",
    "actor_train": "actor training",
    "critic_train": "critic training",
    "weight_sync": "weight sync",
}

assert set(VERL_PHASE_KEYS) == set(PHASES) == set(PHASE_DESCRIPTIONS)


def verl_timing(phases_s: dict[str, float], step_time_s: float) -> dict[str, float]:
    """Mean phase spans under verl's metric names (``VERL_PHASE_KEYS``), plus ``timing_s/step``. A phase
    the run did not record is left out (verl logs only the timers it ran)."""
    out = {VERL_PHASE_KEYS[p]: float(phases_s[p]) for p in PHASES if p in phases_s}
    out[VERL_STEP_KEY] = float(step_time_s)
    return out
