"""A real executor: PPO/GRPO steps on the local device (cpu, or cuda) with real, small, random-weight
models built from ModelShape configs (actor, critic with a value head, reference, reward model), timed
with the simulator's phase names and boundaries so ``rlhfsim validate`` can compare the two.

    run_steps(ExecConfig(...)) -> list[StepResult]
    run_interleaved([ExecConfig(...), ...]) -> one list per config (their steps round-robin)

Modules: ``config`` (ExecConfig, StepResult, validation), ``generation`` (static and continuous engines
over a StaticKVDecoder), ``scorer`` (OPPO intra-step chunk scoring thread), ``training`` (forwards and
PPO losses), ``timing`` (clock, per-step log), ``run`` (the step loop). The rules the simulator mirrors
are stated in each module's docstring; in short:

- t = 0 when generation starts; step time = end of the last phase. Phase span = first start .. last end.
- Rollouts are taken from ``cfg.rollouts`` in order; each decodes exactly its response_len tokens.
- Sync: generate -> reward -> reference -> critic_fwd -> actor_train -> critic_train -> weight_sync.
- Intra: ceil(R / chunk_tokens) chunks per rollout scored during generation by a scorer thread; after
  generation the reward phase lasts until the queue is empty.
- Inter: (B + delta) * g rollouts in flight; generation ends when B * g have finished; the first B * g
  finished are trained, the rest (unfinished, not yet admitted, or finished in the same call beyond
  B * g) are carried, with their tokens, and with their KV slots when keep_kv.
"""

from calibrate.executor.config import ExecConfig, StepResult
from rlhfsim.contracts import BASE_PHASES as PHASES  # the simulator's phases the executor times (no opt-in ones)
from calibrate.executor.run import RoundRobin, run_interleaved, run_steps

__all__ = ["ExecConfig", "StepResult", "RoundRobin", "run_interleaved", "run_steps", "PHASES"]
