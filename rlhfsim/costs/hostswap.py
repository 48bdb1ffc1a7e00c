"""NeMo RL's host swap: what a colocated GRPO step with a Megatron policy worker and vLLM moves across each GPU's
host link, besides the weight update itself (cost term ``host_swap``; scenario key ``execution.offload.megatron_swap``).

NeMo RL (nemo_rl/algorithms/grpo.py ``grpo_train`` and ``refit_policy_generation``; the worker
nemo_rl/models/policy/workers/megatron_policy_worker.py) makes room for vLLM on the training GPUs every step:

* ``offload_before_refit``: the gradient buffers are freed (Megatron's ``offload_to_cpu(move_grads)`` resizes them
  to nothing: no copy) and the distributed optimizer's state goes to host memory (``move_optimizer("cpu")``: every
  state tensor ``.to("cpu")``);
* after the weights are streamed into vLLM, ``offload_after_refit``: the model's parameter buffers go to pinned host
  memory (``move_model(..., "cpu")``, Megatron's ``param_data.cpu().pin_memory()``, then a pinned copy);
* ``prepare_for_lp_inference`` (before the log-prob passes): the parameters come back (``reload_from_cpu``);
* the reference log-probs (``use_reference_model``): the policy's state dict is copied to host memory, the
  reference's (kept in host memory) copied into the model, and after the pass the policy's copied back: three copies
  of the model's weights on this GPU;
* ``prepare_for_training``: the optimizer state comes back (``move_optimizer("cuda")``).

Per GPU and step, with W_r the actor's weight bytes on one GPU (its tensor-parallel slice, 1/ep of the routed
experts, its pipeline stage's layers, the largest stage where the split is uneven: as the memory check counts them)
and P the parameters over the n GPUs of the actor's pool (the distributed optimizer shards its fp32 master weights
and two Adam moments, 12 bytes a parameter, over the data-parallel ranks of each parameter: 12 P / n a GPU whatever
the layout)::

    bytes = 2 W_r (parameters out and back) + 2 x 12 P / n (optimizer state out and back) + 3 W_r (reference swap)
    t     = bytes / (host_link_bw x host_copy_eff)

vLLM's own sleep (level 1 in ``finish_generation``) and wake are the weight update's ``sleep_wake_s``
(``execution.weight_sync.engine_sleep``), not this term. The phases of a synchronous colocated step run one after the
other, so the term is recorded in the weight update's phase (where NeMo RL times the first two moves, under
``prepare_for_generation/total``) for the whole step's traffic. Not priced: the optimizer's moves are to and from
pageable host memory (``.to("cpu")`` without pinning), slower than the pinned rate priced here; the eight GPUs of a
node share their host's memory bandwidth.
"""

from __future__ import annotations

from rlhfsim.costs.parallel import stage_layers
from rlhfsim.costs.stepcosts import OPTIMIZER_STATE_BYTES
from rlhfsim.models.catalog import DTYPE_BYTES

REFERENCE_SWAP_COPIES = 3   # policy out, reference in, policy back in (use_reference_model)
PARAM_COPIES = 2            # offload_after_refit out, prepare_for_lp_inference back


def rank_weight_bytes(shape, dtype: str, tp: int, lay, head: str = "lm") -> float:
    """The weight bytes one GPU holds of a Megatron-laid-out model (``lay``: the role's ``execution.megatron``): its
    tensor-parallel slice, 1/ep of the routed experts (split over etp where set), its pipeline stage's share of the
    layers (the largest stage where the split is uneven), as ``rlhfsim.scenario.checks`` counts resident weights."""
    bpp = DTYPE_BYTES[dtype]
    b = shape.params(head) * bpp / tp
    if lay.ep > 1 and shape.is_moe:
        routed = shape.routed_params
        b -= routed * bpp / tp * (1 - 1 / lay.ep)
        if lay.etp is not None:
            b += routed * bpp / lay.ep * (1 / lay.etp - 1 / tp)
    if lay.pp > 1 and (lay.first_stage_layers is not None or lay.last_stage_layers is not None):
        b *= max(stage_layers(shape.layers, lay.pp, lay.first_stage_layers, lay.last_stage_layers)) / shape.layers
    elif lay.pp > 1:
        b /= lay.pp
    return b


def swap_parts_bytes(shape, dtype: str, tp: int, lay, pool_gpus: int, reference: bool) -> dict[str, float]:
    """Bytes one GPU moves over its host link in a step: ``params`` (out after the update, back before the log-prob
    pass), ``optimizer`` (the distributed optimizer's 12 bytes a parameter, 1/n of them a GPU, out and back) and
    ``reference`` (the reference pass's three copies; 0 without a reference model)."""
    w = rank_weight_bytes(shape, dtype, tp, lay)
    return {"params": PARAM_COPIES * w,
            "optimizer": 2 * OPTIMIZER_STATE_BYTES * shape.params("lm") / max(pool_gpus, 1),
            "reference": REFERENCE_SWAP_COPIES * w if reference else 0.0}


def host_swap_s(sim) -> float:
    """Seconds of NeMo RL's host swap per step on one GPU of the actor's pool (0 unless
    ``execution.offload.megatron_swap``): ``swap_parts_bytes`` over the host link (``CostModel.host_copy_s``)."""
    s = sim.setup
    if not s.scenario.execution.offload.megatron_swap:
        return 0.0
    parts = swap_parts_bytes(s.shapes["actor"], s.dtypes["actor"], s.tp["actor"], s.scenario.execution.megatron.actor,
                             s.pool_of("actor").gpus, "reference" in s.shapes)
    return sim.cost.host_copy_s(sum(parts.values()))
