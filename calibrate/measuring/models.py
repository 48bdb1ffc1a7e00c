"""Hugging Face models built from ``ModelShape`` configs with random weights (nothing is downloaded), or
loaded from a local checkpoint directory.

Heads: ``lm`` -> ``*ForCausalLM`` (actor, reference), ``value`` -> ``*ForSequenceClassification`` with one
label (reward model, critic). Decoder shapes use Qwen2 or Llama classes (by ``hf_model_type``); encoder
shapes by theirs: ``deberta-v2`` -> DeBERTa-v2 classes with the DeBERTa-v3 settings (relative attention, no
absolute positions), ``electra`` -> ``ElectraForSequenceClassification`` (ELECTRA discriminator settings);
any other encoder type is an error, never silently built as another architecture (``ENCODER_TYPES``).
Decoder and ELECTRA attention run through ``torch.nn.functional.scaled_dot_product_attention`` ("sdpa");
DeBERTa's disentangled attention has only transformers' own ("eager") implementation.

Padding convention of every input built here: right padding with token id 0 (``PAD_ID``); real tokens are
drawn from [1, vocab).
"""

from __future__ import annotations

from pathlib import Path

import torch

from rlhfsim.errors import RlhfsimError
from rlhfsim.models.catalog import ModelShape

PAD_ID = 0
HEADS = ("lm", "value")


def torch_dtype(dtype) -> torch.dtype:
    """``"bfloat16"`` or ``torch.bfloat16`` -> ``torch.bfloat16``."""
    if isinstance(dtype, torch.dtype):
        return dtype
    try:
        return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
    except KeyError:
        raise RlhfsimError(f"dtype: expected float32, bfloat16 or float16, got {dtype!r}") from None


def dtype_name(dtype) -> str:
    return str(torch_dtype(dtype)).removeprefix("torch.")


def hf_config(shape: ModelShape, head: str):
    """A transformers config of ``shape`` (``num_labels=1`` for the value head)."""
    import transformers

    if head not in HEADS:
        raise RlhfsimError(f"head: expected one of {', '.join(HEADS)}, got {head!r}")
    common = dict(vocab_size=shape.vocab, hidden_size=shape.hidden, intermediate_size=shape.intermediate,
                  num_hidden_layers=shape.layers, num_attention_heads=shape.heads, pad_token_id=PAD_ID,
                  num_labels=1)
    if shape.arch == "encoder":
        if head != "value":
            raise RlhfsimError(f"model {shape.name}: an encoder shape has only a value (score) head, got head {head!r}")
        if shape.hf_model_type not in ENCODER_TYPES:
            raise RlhfsimError(f"model {shape.name}: expected an encoder hf_model_type of {', '.join(ENCODER_TYPES)}, "
                               f"got {shape.hf_model_type!r} (no builder for it; it is not built as another architecture)")
        cfg = ENCODER_TYPES[shape.hf_model_type][0](shape, common)
    elif shape.hf_model_type in ("qwen2", "llama"):
        cls = transformers.Qwen2Config if shape.hf_model_type == "qwen2" else transformers.LlamaConfig
        cfg = cls(**common, num_key_value_heads=shape.kv_heads, max_position_embeddings=shape.max_positions,
                  tie_word_embeddings=shape.tied_embeddings)
    else:
        raise RlhfsimError(f"model {shape.name}: expected hf_model_type qwen2, llama, deberta-v2 or electra, got {shape.hf_model_type!r}")
    # DeBERTa-v2 has no sdpa path in transformers; its own attention is the "eager" implementation.
    cfg._attn_implementation = "eager" if shape.hf_model_type == "deberta-v2" else "sdpa"
    return cfg


def _deberta_v3_config(shape: ModelShape, common: dict):
    import transformers

    return transformers.DebertaV2Config(
        **common, max_position_embeddings=min(shape.max_positions, 512), relative_attention=True,
        position_biased_input=False, pos_att_type=["p2c", "c2p"], max_relative_positions=-1,
        position_buckets=256, norm_rel_ebd="layer_norm", share_att_key=True, hidden_act="gelu",
        type_vocab_size=0, layer_norm_eps=1e-7)


def _electra_config(shape: ModelShape, common: dict):
    """ELECTRA's discriminator settings (google/electra-large-discriminator: absolute positions, GELU,
    embedding size = hidden, 2 token types, layer-norm eps 1e-12)."""
    import transformers

    return transformers.ElectraConfig(**common, embedding_size=shape.hidden, max_position_embeddings=shape.max_positions,
                                      hidden_act="gelu", type_vocab_size=2, layer_norm_eps=1e-12)


def _class(name: str):
    import transformers

    return getattr(transformers, name)


# encoder hf_model_type -> (config builder, sequence-classification class name)
ENCODER_TYPES = {
    "deberta-v2": (_deberta_v3_config, "DebertaV2ForSequenceClassification"),
    "electra": (_electra_config, "ElectraForSequenceClassification"),
}


def _model_class(shape: ModelShape, head: str):
    import transformers

    if shape.arch == "encoder":
        return _class(ENCODER_TYPES[shape.hf_model_type][1])
    if shape.hf_model_type == "llama":
        return transformers.LlamaForCausalLM if head == "lm" else transformers.LlamaForSequenceClassification
    return transformers.Qwen2ForCausalLM if head == "lm" else transformers.Qwen2ForSequenceClassification


def build_hf_model(shape: ModelShape, head: str, dtype, device, seed: int = 0):
    """A transformers model of ``shape`` with random weights drawn from ``seed`` (the global torch RNG is
    left as it was), in ``dtype`` on ``device``, in eval mode."""
    cfg = hf_config(shape, head)
    cls = _model_class(shape, head)
    dev = torch.device(device)
    fork_devices = [dev.index or 0] if dev.type == "cuda" else []
    with torch.random.fork_rng(devices=fork_devices):
        torch.manual_seed(seed)
        with dev:  # initialise on the target device: much faster than CPU init + copy for big shapes
            model = cls(cfg)
    return model.to(dtype=torch_dtype(dtype)).eval()


def load_hf_checkpoint(path: str | Path, head: str, dtype, device):
    """A model from a local checkpoint directory (``config.json`` + weights), never from the network."""
    import transformers

    p = Path(path)
    if not (p / "config.json").is_file():
        raise RlhfsimError(f"--model-path: expected a checkpoint directory with config.json, got {str(path)!r}")
    auto = transformers.AutoModelForCausalLM if head == "lm" else transformers.AutoModelForSequenceClassification
    kw = {} if head == "lm" else {"num_labels": 1}
    try:
        model = auto.from_pretrained(str(p), local_files_only=True, dtype=torch_dtype(dtype), **kw)
    except (OSError, ValueError) as e:
        raise RlhfsimError(f"--model-path: cannot load {str(path)!r} with head {head!r}: {str(e).splitlines()[0]}") from None
    if model.config.pad_token_id is None:
        model.config.pad_token_id = PAD_ID
    return model.to(device).eval()


def random_batch(vocab: int, lengths: list[int], device, seed: int, pad_to: int | None = None):
    """Right-padded ``input_ids`` and ``attention_mask`` [batch, pad_to or max(lengths)] with tokens drawn
    from [1, vocab) by a generator seeded with ``seed`` (same inputs on every run and every runtime)."""
    width = pad_to or max(lengths)
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, vocab, (len(lengths), width), generator=g)
    mask = torch.zeros_like(ids)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
    ids = ids * mask + PAD_ID * (1 - mask)
    return ids.to(device), mask.to(device)
