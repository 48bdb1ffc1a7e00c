"""Forward passes and PPO losses over finished rollouts (right-padded prompt + response batches).

Alignment: a rollout is prompt p_1..p_P then response y_1..y_R. Logits at position t predict token t+1,
so response token y_k (absolute position P+k-1, 0-based) is scored by position P+k-2; its logprob, old
logprob (recorded at sampling), reference logprob and value (the critic's output at that position: the
state before y_k is emitted) all live in one [n, T-1] grid with mask ``resp``.

Losses (per response token, masked mean over the minibatch's response tokens):
    ratio   = exp(logp - logp_old)
    L_pg    = -min(ratio A, clip(ratio, 1 - eps, 1 + eps) A)                   eps = CLIP_RATIO
    L_kl    = exp(logp_ref - logp) - (logp_ref - logp) - 1                      (k3 estimator, >= 0)
    L_actor = L_pg + KL_COEF L_kl
    L_critic = 1/2 max((V - R)^2, (V_old + clip(V - V_old, -eps_v, eps_v) - R)^2)   eps_v = CLIP_VALUE
Advantages: PPO with a critic A_k = R - V_old(k) (GAE with gamma = lambda = 1 and the reward at the end);
GRPO A = (R - mean_group R) / (std_group R + 1e-6) for every token; PPO without a critic A = R - mean R.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from calibrate.measuring.models import PAD_ID

CLIP_RATIO = 0.2
CLIP_VALUE = 0.2
KL_COEF = 0.05


@dataclass
class Packed:
    """Right-padded batch: ``ids``/``attn`` [n, T]; ``targets``/``resp`` [n, T-1] (next tokens and the
    mask of response positions)."""

    ids: torch.Tensor
    attn: torch.Tensor
    targets: torch.Tensor
    resp: torch.Tensor
    prompt_lens: list[int]
    response_lens: list[int]

    def scatter(self, rows: list[torch.Tensor]) -> torch.Tensor:
        """Per-rollout response vectors (length R_i each) into the [n, T-1] grid (zeros elsewhere)."""
        out = torch.zeros(self.resp.shape, dtype=torch.float32, device=self.ids.device)
        for i, (p, r) in enumerate(zip(self.prompt_lens, self.response_lens)):
            out[i, p - 1:p - 1 + r] = rows[i]
        return out

    def gather(self, grid: torch.Tensor) -> list[torch.Tensor]:
        """The inverse of ``scatter``: each rollout's response vector."""
        return [grid[i, p - 1:p - 1 + r] for i, (p, r) in enumerate(zip(self.prompt_lens, self.response_lens))]


def pack(seqs, device) -> Packed:
    """``seqs``: objects with ``prompt`` and ``tokens`` (lists of ints), all finished."""
    lens = [len(s.prompt) + len(s.tokens) for s in seqs]
    width = max(lens)
    ids = torch.full((len(seqs), width), PAD_ID, dtype=torch.long)
    attn = torch.zeros((len(seqs), width), dtype=torch.long)
    resp = torch.zeros((len(seqs), width - 1), dtype=torch.bool)
    for i, s in enumerate(seqs):
        row = s.prompt + s.tokens
        ids[i, :len(row)] = torch.tensor(row)
        attn[i, :len(row)] = 1
        resp[i, len(s.prompt) - 1:len(row) - 1] = True
    ids, attn, resp = ids.to(device), attn.to(device), resp.to(device)
    return Packed(ids, attn, ids[:, 1:], resp, [len(s.prompt) for s in seqs], [len(s.tokens) for s in seqs])


def token_logprobs(model, b: Packed) -> torch.Tensor:
    """log pi(token_{t+1} | tokens_<=t) [n, T-1] in float32 (with grad if the model has it)."""
    logits = model(input_ids=b.ids, attention_mask=b.attn).logits[:, :-1].float()
    return logits.log_softmax(-1).gather(-1, b.targets[..., None])[..., 0]


def token_values(critic, b: Packed) -> torch.Tensor:
    """The value head at every position [n, T-1] (float32): the HF sequence-classification model's
    ``score`` applied per token instead of only at the last one."""
    hidden = critic.base_model(input_ids=b.ids, attention_mask=b.attn).last_hidden_state
    return critic.score(hidden)[:, :-1, 0].float()


def reward_scores(reward_model, b: Packed) -> torch.Tensor:
    """One score per rollout [n] from the HF reward model (it pools the last non-pad token)."""
    return reward_model(input_ids=b.ids, attention_mask=b.attn).logits[:, 0].float()


def pack_ids(rows: list[list[int]], device) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ``input_ids`` and ``attention_mask`` [n, longest] of token-id rows (the reward model's
    own ids after re-tokenizing: ``calibrate.measuring.retokenize``)."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), PAD_ID, dtype=torch.long)
    attn = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, :len(r)] = torch.tensor(r)
        attn[i, :len(r)] = 1
    return ids.to(device), attn.to(device)


def score_ids(reward_model, ids: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
    """One score per row [n] of already packed ids (``reward_scores`` without a ``Packed`` batch)."""
    return reward_model(input_ids=ids, attention_mask=attn).logits[:, 0].float()


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (x * mask).sum() / mask.sum().clamp(min=1)


def actor_loss(logp, old, ref, adv, mask) -> torch.Tensor:
    ratio = torch.exp(logp - old)
    pg = -torch.minimum(ratio * adv, ratio.clamp(1 - CLIP_RATIO, 1 + CLIP_RATIO) * adv)
    d = ref - logp
    kl = torch.exp(d) - d - 1
    return masked_mean(pg + KL_COEF * kl, mask)


def critic_loss(v, v_old, ret, mask) -> torch.Tensor:
    v_clip = v_old + (v - v_old).clamp(-CLIP_VALUE, CLIP_VALUE)
    return 0.5 * masked_mean(torch.maximum((v - ret) ** 2, (v_clip - ret) ** 2), mask)


def group_advantages(rewards: torch.Tensor, groups: list[int]) -> torch.Tensor:
    """GRPO: rewards normalised within each group id (a group of one gets advantage 0)."""
    adv = torch.zeros_like(rewards)
    gid = torch.tensor(groups, device=rewards.device)
    for g in set(groups):
        m = gid == g
        r = rewards[m]
        std = r.std(unbiased=False) if r.numel() > 1 else torch.zeros((), device=r.device)
        adv[m] = (r - r.mean()) / (std + 1e-6)
    return adv
