"""Synchronous PPO, OPPO (intra-step streaming + inter-step overcommitment) and partial rollouts share one
step loop; they differ only in what is in flight, when generation stops, and what streams.

Per step s:
  1. In flight: rollouts carried from step s-1 first, then new prompts up to the target
     (sync: B; OPPO inter: B + delta; partial: B + extra_prompts), B counted in rollouts (prompts x group).
  2. Generation: sync runs every rollout to its end; OPPO inter stops every replica once B rollouts have
     finished (the unfinished keep their tokens, and their KV cache when ``keep_kv``); partial gives each
     rollout at most ``token_budget`` new tokens this step (it then re-prefills next step).
     OPPO intra streams every ``chunk_tokens`` tokens of each rollout to the reward model's chunk scorer.
  3. Train on the first B finished (OPPO) / all finished (partial) / all (sync); the rest carry over.
"""

from __future__ import annotations

import json
import math
import numpy as np
from rlhfsim.scenario.schedules import OppoSchedule, PartialSchedule, SyncSchedule
from rlhfsim.sim.generation import GenRequest
from rlhfsim.sim.schedules.base import Schedule


class OverlapLoop(Schedule):
    """The shared loop. Subclasses set the knobs per step."""

    def setup_step(self, step: int) -> None:
        """Hook: adapt knobs (chunk size, delta) before the step."""

    def knobs(self, step: int) -> dict:
        return {"delta": 0, "stream": {}, "stop_first_b": False, "token_budget": None, "keep_kv": True,
                "extra": 0, "train_all_finished": False}

    def after_step(self, step: int, rec) -> None:
        """Hook: observe the finished step."""

    def run(self, steps: int):
        sim = self.sim
        env = sim.env
        B = sim.setup.rollouts_per_step
        g = sim.setup.scenario.algorithm.group_size
        carry = []
        chunks_before = tokens_before = 0  # scorer totals at the end of the previous step
        for step in range(steps):
            self.setup_step(step)
            k = self.knobs(step)
            start = env.now
            ready = [r for r in carry if r.done]
            pending = [r for r in carry if not r.done]
            n_new = max(B + k["delta"] * g + k["extra"] * g - len(carry), 0)
            new = sim.stream.take(n_new, step)
            for role in k["stream"]:
                sim.scorer(role)
            target = B - len(ready) if k["stop_first_b"] else None
            req = GenRequest(step, pending + new, stop_after=target, token_budget=k["token_budget"],
                             stream=k["stream"])
            if target is not None and target <= 0:
                req.rollouts, res_finished, res_unfinished, generated = [], [], pending + new, 0
            else:
                res = yield env.process(sim.generate(req))
                res_finished, res_unfinished, generated = res.finished, res.unfinished, res.generated_tokens
            finished = ready + res_finished
            if k["train_all_finished"]:
                trained, rest = finished, []
            else:
                trained, rest = finished[:B], finished[B:]
            carry = rest + res_unfinished
            for r in res_unfinished:
                if not k["keep_kv"]:
                    r.kv_resident = False
            yield env.process(sim.after_generation(step, trained, tuple(k["stream"])))
            rec = sim.record_step(step, start, trained, generated, deferred=len(carry),
                                  deferred_in=len(pending) + len(ready),
                                  chunk_tokens=min(k["stream"].values()) if k["stream"] else 0,
                                  delta=k["delta"])
            # The scorers count over the whole run; the record holds this step's share.
            chunks = sum(sc.chunks for sc in sim.scorers.values())
            tokens = sum(sc.tokens for sc in sim.scorers.values())
            rec.chunks_scored, rec.scored_tokens = chunks - chunks_before, tokens - tokens_before
            chunks_before, tokens_before = chunks, tokens
            self.after_step(step, rec)


class Sync(OverlapLoop):
    """Synchronous PPO: generate all B, then score, reference, critic, train, sync weights."""

    NAME = "sync"
    Config = SyncSchedule
    EXAMPLES = {"sync": {"kind": "sync"}}


class Oppo(OverlapLoop):
    """OPPO: intra-step chunk streaming to the reward model and inter-step overcommitment (B + delta in
    flight, train on the first B to finish). Either part can be switched off. Chunk size and delta are
    fixed or adaptive (see docs/schedules.md)."""

    NAME = "oppo"
    Config = OppoSchedule
    FLIGHT_FIELD = "schedule.inter.delta"
    WORK_FIELD = "schedule.intra.chunk_tokens"
    EXAMPLES = {
        "oppo": {"kind": "oppo", "intra": {"chunk_tokens": 64}, "inter": {"delta": 4}},
        "oppo-intra": {"kind": "oppo", "intra": {"chunk_tokens": 64}, "inter": {"enabled": False}},
        "oppo-inter": {"kind": "oppo", "intra": {"enabled": False}, "inter": {"delta": 4}},
        "oppo-nokv": {"kind": "oppo", "intra": {"chunk_tokens": 32, "stream_reference_critic": True},
                      "inter": {"delta": 6, "keep_kv": False}},
        "oppo-adaptive": {"kind": "oppo",
                          "intra": {"chunk_tokens": 64, "adaptive": {"window_steps": 4, "candidates": [32, 64]}},
                          "inter": {"delta": 4, "adaptive": {"window_steps": 2, "min": 0, "max": 8, "step": 2}}},
    }

    @classmethod
    def variants(cls, sc) -> dict[str, dict]:
        """``oppo`` (the scenario's own oppo block when it has one, else defaults), ``oppo-intra`` (its
        inter-step part off) and ``oppo-inter`` (its intra-step part off)."""
        cur = sc.schedule.model_dump(mode="json")
        base = json.loads(json.dumps(cur if cur["kind"] == "oppo" else {"kind": "oppo"}))
        base.setdefault("intra", {})
        base.setdefault("inter", {})
        out = {}
        for name, off in (("oppo-intra", "inter"), ("oppo-inter", "intra"), ("oppo", None)):
            sched = json.loads(json.dumps(base))
            if off:
                sched[off]["enabled"] = False
            out[name] = sched
        return out

    @classmethod
    def in_flight(cls, cfg, setup) -> int:
        g = setup.scenario.algorithm.group_size
        delta = max(cfg.inter.delta, cfg.inter.adaptive.max if cfg.inter.adaptive else 0) if cfg.inter.enabled else 0
        return setup.rollouts_per_step + delta * g

    @classmethod
    def work_per_step(cls, cfg, setup) -> float:
        """Every streamed chunk is a scorer call: in flight x chunks per response x streamed roles."""
        if not cfg.intra.enabled:
            return 0.0
        chunk = min([cfg.intra.chunk_tokens] + (cfg.intra.adaptive.candidates if cfg.intra.adaptive else []))
        roles = 1 + (sum(r in setup.shapes for r in ("reference", "critic")) if cfg.intra.stream_reference_critic else 0)
        return cls.in_flight(cfg, setup) * math.ceil(setup.scenario.workload.max_response_tokens / chunk) * roles

    @property
    def max_chunk_batch(self) -> int:
        return self.cfg.intra.max_chunk_batch

    def __init__(self, sim, cfg):
        super().__init__(sim, cfg)
        self.chunk = cfg.intra.chunk_tokens
        self.delta = cfg.inter.delta if cfg.inter.enabled else 0
        self.trials: dict[int, float] = {}
        self.step_times: dict[int, float] = {}

    def setup_step(self, step: int) -> None:
        ad = self.cfg.intra.adaptive
        if self.cfg.intra.enabled and ad is not None:
            pos = step % ad.window_steps
            if pos < len(ad.candidates):
                self.chunk = ad.candidates[pos]  # trial: each candidate on a different step
            elif pos == len(ad.candidates) and self.trials:
                self.chunk = min(self.trials, key=lambda c: (self.trials[c], c))
                self.trials = {}
        di = self.cfg.inter.adaptive
        if self.cfg.inter.enabled and di is not None and step > 0 and step % di.window_steps == 0:
            lo = step - di.window_steps
            xs = np.arange(lo, step, dtype=float)
            rewards = di.curve.r_max * (1.0 - np.exp(-xs / di.curve.tau_steps)) + \
                self.sim.reward_rng.normal(0.0, di.curve.noise_std, xs.size)
            slope = np.polyfit(xs, rewards, 1)[0]
            self.delta = min(self.delta + di.step, di.max) if slope > 0 else max(self.delta - di.step, di.min)

    def knobs(self, step: int) -> dict:
        streamed = {}
        if self.cfg.intra.enabled and self.sim.setup.rule_reward is None:
            streamed["reward"] = self.chunk
        if self.cfg.intra.enabled and self.cfg.intra.stream_reference_critic:
            for role in ("reference", "critic"):
                if role in self.sim.setup.shapes:
                    streamed[role] = self.chunk
        return {"delta": self.delta, "stream": streamed, "stop_first_b": self.cfg.inter.enabled and self.delta > 0,
                "token_budget": None, "keep_kv": self.cfg.inter.keep_kv, "extra": 0, "train_all_finished": False}

    def after_step(self, step: int, rec) -> None:
        ad = self.cfg.intra.adaptive
        if self.cfg.intra.enabled and ad is not None and step % ad.window_steps < len(ad.candidates):
            self.trials[self.chunk] = rec.step_time_s


class Partial(OverlapLoop):
    """Partial rollouts (Kimi k1.5): each rollout decodes at most ``token_budget`` tokens per step;
    unfinished ones wait in a buffer and continue next step after re-prefilling prompt + partial response.
    Each step trains on the rollouts that finished in it."""

    NAME = "partial"
    Config = PartialSchedule
    FLIGHT_FIELD = "schedule.extra_prompts"
    EXAMPLES = {"partial": {"kind": "partial", "token_budget": 128, "extra_prompts": 2}}

    @classmethod
    def variants(cls, sc) -> dict[str, dict]:
        """Defaults to a per-step token budget of max_response_tokens / 4 unless the scenario's schedule
        is already partial."""
        cur = sc.schedule.model_dump(mode="json")
        return {"partial": cur if cur["kind"] == "partial" else
                {"kind": "partial", "token_budget": max(sc.workload.max_response_tokens // 4, 1)}}

    @classmethod
    def in_flight(cls, cfg, setup) -> int:
        return setup.rollouts_per_step + cfg.extra_prompts * setup.scenario.algorithm.group_size

    def knobs(self, step: int) -> dict:
        return {"delta": 0, "stream": {}, "stop_first_b": False, "token_budget": self.cfg.token_budget,
                "keep_kv": False, "extra": self.cfg.extra_prompts, "train_all_finished": True}
