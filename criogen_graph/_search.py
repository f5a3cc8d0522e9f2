"""Ranking texts for memory recall and collection search: BM25 over words by default,
cosine similarity when an embedding function is given. Runs in Python over one
namespace's items, so it works on every storage (no vector extension needed)."""

from __future__ import annotations

import inspect
import math
import re
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

Embed = Callable[[list[str]], "list[list[float]] | Awaitable[list[list[float]]]"]

_WORD = re.compile(r"[\w']+", re.UNICODE)
_STOP = frozenset(
    [
        "a",
        "an",
        "and",
        "are",
        "as",
        "at",
        "be",
        "but",
        "by",
        "for",
        "from",
        "has",
        "have",
        "i",
        "in",
        "is",
        "it",
        "its",
        "me",
        "my",
        "of",
        "on",
        "or",
        "our",
        "so",
        "that",
        "the",
        "their",
        "them",
        "they",
        "this",
        "to",
        "was",
        "we",
        "were",
        "what",
        "when",
        "where",
        "which",
        "who",
        "why",
        "will",
        "with",
        "you",
        "your",
    ]
)


def words(text: str) -> list[str]:
    """Lowercased words, without the commonest English ones."""
    return [w for w in _WORD.findall(text.lower()) if w not in _STOP]


def bm25(query: str, texts: Sequence[str], *, k1: float = 1.2, b: float = 0.75) -> list[float]:
    """One BM25 score per text (0 when no query word occurs in it)."""
    q = set(words(query))
    if not q or not texts:
        return [0.0] * len(texts)
    docs = [Counter(words(t)) for t in texts]
    avg = sum(sum(d.values()) for d in docs) / len(docs) or 1.0
    n = len(docs)
    df = {w: sum(1 for d in docs if w in d) for w in q}
    scores = []
    for d in docs:
        length = sum(d.values())
        score = 0.0
        for w in q:
            tf = d.get(w, 0)
            if not tf:
                continue
            idf = math.log(1 + (n - df[w] + 0.5) / (df[w] + 0.5))
            score += idf * tf * (k1 + 1) / (tf + k1 * (1 - b + b * length / avg))
        scores.append(score)
    return scores


def cosine(a: Sequence[float], b: Sequence[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=False))
    na = math.sqrt(sum(x * x for x in a))
    nb = math.sqrt(sum(y * y for y in b))
    return dot / (na * nb) if na and nb else 0.0


async def embed_texts(embed: Callable[..., Any], texts: list[str]) -> list[list[float]]:
    """Call a sync or async embedding function; check what it returns."""
    out = embed(texts)
    if inspect.isawaitable(out):
        out = await out
    vectors = [list(map(float, v)) for v in out]
    if len(vectors) != len(texts):
        raise ValueError(
            f"the embedding function returned {len(vectors)} vectors for {len(texts)} texts"
        )
    return vectors


def snippet(text: str, query: str, width: int = 240) -> str:
    """The part of `text` around the first query word it contains."""
    if len(text) <= width:
        return text
    lowered = text.lower()
    starts = [lowered.find(w) for w in words(query)]
    hits = [s for s in starts if s >= 0]
    start = max(0, min(hits) - width // 3) if hits else 0
    piece = text[start : start + width]
    return ("…" if start else "") + piece + ("…" if start + width < len(text) else "")
