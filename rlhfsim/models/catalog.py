"""Transformer shapes with the numbers that decide cost: layers, hidden, intermediate, heads, KV heads,
vocabulary, tied embeddings, and for a mixture-of-experts model its experts (routed, top-k, shared, their width,
which layers have them) and its attention kind (grouped-query, or DeepSeek's multi-head latent attention, whose
cache is one compressed vector per token and layer). Shapes are copied from the models' published ``config.json``
files.

Total against active parameters: ``params()`` counts every expert (the weights a GPU holds, syncs and optimizes);
``active_body_params`` counts what one token meets (the top-k routed experts, the shared ones, the router, the
attention and the dense layers), from which ``rlhfsim.costs.flops`` counts FLOPs. A dense model's two are equal.

Pure Python (no pydantic, no torch): ``calibrate/`` imports it to build random-weight models of the same
shapes and to compute the FLOP/byte counts its fits are expressed in.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from rlhfsim.errors import ScenarioError

# Bytes per stored weight of each dtype.
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "float8": 1}
# Bytes per element of what a pass computes and moves besides its weights (activations, KV cache, TP and sequence
# collectives, gradients). FP8 recipes (vLLM's fp8 W8A8 with kv_cache_dtype auto, Transformer Engine's FP8 training)
# quantize a GEMM's inputs inside the kernel and keep these in bfloat16: 2 bytes for float8.
ACTIVATION_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "float8": 2}

# An assumption, not a measurement: the busiest routed expert's tokens over the mean, in every MoE layer and call
# (``ModelShape.expert_imbalance``; a scenario sets its own per model: ``models.ROLE.expert_imbalance``). No public
# measurement of it for the catalog's models under an RL workload was found. For scale: a router that spread tokens
# perfectly at random would still give about 1 + sqrt(2 ln E / (N k / E)) by the normal approximation of the largest
# of E counts, 1.10 for N = 16,384 tokens choosing k = 8 of E = 128 (a training micro-batch) and far more for a decode
# step's few tokens; trained routers are not perfectly random. docs/cost-model.md, "Mixture-of-experts models".
ASSUMED_EXPERT_IMBALANCE = 1.2


@dataclass(frozen=True)
class ModelShape:
    """The architecture of one transformer. ``arch`` is ``decoder`` (causal LM, Qwen2/Llama) or
    ``encoder`` (bidirectional: DeBERTa-v3 or ELECTRA, by ``hf_model_type``). ``gated_mlp`` is True for SwiGLU MLPs (3 matrices)."""

    name: str
    arch: str
    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    vocab: int
    tied_embeddings: bool
    gated_mlp: bool = True
    hf_model_type: str = "qwen2"
    max_positions: int = 32768
    tokenizer: str = ""  # the tokenizer's name; "" derives one from the family and vocabulary (``tokenizer_id``)
    # config.json's head_dim where it is not hidden / heads (Qwen3's MoE models: 32 heads of 128 on a hidden of
    # 2048); 0: hidden // heads, and the query and output projections hidden x hidden, as every dense model here
    attn_head_dim: int = 0
    # Mixture of experts (num_experts 0: a dense model). ``moe_layers`` of the ``layers`` have, in place of the dense
    # MLP of width ``intermediate``, a router (hidden x num_experts), ``num_experts`` routed experts of width
    # ``moe_intermediate`` of which each token takes ``experts_per_token``, and ``shared_experts`` always-on experts
    # of total width ``shared_intermediate``. ``expert_imbalance``: the busiest expert's tokens over the mean, the
    # factor the routed experts' FLOPs are priced at (``rlhfsim.costs.moe``; a scenario sets it per model).
    num_experts: int = 0
    experts_per_token: int = 0
    moe_intermediate: int = 0
    moe_layers: int = 0
    shared_experts: int = 0
    shared_intermediate: int = 0
    expert_imbalance: float = 1.0
    # False only in the shape the router term is priced against (``rlhfsim.costs.moe.without_router``)
    router_priced: bool = True
    # Attention kind: ``gqa`` (grouped-query, multi-head and multi-query included) or ``mla`` (multi-head latent
    # attention, DeepSeek-V2/V3: queries through a rank-``q_lora_rank`` bottleneck (0: none), keys and values
    # decompressed from a cached rank-``kv_lora_rank`` latent plus a shared ``qk_rope_head_dim`` rotary key).
    attention: str = "gqa"
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0

    @property
    def tokenizer_id(self) -> str:
        """Which tokenizer the model reads: ``tokenizer`` when the catalog names it (Qwen2.5 models of
        different embedding sizes share one), else ``<hf_model_type>-<vocab>``. Two models with different
        ids need the actor's tokens decoded to text and tokenized again (``rlhfsim.scenario.checks``)."""
        return self.tokenizer or f"{self.hf_model_type}-{self.vocab}"

    @property
    def head_dim(self) -> int:
        return self.attn_head_dim or self.hidden // self.heads

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def attn_params(self) -> int:
        """One layer's attention weights (norms and biases left out, as everywhere here)."""
        h = self.hidden
        if self.attention == "mla":
            qk = self.qk_nope_head_dim + self.qk_rope_head_dim
            q = h * self.q_lora_rank + self.q_lora_rank * self.heads * qk if self.q_lora_rank else h * self.heads * qk
            kv = (h * (self.kv_lora_rank + self.qk_rope_head_dim)
                  + self.kv_lora_rank * self.heads * (self.qk_nope_head_dim + self.v_head_dim))
            return q + kv + self.heads * self.v_head_dim * h
        q = self.heads * self.attn_head_dim if self.attn_head_dim else h
        return 2 * h * q + 2 * h * self.kv_dim

    @property
    def attn_flops_per_pair(self) -> int:
        """Attention FLOPs per (query, visible key) pair and layer: QK^T and AV, 2 FLOP per multiply-add. Multi-head
        latent attention is counted with its keys and values decompressed (heads x (qk_nope + qk_rope + v)), as a
        prefill runs it; a decode step that absorbs the decompression into the query does more FLOPs per pair, which
        the memory-bound step does not feel."""
        if self.attention == "mla":
            return 2 * self.heads * (self.qk_nope_head_dim + self.qk_rope_head_dim + self.v_head_dim)
        return 4 * (self.heads * self.attn_head_dim if self.attn_head_dim else self.hidden)

    @property
    def mlp_params(self) -> int:
        """One dense MLP's weights (width ``intermediate``)."""
        return (3 if self.gated_mlp else 2) * self.hidden * self.intermediate

    @property
    def expert_params(self) -> int:
        """One routed expert's weights in one MoE layer (a SwiGLU MLP of width ``moe_intermediate``)."""
        return 3 * self.hidden * self.moe_intermediate

    @property
    def routed_params(self) -> int:
        """Every routed expert's weights over the MoE layers (0 for a dense model): what expert parallelism shards."""
        return self.moe_layers * self.num_experts * self.expert_params

    @property
    def router_params(self) -> int:
        """The routers' weights over all MoE layers (hidden x num_experts each)."""
        return self.moe_layers * self.hidden * self.num_experts if self.router_priced else 0

    def _body(self, experts: int) -> int:
        if not self.is_moe:
            return self.layers * self.layer_params
        dense = (self.layers - self.moe_layers) * self.mlp_params
        moe = self.moe_layers * (experts * self.expert_params + 3 * self.hidden * self.shared_intermediate)
        return self.layers * self.attn_params + dense + moe + self.router_params

    @property
    def body_params(self) -> int:
        """Every layer's weights, every expert counted (total)."""
        return self._body(self.num_experts)

    @property
    def active_body_params(self) -> int:
        """The layers' weights one token meets: attention, dense MLPs, its top-k routed experts, the shared experts
        and the routers (active). A dense model: ``body_params``."""
        return self._body(self.experts_per_token)

    @property
    def layer_params(self) -> int:
        """One layer's weights; of an MoE model, the mean over layers of those one token meets (the size of the
        GEMMs a token passes through, which the kernel curves by shape read: ``rlhfsim.costs.byshape``)."""
        if self.is_moe:
            return self.active_body_params // self.layers
        return self.attn_params + self.mlp_params

    @property
    def embedding_params(self) -> int:
        return self.vocab * self.hidden

    def params(self, head: str = "lm") -> int:
        """Parameter count (total: every expert) with a language-model head (``lm``) or a scalar value/score head
        (``value``)."""
        body = self.body_params + self.embedding_params
        if head == "lm":
            return body + (0 if self.tied_embeddings else self.embedding_params)
        return body + self.hidden

    def active_params(self, head: str = "lm") -> int:
        """``params`` with only the experts one token meets (``active_body_params``)."""
        return self.params(head) - self.body_params + self.active_body_params

    @property
    def kv_width(self) -> int:
        """Elements one token caches per layer: K and V of the KV heads (2 x kv_heads x head_dim), or under multi-head
        latent attention the compressed latent and the shared rotary key (kv_lora_rank + qk_rope_head_dim)."""
        if self.attention == "mla":
            return self.kv_lora_rank + self.qk_rope_head_dim
        return 2 * self.kv_dim

    def kv_bytes_per_token(self, dtype: str) -> int:
        """Bytes of KV cache one token occupies across all layers."""
        return self.layers * self.kv_width * ACTIVATION_BYTES[dtype]

    def to_dict(self) -> dict:
        return asdict(self)


def _q(name, layers, hidden, inter, heads, kv, vocab, tied, maxpos=32768, tokenizer="qwen2.5"):
    return ModelShape(name, "decoder", layers, hidden, inter, heads, kv, vocab, tied, True, "qwen2", maxpos, tokenizer)


def _l(name, layers, hidden, inter, heads, kv):
    return ModelShape(name, "decoder", layers, hidden, inter, heads, kv, 128256, False, True, "llama", 131072, "llama-3")


CATALOG: dict[str, ModelShape] = {
    m.name: m
    for m in [
        _q("qwen2.5-0.5b", 24, 896, 4864, 14, 2, 151936, True),
        _q("qwen2.5-1.5b", 28, 1536, 8960, 12, 2, 151936, True),
        _q("qwen2.5-3b", 36, 2048, 11008, 16, 2, 151936, True),
        _q("qwen2.5-7b", 28, 3584, 18944, 28, 4, 152064, False),
        _q("qwen2.5-14b", 48, 5120, 13824, 40, 8, 152064, False),
        _q("qwen2.5-32b", 64, 5120, 27648, 40, 8, 152064, False),
        _q("qwen2.5-72b", 80, 8192, 29568, 64, 8, 152064, False),
        # Qwen/Qwen3-8B config.json: 36 layers, hidden 4096, intermediate 12288, 32 heads (head_dim 128), 8 KV heads,
        # vocab 151936, untied embeddings, 40960 positions (its q/k RMSNorms cost nothing here).
        ModelShape("qwen3-8b", "decoder", 36, 4096, 12288, 32, 8, 151936, False, True, "qwen3", 40960, "qwen3"),
        # Qwen/Qwen3-32B config.json (as slime's scripts/models/qwen3-32B.sh restates it for Megatron): 64 layers,
        # hidden 5120, intermediate 25600, 64 heads of head_dim 128 (wider than hidden / heads), 8 KV heads, vocab
        # 151936, untied, 40960 positions. 32.8B parameters.
        ModelShape("qwen3-32b", "decoder", 64, 5120, 25600, 64, 8, 151936, False, True, "qwen3", 40960, "qwen3",
                   attn_head_dim=128),
        # deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B config.json: Qwen2.5-Math-1.5B's shape with an untied LM head
        # (1.78B parameters), 131072 positions.
        _q("deepseek-r1-distill-qwen-1.5b", 28, 1536, 8960, 12, 2, 151936, False, 131072),
        # Qwen/Qwen3-30B-A3B config.json (as THUDM/slime's scripts/models/qwen3-30B-A3B.sh restates it for Megatron):
        # 48 layers, hidden 2048, 32 heads of head_dim 128, 4 KV heads, 128 experts of width 768, top-8, every layer
        # MoE (decoder_sparse_step 1, no mlp_only_layers), vocab 151936, untied, 40960 positions. 30.5B total,
        # 3.3B active.
        ModelShape("qwen3-30b-a3b", "decoder", 48, 2048, 6144, 32, 4, 151936, False, True, "qwen3_moe", 40960, "qwen3",
                   attn_head_dim=128, num_experts=128, experts_per_token=8, moe_intermediate=768, moe_layers=48,
                   expert_imbalance=ASSUMED_EXPERT_IMBALANCE),
        # Qwen/Qwen3-235B-A22B config.json (slime's scripts/models/qwen3-235B-A22B.sh): 94 layers, hidden 4096, 64 heads
        # of 128, 4 KV heads, 128 experts of width 1536, top-8, every layer MoE. 235B total, 22B active.
        ModelShape("qwen3-235b-a22b", "decoder", 94, 4096, 12288, 64, 4, 151936, False, True, "qwen3_moe", 40960,
                   "qwen3",
                   attn_head_dim=128, num_experts=128, experts_per_token=8, moe_intermediate=1536, moe_layers=94,
                   expert_imbalance=ASSUMED_EXPERT_IMBALANCE),
        # deepseek-ai/DeepSeek-V3 config.json (slime's scripts/models/deepseek-v3.sh): 61 layers, hidden 7168, the
        # first 3 dense (first_k_dense_replace, intermediate 18432), 58 MoE of 256 routed experts of width 2048, top-8,
        # and one shared expert; multi-head latent attention, 128 heads, q_lora_rank 1536, kv_lora_rank 512, qk_nope
        # 128, qk_rope 64, v_head_dim 128; vocab 129280, untied, 163840 positions. 671B total, 37B active. Its
        # multi-token prediction module (num_nextn_predict_layers 1) is not counted: it serves speculative decoding,
        # which the simulator does not model.
        ModelShape("deepseek-v3", "decoder", 61, 7168, 18432, 128, 128, 129280, False, True, "deepseek_v3", 163840,
                   "deepseek-v3", num_experts=256, experts_per_token=8, moe_intermediate=2048, moe_layers=58,
                   shared_experts=1, shared_intermediate=2048, expert_imbalance=ASSUMED_EXPERT_IMBALANCE,
                   attention="mla", q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64,
                   v_head_dim=128),
        _l("llama-3.1-8b", 32, 4096, 14336, 32, 8),
        _l("llama-3.1-70b", 80, 8192, 28672, 64, 8),
        ModelShape("deberta-v3-large", "encoder", 24, 1024, 4096, 16, 16, 128100, True, False, "deberta-v2", 512, "deberta-v3"),
        # google/electra-large-discriminator: the reward-scoring study's second encoder
        ModelShape("electra-large", "encoder", 24, 1024, 4096, 16, 16, 30522, True, False, "electra", 512, "bert-uncased"),
        # Tiny shapes for CPU calibration, validation and CI: same architecture families, small sizes.
        # The two tiny Qwen2 shapes share one (synthetic) tokenizer, as Qwen2.5 models of different embedding
        # sizes share theirs; the tiny encoders' tokenizers are their own (calibrate.measuring.retokenize builds them).
        _q("tiny-qwen2", 2, 128, 512, 4, 2, 1024, True, 4096, "synthetic-qwen2"),
        _q("small-qwen2", 4, 256, 1024, 8, 2, 4096, True, 4096, "synthetic-qwen2"),
        # The same two widths at the other depth, so that a CPU calibration sees depth and width move apart
        # (a fit to tiny-qwen2 and small-qwen2 alone cannot tell a cost per layer from one per width).
        _q("tiny-qwen2-l4", 4, 128, 512, 4, 2, 1024, True, 4096, "synthetic-qwen2"),
        _q("small-qwen2-l2", 2, 256, 1024, 8, 2, 4096, True, 4096, "synthetic-qwen2"),
        # ... and the KV width and the vocabulary moved on their own: full multi-head attention (8 KV heads,
        # 256 K/V values per token per layer against tiny/small-qwen2's 64) and a vocabulary of 8,192.
        _q("small-qwen2-l3-mha", 3, 256, 1024, 8, 8, 4096, True, 4096, "synthetic-qwen2"),
        _q("tiny-qwen2-v8k", 2, 128, 512, 4, 2, 8192, True, 4096, "synthetic-qwen2"),
        ModelShape("tiny-deberta", "encoder", 2, 128, 512, 4, 4, 1024, True, False, "deberta-v2", 512),
        # The encoders' other width (hidden 256, head_dim 64 as DeBERTa's), at tiny-deberta's depth so that width moves
        # alone: fitted on hidden 128 alone, the encoder forward priced drawn DeBERTa models of hidden 256 at 1.6-2.6x
        # their time (``lab/diagnostics/encoder_price.py`` measures it), as the decoders needed both widths.
        ModelShape("small-deberta", "encoder", 2, 256, 1024, 4, 4, 4096, True, False, "deberta-v2", 512),
        ModelShape("tiny-electra", "encoder", 2, 128, 512, 4, 4, 1024, True, False, "electra", 512),
    ]
}


def shape_from_hf_config(path: str | Path, yaml_path: str = "") -> ModelShape:
    """Read a local Hugging Face ``config.json`` (or a directory holding one) into a ModelShape."""
    p = Path(path)
    try:
        if p.is_dir():
            p = p / "config.json"
        found = p.is_file()
    except (OSError, ValueError) as e:  # a NUL byte or an over-long name
        raise ScenarioError(yaml_path, f"expected a catalog model name or a path to a config.json, got {str(path)!r} ({e})") from None
    if not found:
        raise ScenarioError(yaml_path, f"expected a catalog model name or a path to a config.json, got {str(path)!r} (no such file)")
    try:
        cfg = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise ScenarioError(yaml_path, f"expected a valid Hugging Face config.json, got unreadable {str(p)!r} ({e})") from None
    except UnicodeDecodeError:
        raise ScenarioError(yaml_path, f"expected a Hugging Face config.json (UTF-8 JSON text), got a binary file {str(p)!r}") from None
    except RecursionError:
        raise ScenarioError(yaml_path, f"expected a Hugging Face config.json, got JSON nested too deep in {str(p)!r}") from None
    if not isinstance(cfg, dict):
        raise ScenarioError(yaml_path, f"expected a Hugging Face config.json holding a JSON object, got a {type(cfg).__name__} in {str(p)!r}")
    shape = _shape_from_config(cfg, p, yaml_path)
    for name, hi in SIZE_LIMITS.items():
        v = getattr(shape, name)
        if not 1 <= v <= hi:
            raise ScenarioError(yaml_path, f"expected {name} (config.json {HF_KEYS[name]}) in 1..{hi:,}, got {v} in {str(p)!r}")
    if shape.hidden < shape.heads:
        raise ScenarioError(yaml_path, f"expected hidden_size >= num_attention_heads ({shape.heads}: at least one dimension per head), got {shape.hidden} in {str(p)!r}")
    if shape.kv_heads > shape.heads:
        raise ScenarioError(yaml_path, f"expected num_key_value_heads <= num_attention_heads ({shape.heads}), got {shape.kv_heads} in {str(p)!r}")
    return shape


# Bounds on the sizes read from a config.json (the largest published models are well inside them).
SIZE_LIMITS = {"layers": 1024, "hidden": 131_072, "intermediate": 1_048_576, "heads": 4096, "kv_heads": 4096,
               "vocab": 16_777_216, "max_positions": 1 << 24}
HF_KEYS = {"layers": "num_hidden_layers", "hidden": "hidden_size", "intermediate": "intermediate_size",
           "heads": "num_attention_heads", "kv_heads": "num_key_value_heads", "vocab": "vocab_size",
           "max_positions": "max_position_embeddings"}


def _shape_from_config(cfg: dict, p: Path, yaml_path: str) -> ModelShape:
    try:
        mtype = str(cfg.get("model_type", "llama"))
        hidden = int(cfg["hidden_size"])
        heads = int(cfg["num_attention_heads"])
        encoder = mtype in ("deberta", "deberta-v2", "bert", "roberta", "electra")
        extra = {} if encoder else {**_attention_from_config(cfg, hidden, heads, p, yaml_path),
                                    **_moe_from_config(cfg, int(cfg["num_hidden_layers"]), p, yaml_path)}
        return ModelShape(
            name=str(cfg.get("_name_or_path") or p.parent.name),
            arch="encoder" if encoder else "decoder",
            layers=int(cfg["num_hidden_layers"]),
            hidden=hidden,
            intermediate=int(cfg["intermediate_size"]),
            heads=heads,
            kv_heads=int(cfg.get("num_key_value_heads", heads)),
            vocab=int(cfg["vocab_size"]),
            tied_embeddings=bool(cfg.get("tie_word_embeddings", encoder)),
            gated_mlp=not encoder,
            hf_model_type=mtype,
            max_positions=int(cfg.get("max_position_embeddings", 32768)),
            **extra,
        )
    except (KeyError, TypeError, ValueError, OverflowError) as e:
        raise ScenarioError(yaml_path, f"expected a config.json with hidden_size, num_attention_heads, num_hidden_layers, intermediate_size, vocab_size; {str(p)!r} has a missing or invalid one ({type(e).__name__}: {e})") from None


def _int(cfg: dict, key: str, default: int = 0) -> int:
    """``cfg[key]`` as an int, ``default`` where absent or null (DeepSeek-V2-Lite writes ``"q_lora_rank": null``)."""
    v = cfg.get(key)
    return default if v is None else int(v)


def _attention_from_config(cfg: dict, hidden: int, heads: int, p: Path, yaml_path: str) -> dict:
    """The attention fields of a decoder's config.json: multi-head latent attention where it has ``kv_lora_rank``
    (DeepSeek-V2/V3, Kimi-K2), else grouped-query attention with ``head_dim`` where it is not hidden / heads."""
    if cfg.get("kv_lora_rank") is not None:
        out = {"attention": "mla", "q_lora_rank": _int(cfg, "q_lora_rank"), "kv_lora_rank": _int(cfg, "kv_lora_rank"),
               "qk_nope_head_dim": _int(cfg, "qk_nope_head_dim"), "qk_rope_head_dim": _int(cfg, "qk_rope_head_dim"),
               "v_head_dim": _int(cfg, "v_head_dim")}
        for k in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
            if not 1 <= out[k] <= SIZE_LIMITS["hidden"]:
                raise ScenarioError(yaml_path, f"expected {k} in 1..{SIZE_LIMITS['hidden']:,} in a multi-head latent attention config.json (it has kv_lora_rank), got {out[k]} in {str(p)!r}")
        return out
    head_dim = _int(cfg, "head_dim")
    if head_dim and head_dim != hidden // heads:
        if not 1 <= head_dim <= SIZE_LIMITS["hidden"]:
            raise ScenarioError(yaml_path, f"expected head_dim in 1..{SIZE_LIMITS['hidden']:,}, got {head_dim} in {str(p)!r}")
        return {"attn_head_dim": head_dim}
    return {}


# config.json keys of the routed experts' count, by family: Qwen2/3-MoE, DeepSeek-V2/V3, Mixtral and gpt-oss
EXPERT_KEYS = ("num_experts", "n_routed_experts", "num_local_experts")
TOPK_KEYS = ("num_experts_per_tok", "experts_per_token")


def _moe_from_config(cfg: dict, layers: int, p: Path, yaml_path: str) -> dict:
    """The mixture-of-experts fields of a decoder's config.json ({} for a dense model). Which layers have experts:
    DeepSeek's layer i >= ``first_k_dense_replace`` with i % ``moe_layer_freq`` == 0; Qwen's layer i not in
    ``mlp_only_layers`` with (i + 1) % ``decoder_sparse_step`` == 0 (transformers' modeling code for each); every
    layer otherwise (Mixtral, gpt-oss). An expert's width is ``moe_intermediate_size``, else ``intermediate_size``
    (Mixtral's and gpt-oss's experts are full-width MLPs)."""
    key = next((k for k in EXPERT_KEYS if cfg.get(k)), None)
    if key is None:
        return {}
    experts = int(cfg[key])
    topk_key = next((k for k in TOPK_KEYS if cfg.get(k) is not None), None)
    topk = int(cfg[topk_key]) if topk_key else 0
    if not 1 <= experts <= 65_536:
        raise ScenarioError(yaml_path, f"expected {key} in 1..65,536, got {experts} in {str(p)!r}")
    if not 1 <= topk <= experts:
        raise ScenarioError(yaml_path, f"expected num_experts_per_tok in 1..{key} ({experts}) in a mixture-of-experts config.json, got {cfg.get(topk_key) if topk_key else 'none'} in {str(p)!r}")
    width = _int(cfg, "moe_intermediate_size") or int(cfg["intermediate_size"])
    if not 1 <= width <= SIZE_LIMITS["intermediate"]:
        raise ScenarioError(yaml_path, f"expected moe_intermediate_size in 1..{SIZE_LIMITS['intermediate']:,}, got {width} in {str(p)!r}")
    if "first_k_dense_replace" in cfg or "moe_layer_freq" in cfg:
        first, freq = _int(cfg, "first_k_dense_replace"), _int(cfg, "moe_layer_freq", 1)
        moe = [i >= first and i % max(freq, 1) == 0 for i in range(layers)]
    else:
        step, dense = _int(cfg, "decoder_sparse_step", 1), set(cfg.get("mlp_only_layers") or [])
        moe = [i not in dense and (i + 1) % max(step, 1) == 0 for i in range(layers)]
    shared = _int(cfg, "n_shared_experts")
    shared_width = shared * width if shared else _int(cfg, "shared_expert_intermediate_size")
    return dict(num_experts=experts, experts_per_token=topk, moe_intermediate=width, moe_layers=sum(moe),
                shared_experts=shared or (1 if shared_width else 0), shared_intermediate=shared_width,
                expert_imbalance=ASSUMED_EXPERT_IMBALANCE)


def load_model(ref: str, yaml_path: str = "", base_dir: Path | None = None) -> ModelShape:
    """A catalog name (case-insensitive) or a path to a local config.json / checkpoint directory."""
    key = ref.lower()
    if key in CATALOG:
        return CATALOG[key]
    try:
        beside = bool(base_dir) and (base_dir / ref).exists()
    except (OSError, ValueError):  # a NUL byte or an over-long name: not a file
        beside = False
    if "/" in ref or ref.endswith(".json") or beside:
        p = Path(ref)
        if not p.is_absolute() and beside:
            p = base_dir / p
        return shape_from_hf_config(p, yaml_path)
    raise ScenarioError(yaml_path, f"expected a catalog model ({', '.join(CATALOG)}) or a path to a config.json, got {ref!r}")


def with_name(shape: ModelShape, name: str) -> ModelShape:
    return replace(shape, name=name)
