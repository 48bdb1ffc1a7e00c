"""StaticKVDecoder against Hugging Face Qwen2/Llama (random weights, fp32, tiny shapes)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from calibrate.measuring.decoder import StaticKVDecoder  # noqa: E402
from rlhfsim.errors import RlhfsimError  # noqa: E402
from rlhfsim.models.catalog import CATALOG, ModelShape  # noqa: E402

pytestmark = pytest.mark.hw  # the hardware side (pyproject.toml markers); the fast loop skips it

TOL = 1e-4


def _hf_config(shape: ModelShape, **extra):
    cls = transformers.Qwen2Config if shape.hf_model_type == "qwen2" else transformers.LlamaConfig
    return cls(vocab_size=shape.vocab, hidden_size=shape.hidden, intermediate_size=shape.intermediate,
               num_hidden_layers=shape.layers, num_attention_heads=shape.heads,
               num_key_value_heads=shape.kv_heads, tie_word_embeddings=shape.tied_embeddings,
               max_position_embeddings=shape.max_positions, attn_implementation="eager", **extra)


def _hf_lm(shape: ModelShape, seed: int = 0):
    torch.manual_seed(seed)
    cls = transformers.Qwen2ForCausalLM if shape.hf_model_type == "qwen2" else transformers.LlamaForCausalLM
    return cls(_hf_config(shape)).eval()


def _decoder(shape, hf, max_slots=4, max_len=64, head="lm"):
    dec = StaticKVDecoder(shape, dtype=torch.float32, device="cpu", max_slots=max_slots, max_len=max_len, head=head)
    dec.load_hf_state_dict(hf.state_dict())
    return dec


@pytest.fixture(scope="module")
def tiny():
    shape = CATALOG["tiny-qwen2"]
    return shape, _hf_lm(shape)


def _ids(gen, n, t, vocab):
    return torch.randint(0, vocab, (n, t), generator=gen)


def test_prefill_matches_hf(tiny):
    shape, hf = tiny
    ids = _ids(torch.Generator().manual_seed(1), 3, 17, shape.vocab)
    dec = _decoder(shape, hf)
    got = dec.extend(torch.arange(3), ids)
    with torch.no_grad():
        ref = hf(input_ids=ids).logits[:, -1]
    assert got.shape == (3, shape.vocab)
    assert (got - ref).abs().max().item() < TOL
    assert dec.positions.tolist() == [17, 17, 17, 0]


def test_chunked_extend_matches_one_shot(tiny):
    shape, hf = tiny
    ids = _ids(torch.Generator().manual_seed(2), 2, 23, shape.vocab)
    one = _decoder(shape, hf).extend(torch.tensor([0, 1]), ids)
    dec = _decoder(shape, hf)
    slots = torch.tensor([2, 0])        # non-contiguous slots exercise the gather path
    for a, b in [(0, 5), (5, 6), (6, 14), (14, 22), (22, 23)]:   # prefill, decode steps, chunks
        out = dec.extend(slots, ids[:, a:b])
    assert (out - one).abs().max().item() < TOL
    # every prefix's last-token logits against HF's full forward at that position
    with torch.no_grad():
        full = hf(input_ids=ids).logits
    dec.reset(slots)
    for t in range(ids.shape[1]):
        out = dec.extend(slots, ids[:, t:t + 1])
        assert (out - full[:, t]).abs().max().item() < TOL


def test_slots_at_different_positions_match_alone(tiny):
    shape, hf = tiny
    gen = torch.Generator().manual_seed(3)
    prompts = [_ids(gen, 1, t, shape.vocab) for t in (3, 11, 7)]
    nxt = _ids(gen, 3, 4, shape.vocab)
    dec = _decoder(shape, hf)
    for i, p in enumerate(prompts):                       # one prefill per admission, unequal lengths
        dec.extend(torch.tensor([i]), p)
    batched = dec.extend(torch.tensor([0, 1, 2]), nxt)   # one batched chunk, three positions
    for i, p in enumerate(prompts):
        alone = _decoder(shape, hf, max_slots=1)
        alone.extend(torch.tensor([0]), p)
        ref = alone.extend(torch.tensor([0]), nxt[i:i + 1])
        assert (batched[i] - ref[0]).abs().max().item() < TOL
    # a freed slot refilled with a shorter prompt ignores the previous occupant's stale cache
    dec.reset(torch.tensor([1]))
    q = _ids(gen, 1, 2, shape.vocab)
    got = dec.extend(torch.tensor([1]), q)
    with torch.no_grad():
        ref = hf(input_ids=q).logits[:, -1]
    assert (got - ref).abs().max().item() < TOL


def test_padded_prefill_with_lengths_then_decode(tiny):
    shape, hf = tiny
    gen = torch.Generator().manual_seed(8)
    lens = [5, 12, 9]
    seqs = [_ids(gen, 1, t + 3, shape.vocab)[0] for t in lens]       # prompt + 3 later tokens each
    ids = torch.zeros(3, max(lens), dtype=torch.long)                   # right padding with 0
    for i, t in enumerate(lens):
        ids[i, :t] = seqs[i][:t]
    dec = _decoder(shape, hf)
    got = dec.extend(torch.tensor([0, 1, 2]), ids, lengths=torch.tensor(lens))
    assert dec.positions[:3].tolist() == lens
    for step in range(3):   # decoding on top overwrites the padding's K/V before anything attends it
        nxt = torch.stack([seqs[i][lens[i] + step] for i in range(3)])[:, None]
        got_d = dec.extend(torch.tensor([0, 1, 2]), nxt)
    with torch.no_grad():
        for i, t in enumerate(lens):
            full = hf(input_ids=seqs[i][None]).logits[0]
            assert (got[i] - full[t - 1]).abs().max().item() < TOL
            assert (got_d[i] - full[t + 2]).abs().max().item() < TOL


def test_value_head_matches_hf_sequence_classification():
    shape = CATALOG["tiny-qwen2"]
    torch.manual_seed(4)
    rm = transformers.Qwen2ForSequenceClassification(_hf_config(shape, num_labels=1, pad_token_id=0)).eval()
    dec = _decoder(shape, rm, head="value")
    ids = _ids(torch.Generator().manual_seed(5), 2, 20, shape.vocab).clamp_(min=1)   # no pad tokens
    dec.extend(torch.tensor([0, 1]), ids[:, :8])
    got = dec.extend(torch.tensor([0, 1]), ids[:, 8:])   # chunk on top of the cached prefix
    with torch.no_grad():
        ref = rm(input_ids=ids).logits[:, 0]
    assert got.shape == (2,)
    assert (got - ref).abs().max().item() < TOL


def test_untied_llama_matches_hf():
    shape = ModelShape("tiny-llama", "decoder", 2, 64, 128, 4, 1, 300, False, True, "llama", 512)
    hf = _hf_lm(shape, seed=6)
    ids = _ids(torch.Generator().manual_seed(7), 2, 9, shape.vocab)
    dec = _decoder(shape, hf)
    dec.extend(torch.tensor([0, 1]), ids[:, :4])
    got = dec.extend(torch.tensor([0, 1]), ids[:, 4:])
    with torch.no_grad():
        ref = hf(input_ids=ids).logits[:, -1]
    assert (got - ref).abs().max().item() < TOL


def test_errors_name_the_problem(tiny):
    shape, hf = tiny
    dec = StaticKVDecoder(shape, dtype=torch.float32, device="cpu", max_slots=2, max_len=8)
    with pytest.raises(RlhfsimError, match="max_len=8"):
        dec.extend(torch.tensor([0]), torch.zeros(1, 9, dtype=torch.long))
    sd = dict(hf.state_dict())
    sd.pop("model.norm.weight")
    with pytest.raises(RlhfsimError, match="model.norm.weight"):
        dec.load_hf_state_dict(sd)
    with pytest.raises(RlhfsimError, match="arch"):
        StaticKVDecoder(CATALOG["tiny-deberta"], dtype=torch.float32, device="cpu", max_slots=1, max_len=4)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_hf():
    shape = CATALOG["tiny-qwen2"]
    hf = _hf_lm(shape).cuda()
    ids = _ids(torch.Generator().manual_seed(9), 3, 14, shape.vocab).cuda()
    dec = StaticKVDecoder(shape, dtype=torch.float32, device="cuda", max_slots=4, max_len=32)
    dec.load_hf_state_dict(hf.state_dict())
    dec.extend(torch.tensor([3, 0, 1]), ids[:, :9])
    got = dec.extend(torch.tensor([3, 0, 1]), ids[:, 9:])
    with torch.no_grad():
        ref = hf(input_ids=ids).logits[:, -1]
    assert (got - ref).abs().max().item() < 1e-3
