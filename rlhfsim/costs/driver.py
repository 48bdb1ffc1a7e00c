"""The driver's CPU work between the forward passes and training: the advantage computation (verl's phase ``adv``,
timed by ``timing_s/adv``), priced from what verl's code does with the batch's CPU tensors.

verl holds the batch on the driver as CPU tensors of R rows by W response positions, every response padded to the
response cap (its rollouts pad to ``response_length``, so W is the cap, not the longest response), and computes in a
Ray task of one CPU (torch on one thread). Per estimator, in seconds::

    GAE (a critic):   t = W x k x (c_op + R x c_col)  +  p_gae x R x W x c_el
    GRPO, RLOO:       t = R x c_row                   +  p_grpo x R x W x c_el
    rollout metrics:  + p_metrics x R x W x c_el       (verl >= 0.9's default; ``rollout_metrics``)

* GAE's reverse loop over the W positions runs k small tensor ops per position on [R] column slices: each costs a
  fixed dispatch ``c_op`` (``adv_per_op_s``) and ``c_col`` per row (``adv_per_strided_s``: a column of a row-major
  [R, W] tensor is strided, one cache line per row). k = 5 up to verl 0.4 (``plain``: nextvalues, delta, the
  discounted sum); 13 from verl 0.5 (``masked``: the observation-token masks of multi-turn rollouts, applied to
  both carried values every position).
* Element-wise passes over [R, W] at ``c_el`` per element (``adv_per_element_s``), counted from verl's code (each
  operation reading or writing the whole tensor one pass): GAE 16 (the stacked advantages 1, the returns 1,
  ``masked_whiten`` 14: its mean 3, ``masked_var`` 9, which takes the mean again, the whitening 2), 22 from verl
  0.5 (``masked_sum``'s ``torch.where`` on a ``bool`` mask, 2 more in each of the 3 masked means); GRPO 2 (the score
  sum, the mask product); the rollout-correction metrics 41 (``compute_offpolicy_metrics``: 7 masked means or sums
  at 4-5 passes, the log-ratio, the K3 and chi-square terms, and the mask checks and copy around it).
* GRPO's Python loops per row (``c_row``, ``adv_per_row_s``): indexing a 0-d score and appending it, then per row
  the normalization (index, subtract, add, divide, assign), with the group statistics amortized over the rows.

The four costs are host work: the profile states them for its reference host (``CostModel.host_factor`` carries
them to the GPU's host). Their defaults (``rlhfsim.costs.stepcosts``) are ``calibrate.measuring.advbench``'s timings of verl's
code paths on this project's VM, times the VM-to-reference-host factor. What is not priced: the reward's extraction
and the batch bookkeeping on the same timer (small), and verl <= 0.3.0's reward function, which that release ran
inside the ``adv`` timer (later releases time it as ``reward``).
"""

from __future__ import annotations

from dataclasses import dataclass

# Tensor ops per position of GAE's reverse loop, and element-wise passes over [R, W] (module docstring).
GAE_LOOP_OPS = {"plain": 5, "masked": 13}
GAE_PASSES = {"plain": 16, "masked": 22}
GRPO_PASSES = 2
METRIC_PASSES = 41
ADV_SCALARS = ("adv_per_op_s", "adv_per_strided_s", "adv_per_element_s", "adv_per_row_s")


@dataclass(frozen=True)
class AdvantageCode:
    """Which of verl's code paths the driver runs (the scenario's ``execution.advantage``)."""

    gae_loop: str = "masked"        # plain (verl <= 0.4) | masked (verl >= 0.5)
    rollout_metrics: bool = False   # verl's rollout-correction metrics on the adv timer (rollout log-probs returned)


@dataclass(frozen=True)
class AdvantageCosts:
    """The host's costs of that code (profile ``step.adv_*``), seconds."""

    adv_per_op_s: float
    adv_per_strided_s: float
    adv_per_element_s: float
    adv_per_row_s: float


def advantage_parts(c: AdvantageCosts, code: AdvantageCode, rows: int, width: int, gae: bool) -> dict[str, float]:
    """Seconds of the driver's advantage step by part (``loop``: GAE's positions or GRPO's rows; ``passes``: the
    element-wise passes over rows x width; ``metrics``: the rollout-correction metrics), summing to its price."""
    if rows <= 0 or width <= 0:
        return {}
    cells = float(rows) * width
    if gae:
        k = GAE_LOOP_OPS[code.gae_loop]
        out = {"loop": width * k * (c.adv_per_op_s + rows * c.adv_per_strided_s),
               "passes": GAE_PASSES[code.gae_loop] * cells * c.adv_per_element_s}
    else:
        out = {"loop": rows * c.adv_per_row_s, "passes": GRPO_PASSES * cells * c.adv_per_element_s}
    if code.rollout_metrics:
        out["metrics"] = METRIC_PASSES * cells * c.adv_per_element_s
    return out
