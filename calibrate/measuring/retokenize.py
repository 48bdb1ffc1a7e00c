"""Tokenizers built in code (nothing from the hub) and the re-tokenizing a trainer does when its reward
model reads another tokenizer than the actor (TRL's ``reward_processing_classes``: the completions are
decoded to text and the reward model's tokenizer encodes the texts again).

A model's tokenizer is a word-level ``tokenizers.Tokenizer`` sized to its vocabulary (``ModelShape.vocab``):
id 0 is the pad token (``calibrate.measuring.models.PAD_ID``), id 1 the unknown word, ids 2 .. vocab - 1 words of
a shared synthetic word list ("a", "b", ..., "z", "aa", ...), each tokenizer holding its own seeded
shuffle of the first vocab - 2 of them (seeded by ``ModelShape.tokenizer_id``: two tokenizers of one id
are the same tokenizer). Texts are words separated by single spaces (split on whitespace), so one
actor token becomes one reward token: the word, or the unknown word when the reward vocabulary lacks it.
A re-tokenized response keeps its token count, which is what the simulator assumes (docs/cost-model.md);
real tokenizer pairs differ by some percent, which is not modelled. The work measured is real: a Rust
``decode_batch`` of the actor's ids and an ``encode_batch`` of the texts.
"""

from __future__ import annotations

import zlib

import numpy as np

from rlhfsim.models.catalog import ModelShape

PAD, UNK = "<pad>", "<unk>"


def word(j: int) -> str:
    """The j-th word (j >= 0) of the synthetic word list: bijective base 26 over a..z."""
    out = []
    j += 1
    while j > 0:
        j, r = divmod(j - 1, 26)
        out.append(chr(ord("a") + r))
    return "".join(reversed(out))


def build_tokenizer(shape: ModelShape):
    """The word-level tokenizer of ``shape`` (see the module docstring)."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit

    n = max(shape.vocab - 2, 0)
    order = np.random.default_rng(zlib.crc32(shape.tokenizer_id.encode())).permutation(n)
    vocab = {PAD: 0, UNK: 1}
    vocab.update({word(int(j)): i + 2 for i, j in enumerate(order)})
    tok = Tokenizer(WordLevel(vocab, unk_token=UNK))
    tok.pre_tokenizer = WhitespaceSplit()
    return tok


class Retokenizer:
    """Actor token ids -> text -> the reward model's token ids, a batch of rows per call."""

    def __init__(self, actor: ModelShape, reward: ModelShape):
        self.src, self.dst = build_tokenizer(actor), build_tokenizer(reward)

    def __call__(self, rows: list[list[int]]) -> list[list[int]]:
        texts = self.src.decode_batch(rows, skip_special_tokens=False)
        return [e.ids for e in self.dst.encode_batch(texts, add_special_tokens=False)]
