"""Transformer shapes with the numbers that decide cost: layers, hidden, intermediate, heads, KV heads,
vocabulary, tied embeddings. Shapes are copied from the models' published ``config.json`` files.

Pure Python (no pydantic, no torch): ``calibrate/`` imports it to build random-weight models of the same
shapes and to compute the FLOP/byte counts its fits are expressed in.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from rlhfsim.errors import ScenarioError

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


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

    @property
    def tokenizer_id(self) -> str:
        """Which tokenizer the model reads: ``tokenizer`` when the catalog names it (Qwen2.5 models of
        different embedding sizes share one), else ``<hf_model_type>-<vocab>``. Two models with different
        ids need the actor's tokens decoded to text and tokenized again (``rlhfsim.scenario.checks``)."""
        return self.tokenizer or f"{self.hf_model_type}-{self.vocab}"

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def layer_params(self) -> int:
        h = self.hidden
        attn = 2 * h * h + 2 * h * self.kv_dim
        mlp = (3 if self.gated_mlp else 2) * h * self.intermediate
        return attn + mlp

    @property
    def embedding_params(self) -> int:
        return self.vocab * self.hidden

    def params(self, head: str = "lm") -> int:
        """Parameter count with a language-model head (``lm``) or a scalar value/score head
        (``value``)."""
        body = self.layers * self.layer_params + self.embedding_params
        if head == "lm":
            return body + (0 if self.tied_embeddings else self.embedding_params)
        return body + self.hidden

    def kv_bytes_per_token(self, dtype: str) -> int:
        """Bytes of K and V cache one token occupies across all layers."""
        return 2 * self.layers * self.kv_dim * DTYPE_BYTES[dtype]

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
        # deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B config.json: Qwen2.5-Math-1.5B's shape with an untied LM head
        # (1.78B parameters), 131072 positions.
        _q("deepseek-r1-distill-qwen-1.5b", 28, 1536, 8960, 12, 2, 151936, False, 131072),
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
        )
    except (KeyError, TypeError, ValueError, OverflowError) as e:
        raise ScenarioError(yaml_path, f"expected a config.json with hidden_size, num_attention_heads, num_hidden_layers, intermediate_size, vocab_size; {str(p)!r} has a missing or invalid one ({type(e).__name__}: {e})") from None


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
