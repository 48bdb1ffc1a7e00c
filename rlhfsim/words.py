"""English in output lines: a count with its noun in the right number, and the article before a word."""

from __future__ import annotations


def count(n: int | float, noun: str, plural: str | None = None) -> str:
    """``1 GPU``, ``8 GPUs`` (``plural``: where adding an s is wrong)."""
    return f"{n} {noun if n == 1 else (plural or noun + 's')}"


def article(word: str) -> str:
    """``a decoder``, ``an encoder``: by the word's first letter (enough for the words printed here)."""
    return f"{'an' if word[:1].lower() in 'aeiou' else 'a'} {word}"
