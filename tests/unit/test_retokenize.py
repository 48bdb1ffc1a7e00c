"""Code-built tokenizers and re-tokenizing (calibrate/measuring/retokenize.py): ids stay within the reward model's
vocabulary, a response keeps its token count, the same tokenizer id gives the same tokenizer, and which
pairs re-tokenize (ModelShape.tokenizer_id)."""

from __future__ import annotations

import pytest

pytest.importorskip("tokenizers")

from calibrate.measuring.retokenize import Retokenizer, build_tokenizer, word  # noqa: E402
from rlhfsim.models.catalog import CATALOG  # noqa: E402


def test_words_are_distinct():
    ws = [word(j) for j in range(30_000)]
    assert len(set(ws)) == len(ws) and ws[:3] == ["a", "b", "c"] and ws[26] == "aa"


def test_retokenized_ids_fit_the_reward_vocabulary_and_keep_the_count():
    actor, reward = CATALOG["small-qwen2"], CATALOG["tiny-deberta"]
    rows = [[1, 2, 3, 4095, 77], list(range(1, 400)), [4000]]
    out = Retokenizer(actor, reward)(rows)
    assert [len(r) for r in out] == [len(r) for r in rows]
    assert all(0 < i < reward.vocab for r in out for i in r)
    # a word both vocabularies hold maps to the reward tokenizer's id of that word, not the same id
    src, dst = build_tokenizer(actor), build_tokenizer(reward)
    shared = [i for i in range(2, 200) if dst.token_to_id(src.id_to_token(i)) is not None]
    assert shared and any(dst.token_to_id(src.id_to_token(i)) != i for i in shared)


def test_which_pairs_retokenize():
    c = CATALOG
    assert c["qwen2.5-3b"].tokenizer_id == c["qwen2.5-7b"].tokenizer_id   # one tokenizer, two embedding sizes
    assert c["tiny-qwen2"].tokenizer_id == c["small-qwen2"].tokenizer_id
    assert c["small-qwen2"].tokenizer_id != c["tiny-deberta"].tokenizer_id
    assert c["deberta-v3-large"].tokenizer_id != c["qwen2.5-7b"].tokenizer_id
