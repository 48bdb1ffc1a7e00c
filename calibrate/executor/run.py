"""``run_steps``: real PPO/GRPO steps on the local device, timed phase by phase.

Step timeline (t = 0 when generation starts; every role time-shares the one device):

    generate      decode until B*g rollouts have finished (generation.py)
    retokenize    (a reward model of another tokenizer, not under intra) the trained rollouts' ids decoded
                  to text and tokenized for the reward model, one call over the batch (calibrate.measuring.retokenize)
    reward        sync: after generate, the HF reward model over the B*g trained rollouts in batches of
                  max_batch (prompt + response, right-padded), or rule_reward_s per rollout on the CPU;
                  intra: chunks scored during generation by the scorer thread (by the reward streaming
                  strategy, re-tokenizing each item when needed), then the queue is drained
    reference     reference log-probs, batches of max_batch                      (skipped without one)
    critic_fwd    critic values per response token, batches of max_batch         (skipped without one)
    actor_train   ppo_epochs x ceil(B*g / minibatch_size) minibatches: forward, PPO loss, backward, AdamW
    critic_train  the same minibatches for the critic's clipped value loss         (skipped without one)
    weight_sync   copy the trained actor into the generation decoder (load_hf_state_dict); with
                  gen_runtime "hf_generate" generation runs on the actor itself: nothing to copy, the
                  interval is still recorded (microseconds), so every run has the same phases

Minibatches are a seeded shuffle of the B*g trained rollouts per epoch, cut into slices of
minibatch_size. Old log-probs are the sampling log-probs recorded during generation (no extra actor
forward). Reward model, reference, critic and actor all run through HF transformers models built by
``calibrate.measuring.models.build_hf_model``; the reference starts from the actor's weights (same seed).

Every forward call of the reward, reference and critic phases (``forward_call``) and every training
minibatch (``train_call``) is also recorded with its shape (``StepLog.piece``: role, phase, rows, padded
width, its index in the phase), so validate prices each at its own shape (``calibrate.validation.compare.phase_operations``).
"""

from __future__ import annotations

import contextlib
import sys

import torch

from calibrate.measuring.decoder import StaticKVDecoder
from calibrate.executor import training as T
from calibrate.executor.config import ExecConfig, StepResult, validate
from calibrate.executor.generation import EXEC_RUNTIMES, Sequence
from calibrate.executor.scorer import Scorer, rule_reward
from calibrate.executor.timing import Clock, StepLog, device_allocs, minor_faults
from calibrate.measuring.models import build_hf_model, torch_dtype
from calibrate.measuring.retokenize import Retokenizer

LR = 1e-5


@contextlib.contextmanager
def _threads(n: int | None):
    before = torch.get_num_threads()
    if n is not None:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def run_steps(cfg: ExecConfig, progress: bool = False) -> list[StepResult]:
    """Run ``cfg.steps`` real steps; one StepResult per step."""
    return run_interleaved([cfg], progress)[0]


def run_interleaved(cfgs: list[ExecConfig], progress: bool = False, names: list[str] | None = None) -> list[list[StepResult]]:
    """Run several configurations' steps round-robin (step 0 of each, then step 1 of each, ...), each on
    its own executor, so that every configuration's steps are spread over the whole run: on a machine
    whose speed drifts from minute to minute, none of them is measured in a slow minute alone. All
    configurations must use the same thread count. One list of StepResults per configuration."""
    with RoundRobin(cfgs, progress, names) as rr:
        rr.run()
        return rr.results


class RoundRobin:
    """``run_interleaved`` in installments: ``run(until)`` runs steps ``done .. until - 1`` of every
    configuration round-robin, so other work (a calibration pass) can be interleaved between blocks of
    steps. Use as a context manager; ``results`` holds one list of StepResults per configuration."""

    def __init__(self, cfgs: list[ExecConfig], progress: bool = False, names: list[str] | None = None):
        for cfg in cfgs:
            validate(cfg)
        threads = {cfg.threads for cfg in cfgs}
        if len(threads) > 1:
            raise ValueError(f"run_interleaved: expected one thread count, got {sorted(threads, key=str)}")
        self.cfgs, self.progress = cfgs, progress
        self.threads = cfgs[0].threads if cfgs else None
        self.names = names or [f"run {i}" for i in range(len(cfgs))]
        self.results: list[list[StepResult]] = [[] for _ in cfgs]
        self.done = 0
        self.steps = max((cfg.steps for cfg in cfgs), default=0)
        self.exs: list[_Executor] = []

    def __enter__(self) -> "RoundRobin":
        try:
            with _threads(self.threads):
                for cfg in self.cfgs:
                    self.exs.append(_Executor(cfg))
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        for ex in self.exs:
            ex.close()
        self.exs = []

    def run(self, until: int | None = None) -> None:
        until = self.steps if until is None else min(until, self.steps)
        with _threads(self.threads):
            for i in range(self.done, until):
                for k, (cfg, ex) in enumerate(zip(self.cfgs, self.exs)):
                    if i >= cfg.steps:
                        continue
                    r = ex.step(i)
                    self.results[k].append(r)
                    if self.progress:
                        ph = " ".join(f"{p}={b - a:.3f}s" for p, (a, b) in r.phases.items())
                        print(f"{self.names[k]} step {i}: {r.step_time_s:.3f}s  {ph}  gen={r.generated_tokens} "
                              f"chunks={r.chunks_scored} carried={r.deferred_in}->{r.deferred_out}", file=sys.stderr)
                self.done = i + 1


class _Executor:
    def __init__(self, cfg: ExecConfig):
        self.cfg = cfg
        self.device = torch.device(cfg.device)
        self.dtype = torch_dtype(cfg.dtype)
        self.clock = Clock(self.device)
        used = cfg.rollouts[:cfg.rollouts_needed]
        p_max = max(int(p) for p, _ in used)
        r_max = max(int(r) for _, r in used)
        # static: a finished row keeps decoding (padding) for up to r_max more positions
        max_len = p_max + (2 * r_max if cfg.engine == "static" else r_max) + 1
        dev, dt, seed = self.device, self.dtype, cfg.seed

        self.actor = build_hf_model(cfg.actor, "lm", dt, dev, seed).train()
        self.actor_opt = torch.optim.AdamW(self.actor.parameters(), lr=LR)
        self.reference = self._frozen(cfg.reference, "lm", seed)
        self.reward_model = self._frozen(cfg.reward, "value", seed + 3)
        self.critic = self.critic_opt = None
        if cfg.critic is not None:
            self.critic = build_hf_model(cfg.critic, "value", dt, dev, seed + 1).train()
            self.critic_opt = torch.optim.AdamW(self.critic.parameters(), lr=LR)

        self.retok = Retokenizer(cfg.actor, cfg.reward) if cfg.retokenize and cfg.reward is not None else None
        self.scorer = None
        if cfg.intra:
            rdec = None
            if self.reward_model is not None and cfg.reward_streaming == "incremental":
                rdec = StaticKVDecoder(cfg.reward, dtype=dt, device=str(dev), max_slots=cfg.pool_rollouts,
                                       max_len=p_max + r_max + 1, head="value", seed=seed + 3)
                rdec.load_hf_state_dict(self.reward_model.state_dict())
            if self.clock.cuda:
                torch.cuda.synchronize(dev)   # weights in place before the scorer stream reads them
            self.scorer = Scorer(rdec, cfg.chunk_tokens, cfg.rule_reward_s, self.clock, cfg.reward_streaming,
                                 self.reward_model if rdec is None else None, self.retok)
        self.gen = EXEC_RUNTIMES[cfg.gen_runtime](cfg, self.actor, self.clock, seed, max_len,
                                                  self.scorer.offer if self.scorer is not None else None)
        self.shuffle = torch.Generator().manual_seed(seed + 7)
        self.next_rid = 0
        self.carried: list[Sequence] = []
        self._prompt: tuple[int, list[int]] = (-1, [])   # (group, prompt tokens) of the latest group

    def _frozen(self, shape, head, seed):
        if shape is None:
            return None
        m = build_hf_model(shape, head, self.dtype, self.device, seed)
        m.requires_grad_(False)
        return m

    def close(self) -> None:
        if self.scorer is not None:
            self.scorer.close()

    # ---------------------------------------------------------------------------------- rollouts
    def _new_sequence(self) -> Sequence:
        """The next rollout in arrival order. GRPO groups (g consecutive rollouts) share one prompt; a
        member with a shorter prompt_len uses its prefix."""
        cfg, rid = self.cfg, self.next_rid
        self.next_rid += 1
        p_len, r_len = (int(x) for x in cfg.rollouts[rid])
        group = rid // cfg.group_size
        if self._prompt[0] != group:
            members = cfg.rollouts[group * cfg.group_size:(group + 1) * cfg.group_size]
            width = max(int(p) for p, _ in members)
            g = torch.Generator().manual_seed(cfg.seed * 1_000_003 + group)
            self._prompt = (group, torch.randint(1, cfg.actor.vocab, (width,), generator=g).tolist())
        return Sequence(rid=rid, group=group, prompt=self._prompt[1][:p_len], response_len=r_len)

    # -------------------------------------------------------------------------------------- step
    def step(self, index: int) -> StepResult:
        cfg = self.cfg
        pool = list(self.carried)
        deferred_in = len(pool)
        while len(pool) < cfg.pool_rollouts:
            pool.append(self._new_sequence())
        target = cfg.batch_rollouts

        t0 = self.clock.now()
        log = StepLog(t0)
        if self.scorer is not None:
            self.scorer.log = log
        a0 = device_allocs(self.device)
        finished = self.gen.generate(pool, target, log)
        trained = finished[:target]
        taken = {id(s) for s in trained}
        self.carried = [s for s in pool if id(s) not in taken]
        self.gen.end_step(self.carried, cfg.keep_kv)

        # The batch in prompt order, as frameworks gather it (and as the simulator does): which
        # micro-batch a rollout lands in must not depend on the order rollouts happened to finish in.
        batch = sorted(trained, key=lambda s: s.rid)
        log.alloc("generate", a0, a0 := device_allocs(self.device))
        rewards = self._reward(batch, log)
        log.alloc("reward", a0, a0 := device_allocs(self.device))
        ref_lp = self._inference(self.reference, batch, log, "reference", "reference", T.token_logprobs)
        log.alloc("reference", a0, a0 := device_allocs(self.device))
        values = self._inference(self.critic, batch, log, "critic", "critic_fwd", T.token_values)
        log.alloc("critic_fwd", a0, device_allocs(self.device))
        self._train(batch, rewards, ref_lp, values, log)
        start, a0 = self.clock.now(), device_allocs(self.device)
        self.gen.sync_weights(self.actor)
        log.add("actor", "weight_sync", start, self.clock.now())
        log.alloc("weight_sync", a0, device_allocs(self.device))

        phases = log.phases()
        c = log.counts
        return StepResult(
            step=index, step_time_s=max(b for _, b in phases.values()), phases=phases,
            intervals=sorted(log.intervals, key=lambda x: x[2]), rollout_ids=[s.rid for s in trained],
            generated_tokens=c["generated_tokens"], scored_tokens=c["scored_tokens"],
            chunks_scored=c["chunks_scored"], deferred_out=len(self.carried), deferred_in=deferred_in,
            decoded_tokens=c["decoded_tokens"], decode_steps=c["decode_steps"], prefill_calls=c["prefill_calls"],
            prefill_tokens=c["prefill_tokens"], scored_prompt_tokens=c["scored_prompt_tokens"],
            score_calls=c["score_calls"], deferred_tokens=sum(len(s.tokens) for s in self.carried), deferred_ids=[s.rid for s in self.carried],
            rewards=[float(x) for x in rewards.tolist()], ops=list(log.ops), faults=list(log.faults),
            allocs={ph: dict(c) for ph, c in log.allocs.items()})

    # ----------------------------------------------------------------------------------- phases
    def _batches(self, seqs: list[Sequence], size: int):
        for i in range(0, len(seqs), size):
            yield seqs[i:i + size]

    def _reward(self, trained: list[Sequence], log: StepLog) -> torch.Tensor:
        cfg = self.cfg
        if self.scorer is not None:
            self.scorer.drain()
        elif self.reward_model is None:
            for s in trained:
                start = self.clock.now()
                s.reward = rule_reward(s.prompt, s.tokens, cfg.rule_reward_s)
                log.add("reward", "reward", start, self.clock.now(), score_calls=1)
        elif self.retok is not None:
            # Another tokenizer: the batch's ids decoded to text and tokenized for the reward model in one
            # call before scoring (TRL's reward_processing_classes), timed as its own phase.
            start = self.clock.now()
            rows = self.retok([s.prompt + s.tokens for s in trained])
            log.add("reward", "retokenize", start, self.clock.now())
            with torch.no_grad():
                for i in range(0, len(trained), cfg.max_batch):
                    chunk = trained[i:i + cfg.max_batch]
                    start = self.clock.now()
                    ids, attn = T.pack_ids(rows[i:i + cfg.max_batch], self.device)
                    scores = T.score_ids(self.reward_model, ids, attn).tolist()
                    log.piece("forward_call", "reward", "reward", start, self.clock.now(), ids, i // cfg.max_batch,
                              score_calls=1, scored_tokens=sum(len(s.tokens) for s in chunk),
                              scored_prompt_tokens=sum(len(s.prompt) for s in chunk))
                    for s, r in zip(chunk, scores):
                        s.reward = r
        else:
            with torch.no_grad():
                for k, chunk in enumerate(self._batches(trained, cfg.max_batch)):
                    start = self.clock.now()
                    b = T.pack(chunk, self.device)
                    scores = T.reward_scores(self.reward_model, b).tolist()
                    log.piece("forward_call", "reward", "reward", start, self.clock.now(), b.ids, k, score_calls=1,
                              scored_tokens=sum(b.response_lens), scored_prompt_tokens=sum(b.prompt_lens))
                    for s, r in zip(chunk, scores):
                        s.reward = r
        missing = [s.rid for s in trained if s.reward is None]
        if missing:
            raise RuntimeError(f"rollouts {missing} were trained without a reward")
        return torch.tensor([s.reward for s in trained], dtype=torch.float32, device=self.device)

    def _inference(self, model, trained, log, role, phase, fn) -> list[torch.Tensor] | None:
        """Per-rollout response vectors (reference logprobs or values) in batches of max_batch."""
        if model is None:
            return None
        out: list[torch.Tensor] = []
        with torch.no_grad():
            for k, chunk in enumerate(self._batches(trained, self.cfg.max_batch)):
                start, f0 = self.clock.now(), minor_faults()
                b = T.pack(chunk, self.device)
                out.extend(b.gather(fn(model, b)))
                log.piece("forward_call", role, phase, start, self.clock.now(), b.ids, k)
                log.fault(phase, f0, *b.ids.shape)
        return out

    def _advantages(self, trained, rewards, values) -> list[torch.Tensor]:
        """Per-rollout advantage vectors (length R_i); see training.py."""
        cfg = self.cfg
        if values is not None:
            return [rewards[i] - values[i] for i in range(len(trained))]
        if cfg.algorithm == "grpo":
            adv = T.group_advantages(rewards, [s.group for s in trained])
        else:
            adv = rewards - rewards.mean()
        return [adv[i].expand(len(s.tokens)) for i, s in enumerate(trained)]

    def _train(self, trained, rewards, ref_lp, values, log: StepLog) -> None:
        cfg = self.cfg
        n = len(trained)
        old_lp = [torch.tensor(s.logprobs, dtype=torch.float32, device=self.device) for s in trained]
        ref_lp = ref_lp if ref_lp is not None else old_lp
        adv = self._advantages(trained, rewards, values)
        plan = []
        for _ in range(cfg.ppo_epochs):
            perm = torch.randperm(n, generator=self.shuffle).tolist()
            plan.extend(perm[i:i + cfg.minibatch_size] for i in range(0, n, cfg.minibatch_size))

        a0 = device_allocs(self.device)
        for k, idx in enumerate(plan):
            start, f0 = self.clock.now(), minor_faults()
            b = T.pack([trained[i] for i in idx], self.device)
            logp = T.token_logprobs(self.actor, b)
            loss = T.actor_loss(logp, b.scatter([old_lp[i] for i in idx]), b.scatter([ref_lp[i] for i in idx]),
                                b.scatter([adv[i] for i in idx]), b.resp)
            self.actor_opt.zero_grad(set_to_none=True)
            loss.backward()
            self.actor_opt.step()
            log.piece("train_call", "actor", "actor_train", start, self.clock.now(), b.ids, k)
            log.fault("actor_train", f0, *b.ids.shape)
        log.alloc("actor_train", a0, a0 := device_allocs(self.device))
        if self.critic is None:
            return
        for k, idx in enumerate(plan):
            start, f0 = self.clock.now(), minor_faults()
            b = T.pack([trained[i] for i in idx], self.device)
            v = T.token_values(self.critic, b)
            ret = b.scatter([rewards[i].expand(len(trained[i].tokens)) for i in idx])
            loss = T.critic_loss(v, b.scatter([values[i] for i in idx]), ret, b.resp)
            self.critic_opt.zero_grad(set_to_none=True)
            loss.backward()
            self.critic_opt.step()
            log.piece("train_call", "critic", "critic_train", start, self.clock.now(), b.ids, k)
            log.fault("critic_train", f0, *b.ids.shape)
        log.alloc("critic_train", a0, device_allocs(self.device))

