"""The shared contracts, in one place: phase and role names, the columns and file names of a run
directory and a plan directory, and the verl names of the step metrics. The simulator writes them, the
report reads them, the executor and validation compare against them; nothing else restates them."""

from __future__ import annotations

# The phases of a step, in pipeline order (a ``<phase>_s`` column of steps.csv each).
PHASES = ("generate", "reward", "reference", "critic_fwd", "actor_train", "critic_train", "weight_sync")
ROLES = ("actor", "critic", "reference", "reward", "rollout")

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

# verl's names (``verl/trainer/ppo/metric_utils.py``: compute_timing_metrics, compute_throughout_metrics)
# for our phases. One dict, so that a new phase adds one line here and nowhere else.
VERL_PHASE_KEYS = {
    "generate": "timing_s/gen",
    "reward": "timing_s/reward",
    "reference": "timing_s/ref",
    "critic_fwd": "timing_s/values",
    "actor_train": "timing_s/update_actor",
    "critic_train": "timing_s/update_critic",
    "weight_sync": "timing_s/sync_weights",
}
VERL_STEP_KEY = "timing_s/step"
VERL_THROUGHPUT_KEY = "perf/throughput"        # tokens (prompt + response) per second per GPU
VERL_TOTAL_TOKENS_KEY = "perf/total_num_tokens"
VERL_RESPONSE_LENGTH_KEY = "response_length/mean"
VERL_PROMPT_LENGTH_KEY = "prompt_length/mean"
