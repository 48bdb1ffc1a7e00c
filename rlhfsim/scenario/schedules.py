"""Every schedule's config model (the ``schedule:`` block of a scenario), and their registry ``CONFIGS``.

The schedules themselves (SimPy processes) live in ``rlhfsim.sim.schedules``, one module each, and
their registry ``SCHEDULES`` pairs each class with its config here (``Schedule.Config``); importing it
checks that both list the same schedules in the same order, so the names are written once, as each
config's ``kind``. The configs live here, on the scenario's side, so that loading a scenario imports
neither simpy nor the simulator (the schema's ``schedule`` union and the ``--compare`` names are
derived from ``CONFIGS``); a new schedule is its config here and its class in ``rlhfsim/sim/schedules/``.

Each config may override ``check(sc)``: cross-field checks of its block against the rest of the
scenario (run by ``rlhfsim.scenario.checks.build_setup``), raising ScenarioError with the YAML path.
``VARIANTS`` are the ``--compare`` names it offers (default: its kind); what each stands for is the
schedule class's ``variants(sc)``.
"""

from __future__ import annotations

from typing import ClassVar, Literal, Optional

from pydantic import Field

from rlhfsim.errors import ScenarioError
from rlhfsim.scenario.fields import Count, Frozen, PositiveInt, Tokens


class ScheduleConfig(Frozen):
    """The shape of a schedule block: a ``kind`` literal (the schedule's name) and its knobs."""

    VARIANTS: ClassVar[tuple[str, ...]] = ()  # --compare names; empty: the kind alone

    @classmethod
    def kind_name(cls) -> str:
        return cls.model_fields["kind"].default

    @classmethod
    def variant_names(cls) -> tuple[str, ...]:
        return cls.VARIANTS or (cls.kind_name(),)

    def check(self, sc) -> None:
        """Raise ScenarioError for a block that cannot run with the rest of scenario ``sc``."""


# --- sync, OPPO, partial rollouts (rlhfsim.sim.schedules.overlap) ---------------------------------
class SyncSchedule(ScheduleConfig):
    kind: Literal["sync"] = "sync"


class AdaptiveChunk(Frozen):
    window_steps: PositiveInt = Field(50, description="Steps per window; each candidate is tried on different steps at the start of a window.")
    candidates: list[Tokens] = Field([128, 256, 512], min_length=1, max_length=64, description="Chunk sizes to try.")


class Intra(Frozen):
    enabled: bool = Field(True, description="Stream responses to the reward model in chunks during generation.")
    chunk_tokens: Tokens = Field(256, description="Tokens per chunk (initial value when adaptive).")
    adaptive: Optional[AdaptiveChunk] = Field(None, description="Tune the chunk size online.")
    stream_reference_critic: bool = Field(False, description="Also stream chunks to the reference and critic forward passes.")
    max_chunk_batch: PositiveInt = Field(1, description="Chunks (of different sequences) a scorer replica prefills in one call; 1 scores each chunk as it comes.")
    resume: Literal["cached", "reprefill"] = Field("cached", description="How the actor's next generate() call starts after a chunk boundary (static engine, a runtime whose calls return at boundaries, e.g. hf_generate): `cached` continues on the returned KV cache (the boundary costs the runtime's measured handoff); `reprefill` gets the token ids only, as a wrapper around TRL's generate gets them (TRL returns sequences, never the cache), and prefills every row's prompt and tokens so far again, priced by the runtime's prefill fit (rlhfsim.sim.engines.static).")
    stop_at: Literal["token", "call"] = Field("token", description="When a row that ends inside a chunk counts towards OPPO's first B, and so when the step can stop (static engine, a runtime whose calls return at boundaries): `token` at once (per-step control); `call` when its generate() call returns at the next chunk boundary or the batch's end, as a wrapper around TRL's generate sees rows only between calls (rlhfsim.sim.engines.static).")


class RewardCurve(Frozen):
    """Reward the simulator pretends training reaches at step s (it has no real rewards):
    r(s) = r_max x (1 - exp(-s / tau)) + noise."""

    r_max: float = Field(1.0, ge=-1e6, le=1e6, description="Asymptotic reward.")
    tau_steps: float = Field(60.0, gt=0, le=1e9, description="Steps to reach 63% of r_max.")
    noise_std: float = Field(0.02, ge=0, le=1e6, description="Gaussian noise on each step's reward (so the windowed slope can turn negative once the curve saturates).")


class AdaptiveDelta(Frozen):
    window_steps: int = Field(10, ge=2, le=100_000, description="Window over which the reward slope is measured (a slope needs at least 2 steps).")
    min: Count = Field(0, description="Lower bound of delta.")
    max: PositiveInt = Field(32, description="Upper bound of delta.")
    step: PositiveInt = Field(4, description="Change of delta per window.")
    curve: RewardCurve = RewardCurve()


class Inter(Frozen):
    enabled: bool = Field(True, description="Keep B + delta prompts in flight and train on the first B to finish.")
    delta: Count = Field(16, description="Extra prompts in flight (initial value when adaptive).")
    adaptive: Optional[AdaptiveDelta] = None
    keep_kv: bool = Field(True, description="Deferred sequences keep their KV cache; false: pay a re-prefill of prompt + generated tokens.")


class OppoSchedule(ScheduleConfig):
    kind: Literal["oppo"] = "oppo"
    VARIANTS: ClassVar[tuple[str, ...]] = ("oppo-intra", "oppo-inter", "oppo")
    intra: Intra = Intra()
    inter: Inter = Inter()

    def check(self, sc) -> None:
        a = self.inter.adaptive
        if a is not None and a.min > a.max:
            raise ScenarioError("schedule.inter.adaptive.min", f"expected min <= max ({a.max}), got {a.min}")


class PartialSchedule(ScheduleConfig):
    kind: Literal["partial"] = "partial"
    token_budget: int = Field(ge=1, le=1_000_000_000, description="Decode tokens generated per step over all replicas (Kimi k1.5 partial rollouts); unfinished responses continue next step from a buffer.")
    extra_prompts: Count = Field(0, description="Prompts admitted beyond B to keep the engine full.")


# --- asynchronous (rlhfsim.sim.schedules.asynchronous) --------------------------------------------
class AsyncSchedule(ScheduleConfig):
    kind: Literal["async"] = "async"
    max_staleness: int = Field(1, ge=0, le=1000, description="Generation may run ahead of training by at most this many steps (AReaL); 0 is synchronous.")
    generator: Literal["batch", "groups"] = Field("batch", description="How the generation pool works: `batch`, one step's batch generated whole (every row to its end) before the next begins; `groups`, NeMo RL's AsyncTrajectoryCollector: prompt groups start one by one while fewer than max_staleness x prompts_per_step groups are in flight, each group's slot refilled as soon as the group's last row ends, a group for step t starting once training has finished step t - 1 - max_staleness (so the next batch fills the tail of the last, and up to max_staleness batches generate at once). `groups` needs the continuous engine on a pool of its own.")
    in_flight_weight_updates: bool = Field(False, description="With generator `groups`: the weight update does not wait for the groups in flight (NeMo RL's grpo.async_grpo.in_flight_weight_updates with vLLM's async engine); decode pauses on the generation pool while the weights load, and no group starts. False: the update waits until every group in flight has ended (NeMo RL's wait_for_pending_generations).")


    def check(self, sc) -> None:
        if self.in_flight_weight_updates and self.generator != "groups":
            raise ScenarioError("schedule.in_flight_weight_updates", f"expected generator: groups (a weight update into generation in flight), got generator: {self.generator}")
        if self.generator != "groups":
            return
        if self.max_staleness < 1:
            raise ScenarioError("schedule.max_staleness", "expected >= 1 with generator: groups (the groups in flight are max_staleness x prompts_per_step), got 0")
        if sc.generation.engine != "continuous":
            raise ScenarioError("generation.engine", f"expected continuous with schedule.generator: groups (groups join a running engine), got {sc.generation.engine}")
        pools = sc.placement.pools if sc.placement.kind == "pools" else []
        if not any(list(p.roles) == ["rollout"] for p in pools):
            raise ScenarioError("placement", "expected a pool holding the rollout role alone with schedule.generator: groups (generation runs on its own GPUs throughout), got none")


# --- tail batching (rlhfsim.sim.schedules.tail) ---------------------------------------------------
class TailSchedule(ScheduleConfig):
    kind: Literal["tail"] = "tail"
    extra_prompts: Count = Field(16, description="Prompts a short round launches beyond B (x group_size rollouts); generation stops once B rollouts have finished and the rest go to the tail buffer.")
    keep_kv: bool = Field(False, description="Rollouts in the tail buffer keep their KV cache until their long round; false (RollPacker's memory-bounded choice): they re-prefill prompt + generated tokens when they resume.")


# The registry of configs, in the order of rlhfsim.sim.schedules.SCHEDULES (checked there on import).
CONFIGS: tuple[type[ScheduleConfig], ...] = (SyncSchedule, OppoSchedule, PartialSchedule, AsyncSchedule, TailSchedule)
# --compare names, in registry order; each belongs to exactly one schedule.
VARIANTS: tuple[str, ...] = tuple(v for cfg in CONFIGS for v in cfg.variant_names())
