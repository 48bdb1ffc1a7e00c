"""A Qwen2/Llama decoder with a preallocated, per-slot KV cache: generation (prefill + decode) and
incremental, chunked scoring, batched over slots that each sit at their own position.

Architecture (the Hugging Face Qwen2/Llama forward, re-expressed for a static cache):

    h_0    = E[x]                                             token embedding, E: [V, H]
    a      = h + Attn(RMSNorm(h)),   h' = a + W_d(silu(W_g RMSNorm(a)) * W_u RMSNorm(a))
    RMSNorm(x) = w * x / sqrt(mean(x^2) + eps)                (computed in float32, like HF)
    RoPE:  theta_i = p * base^(-2i/d),  q' = q cos(theta) + rotate_half(q) sin(theta)
           with p the token's absolute position *in its own slot*
    Attn:  softmax(q' K'^T / sqrt(d) + M) V with grouped-query heads (heads / kv_heads queries share
           one K/V head) and M the boolean mask  key j visible to query at position p  <=>  j <= p
    out    = RMSNorm(h_L)[last] @ E^T (tied) or @ W_lm^T   (head "lm": next-token logits [n, V])
           = RMSNorm(h_L)[last] @ w_score                  (head "value": one scalar per row [n])

KV cache: per layer one K and one V tensor of shape [max_slots, kv_heads, max_len, head_dim]. A call
``extend(slots, ids[n, c])`` writes the c new keys/values of row r at positions
``positions[slots[r]] .. + c - 1`` of slot ``slots[r]`` (index_put), then attends over keys
``0 .. max(positions[slots] + c) - 1`` of those slots with the mask above, so rows at different
positions (continuous batching, chunk scoring of sequences with unequal prefixes) run in one batched
call. Positions are host-side bookkeeping (a CPU tensor), so no device sync is needed to read them.

Units: positions and lengths in tokens. No global state; random weights come from a seeded generator.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from rlhfsim.errors import RlhfsimError
from rlhfsim.models.catalog import ModelShape

# Defaults of transformers' Qwen2Config / LlamaConfig (ModelShape does not carry them).
ROPE_THETA = 10000.0
RMS_NORM_EPS = 1e-6
INIT_STD = 0.02


class _RMSNorm(nn.Module):
    def __init__(self, hidden: int, eps: float, dtype, device):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden, dtype=dtype, device=device))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


class _Attention(nn.Module):
    def __init__(self, shape: ModelShape, bias: bool, dtype, device):
        super().__init__()
        h, kv = shape.hidden, shape.kv_dim
        kw = dict(dtype=dtype, device=device)
        self.q_proj = nn.Linear(h, h, bias=bias, **kw)
        self.k_proj = nn.Linear(h, kv, bias=bias, **kw)
        self.v_proj = nn.Linear(h, kv, bias=bias, **kw)
        self.o_proj = nn.Linear(h, h, bias=False, **kw)


class _Mlp(nn.Module):
    def __init__(self, shape: ModelShape, dtype, device):
        super().__init__()
        kw = dict(bias=False, dtype=dtype, device=device)
        self.gate_proj = nn.Linear(shape.hidden, shape.intermediate, **kw)
        self.up_proj = nn.Linear(shape.hidden, shape.intermediate, **kw)
        self.down_proj = nn.Linear(shape.intermediate, shape.hidden, **kw)


class _Layer(nn.Module):
    def __init__(self, shape: ModelShape, bias: bool, eps: float, dtype, device):
        super().__init__()
        self.input_layernorm = _RMSNorm(shape.hidden, eps, dtype, device)
        self.self_attn = _Attention(shape, bias, dtype, device)
        self.post_attention_layernorm = _RMSNorm(shape.hidden, eps, dtype, device)
        self.mlp = _Mlp(shape, dtype, device)


class _Body(nn.Module):
    def __init__(self, shape: ModelShape, bias: bool, eps: float, dtype, device):
        super().__init__()
        self.embed_tokens = nn.Embedding(shape.vocab, shape.hidden, dtype=dtype, device=device)
        self.layers = nn.ModuleList(_Layer(shape, bias, eps, dtype, device) for _ in range(shape.layers))
        self.norm = _RMSNorm(shape.hidden, eps, dtype, device)


def sample_next(logits: torch.Tensor, generator: torch.Generator | None = None,
                pad_id: int = 0) -> tuple[list[int], list[float]]:
    """What a generation engine does with a step's next-token logits [n, V]: sample at temperature 1
    (``pad_id`` never sampled) and hand the tokens and their log-probs to the host (the scheduler needs
    them; ``.tolist()`` waits for the device). The executor's decode loop and the calibration's
    ``prefill``/``decode`` points both call this, so a calibrated step is the step the engine runs."""
    logp = logits.float()
    logp[:, pad_id] = float("-inf")
    logp = logp.log_softmax(-1)
    tok = torch.multinomial(logp.exp(), 1, generator=generator)
    lp = logp.gather(-1, tok)
    return tok[:, 0].tolist(), lp[:, 0].tolist()


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class StaticKVDecoder(nn.Module):
    """A decoder-only transformer (Qwen2/Llama) with a static per-slot KV cache. ``head="lm"``: extend
    returns next-token logits of each row's last token; ``head="value"``: one scalar score per row
    (reward/value head, like HF ``*ForSequenceClassification`` with ``num_labels=1``). Inference only."""

    def __init__(self, shape: ModelShape, *, dtype: torch.dtype, device: str, max_slots: int,
                 max_len: int, head: str = "lm", seed: int = 0, rope_theta: float = ROPE_THETA,
                 rms_norm_eps: float = RMS_NORM_EPS):
        super().__init__()
        if shape.arch != "decoder":
            raise RlhfsimError(f"StaticKVDecoder: expected a decoder shape, got {shape.name!r} with arch {shape.arch!r}")
        if head not in ("lm", "value"):
            raise RlhfsimError(f"StaticKVDecoder: head: expected 'lm' or 'value', got {head!r}")
        if max_slots < 1 or max_len < 1:
            raise RlhfsimError(f"StaticKVDecoder: expected max_slots >= 1 and max_len >= 1, got {max_slots} and {max_len}")
        if shape.hidden % shape.heads or shape.heads % shape.kv_heads:
            raise RlhfsimError(f"StaticKVDecoder: {shape.name}: heads must divide hidden and kv_heads must divide heads")
        self.shape, self.head, self.dtype, self.device = shape, head, dtype, torch.device(device)
        self.max_slots, self.max_len = max_slots, max_len
        bias = shape.hf_model_type == "qwen2"   # Qwen2 has q/k/v biases, Llama has none
        self.model = _Body(shape, bias, rms_norm_eps, dtype, self.device)
        self.lm_head = None
        self.score = None
        if head == "lm" and not shape.tied_embeddings:
            self.lm_head = nn.Linear(shape.hidden, shape.vocab, bias=False, dtype=dtype, device=self.device)
        if head == "value":
            self.score = nn.Linear(shape.hidden, 1, bias=False, dtype=dtype, device=self.device)
        self._init_weights(seed)
        self.requires_grad_(False)
        hd = shape.head_dim
        inv = 1.0 / (rope_theta ** (torch.arange(0, hd, 2, dtype=torch.int64).float() / hd))
        self.register_buffer("inv_freq", inv.to(self.device), persistent=False)
        cache = (max_slots, shape.kv_heads, max_len, hd)
        self.k_cache = [torch.zeros(cache, dtype=dtype, device=self.device) for _ in range(shape.layers)]
        self.v_cache = [torch.zeros(cache, dtype=dtype, device=self.device) for _ in range(shape.layers)]
        self.positions = torch.zeros(max_slots, dtype=torch.long)   # host-side: tokens cached per slot

    def _init_weights(self, seed: int) -> None:
        """N(0, INIT_STD) weights from a generator seeded with ``seed`` on the decoder's device (a 7B's
        weights drawn on the host took 45-56 s on a lent H200's host; on the device, well under one),
        so the same seed gives the same weights on one kind of device, not across kinds."""
        dev = torch.device(self.device)
        gen = torch.Generator(device=dev).manual_seed(seed)
        with torch.no_grad():
            for name, p in self.named_parameters():
                if name.endswith("layernorm.weight") or name.endswith("norm.weight"):
                    p.fill_(1.0)
                elif name.endswith(".bias"):
                    p.zero_()
                else:
                    p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float32, device=dev).mul_(INIT_STD))

    # ----------------------------------------------------------------------------------------- cache
    def reset(self, slots: torch.LongTensor) -> None:
        """Empty these slots (their stale K/V stay in memory but are masked out by position)."""
        self.positions[torch.as_tensor(slots, dtype=torch.long).cpu()] = 0

    # --------------------------------------------------------------------------------------- forward
    @torch.no_grad()
    def extend(self, slots: torch.LongTensor, input_ids: torch.LongTensor,
               lengths: torch.LongTensor | None = None) -> torch.Tensor:
        """Append ``input_ids`` [n, c] to ``slots`` [n] (distinct) at each slot's own position; returns
        the last token's logits [n, V] (head lm) or score [n] (head value).

        ``lengths`` [n] (optional, 1 <= lengths <= c): rows are right-padded; row r holds
        ``lengths[r]`` real tokens, its slot advances by that much and its output is taken at its last
        real token (a padded batch prefill of unequal prompts in one call). The padding's K/V land past
        the slot's position, where the mask hides them until later tokens overwrite them."""
        slots_h = torch.as_tensor(slots, dtype=torch.long).cpu()
        if input_ids.dim() != 2 or input_ids.shape[0] != slots_h.numel():
            raise RlhfsimError(f"StaticKVDecoder.extend: expected input_ids [n, c] with n = len(slots) = {slots_h.numel()}, got {tuple(input_ids.shape)}")
        n, c = input_ids.shape
        start = self.positions[slots_h]
        end = start + c
        if lengths is not None:
            lengths = torch.as_tensor(lengths, dtype=torch.long).cpu()
            if lengths.shape != (n,) or int(lengths.min()) < 1 or int(lengths.max()) > c:
                raise RlhfsimError(f"StaticKVDecoder.extend: lengths: expected {n} values in [1, {c}], got {lengths.tolist()}")
        kv_len = int(end.max())
        if kv_len > self.max_len:
            raise RlhfsimError(f"StaticKVDecoder.extend: slot overflow: expected at most max_len={self.max_len} tokens per slot, got {kv_len}")
        contiguous = n > 0 and bool(torch.equal(slots_h, torch.arange(int(slots_h[0]), int(slots_h[0]) + n)))
        dev = self.device
        slots_d = slots_h.to(dev, non_blocking=True)
        pos = (start[:, None] + torch.arange(c)[None, :]).to(dev, non_blocking=True)      # [n, c]
        ids = input_ids.to(dev)

        freqs = pos[..., None].float() * self.inv_freq                                     # [n, c, hd/2]
        emb = torch.cat((freqs, freqs), dim=-1)
        cos = emb.cos().to(self.dtype)[:, None]                                            # [n, 1, c, hd]
        sin = emb.sin().to(self.dtype)[:, None]
        mask = (torch.arange(kv_len, device=dev)[None, None, :] <= pos[:, :, None])[:, None]  # [n,1,c,L]

        s, hd = self.shape, self.shape.head_dim
        rep = s.heads // s.kv_heads
        h = self.model.embed_tokens(ids)
        for li, layer in enumerate(self.model.layers):
            x = layer.input_layernorm(h)
            at = layer.self_attn
            q = at.q_proj(x).view(n, c, s.heads, hd).transpose(1, 2)
            k = at.k_proj(x).view(n, c, s.kv_heads, hd).transpose(1, 2)
            v = at.v_proj(x).view(n, c, s.kv_heads, hd).transpose(1, 2)
            q = q * cos + _rotate_half(q) * sin
            k = k * cos + _rotate_half(k) * sin
            kc, vc = self.k_cache[li], self.v_cache[li]
            kc[slots_d[:, None], :, pos] = k.transpose(1, 2)      # [n, c, kv_heads, hd] scattered
            vc[slots_d[:, None], :, pos] = v.transpose(1, 2)
            if contiguous:
                s0 = int(slots_h[0])
                keys, vals = kc[s0:s0 + n, :, :kv_len], vc[s0:s0 + n, :, :kv_len]
            else:
                keys, vals = kc[slots_d, :, :kv_len], vc[slots_d, :, :kv_len]
            # Grouped-query attention: each K/V head serves `rep` query heads. SDPA's enable_gqa reads the
            # cache as it is (as paged-attention kernels do) instead of copying K/V `rep` times per layer
            # per step the way HF's repeat_kv does; the copy cost 0.4 ms per layer at 80 tokens of context
            # and 9 ms at 512 (16 rows, one CPU thread), more than the attention itself.
            o = F.scaled_dot_product_attention(q, keys, vals, attn_mask=mask, enable_gqa=rep > 1)
            h = h + at.o_proj(o.transpose(1, 2).reshape(n, c, s.hidden))
            x = layer.post_attention_layernorm(h)
            m = layer.mlp
            h = h + m.down_proj(F.silu(m.gate_proj(x)) * m.up_proj(x))
        if lengths is None:
            self.positions[slots_h] = end
            last = self.model.norm(h[:, -1])
        else:
            self.positions[slots_h] = start + lengths
            last = self.model.norm(h[torch.arange(n, device=dev), (lengths - 1).to(dev)])
        if self.head == "value":
            return self.score(last)[:, 0]
        weight = self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        return F.linear(last, weight)

    # ------------------------------------------------------------------------------------- weights
    @torch.no_grad()
    def load_hf_state_dict(self, sd: dict) -> None:
        """Copy weights from an HF Qwen2/Llama state dict (``*ForCausalLM``, ``*ForSequenceClassification``
        or the bare ``*Model``; keys with or without the ``model.`` prefix). Tied LM heads reuse the
        embedding; a missing or mis-shaped weight raises naming the key."""
        src = {}
        for k, v in sd.items():
            src[k if k.startswith(("model.", "lm_head.", "score.")) else "model." + k] = v
        for name, p in self.named_parameters():
            if name not in src:
                raise RlhfsimError(f"load_hf_state_dict: expected weight {name!r} in the state dict, not found")
            t = src[name]
            if tuple(t.shape) != tuple(p.shape):
                raise RlhfsimError(f"load_hf_state_dict: {name}: expected shape {tuple(p.shape)}, got {tuple(t.shape)}")
            p.copy_(t.detach(), non_blocking=True)
