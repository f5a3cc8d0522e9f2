"""Helpers of memory recall and collection search: words, snippets, and embeddings
(calling the user's function, checking its vectors, ranking by cosine similarity in a
worker thread where the database cannot: see `vectors` for pgvector on PostgreSQL).
Keyword search is an index in the database: see `fts`."""

from __future__ import annotations

import asyncio
import heapq
import inspect
import math
import re
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from criogen_graph.errors import ValidationError

Embed = Callable[[list[str]], "list[list[float]] | Awaitable[list[list[float]]]"]

_WORD = re.compile(r"[\w']+", re.UNICODE)
STOP_WORDS = frozenset(
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


_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def check_storable(value: Any, what: str, *, max_chars: int | None = None) -> None:
    """`ValidationError` naming `what` (and where inside it) if `value`, a text or a JSON
    value of dicts and lists, holds what a storage cannot keep or a search cannot read:
    a NUL character (PostgreSQL text and JSON cannot hold one), a lone surrogate (not
    Unicode: no UTF-8 database takes it), a number that is not finite (JSON has no NaN
    or infinity). `max_chars` bounds the length of a text `value`."""
    if max_chars is not None and isinstance(value, str) and len(value) > max_chars:
        raise ValidationError(
            f"{what} is {len(value):,} characters long; at most {max_chars:,} are kept: "
            "split it into smaller pieces",
            code="invalid_value",
        )
    _check_storable(value, what)


def _check_storable(value: Any, where: str) -> None:
    if isinstance(value, str):
        bad = _UNSTORABLE.search(value)
        if bad is None:
            return
        ch = bad.group()
        at = f"at character {bad.start():,}"
        if ch == "\x00":
            raise ValidationError(
                f"{where} holds a NUL character (\\x00) {at}, which a storage cannot keep: "
                "remove it",
                code="invalid_value",
            )
        raise ValidationError(
            f"{where} holds a lone surrogate ({ch!r}) {at}, which is not valid Unicode "
            "(half of an emoji, or bytes decoded with errors='surrogateescape'): decode "
            "the text with errors='replace'",
            code="invalid_value",
        )
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValidationError(
                f"{where} holds {value!r}, a number that is not finite (JSON cannot keep "
                "it): use a finite number or None",
                code="invalid_value",
            )
    elif isinstance(value, dict):
        for k, v in value.items():
            _check_storable(k, f"a key of {where}")
            _check_storable(v, f"{where}[{k!r:.40}]")
    elif isinstance(value, list | tuple):
        for i, v in enumerate(value):
            _check_storable(v, f"{where}[{i}]")


def words(text: str) -> list[str]:
    """Lowercased words, without the commonest English ones."""
    return [w for w in _WORD.findall(text.lower()) if w not in STOP_WORDS]


def cosine(a: Sequence[float], b: Sequence[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=False))
    na = math.sqrt(sum(x * x for x in a))
    nb = math.sqrt(sum(y * y for y in b))
    return dot / (na * nb) if na and nb else 0.0


async def embed_texts(
    embed: Callable[..., Any], texts: list[str], *, dimension: int | None = None
) -> list[list[float]]:
    """Call a sync or async embedding function (a sync one in a worker thread: a model
    must not hold the event loop); check what it returns: one vector per text, all of
    one dimension (`dimension`, when given: that of the vectors already stored)."""
    if inspect.iscoroutinefunction(embed):
        out = await embed(texts)
    else:
        out = await asyncio.to_thread(embed, texts)
        if inspect.isawaitable(out):
            out = await out
    try:
        vectors = [[float(x) for x in v] for v in out]
    except (TypeError, ValueError) as exc:
        raise ValidationError(
            f"the embedding function {_name(embed)} must return a list of vectors (lists "
            f"of numbers), one per text: {exc}",
            code="invalid_type",
        ) from None
    for i, v in enumerate(vectors):
        bad = next((x for x in v if not math.isfinite(x)), None)
        if bad is not None:
            raise ValidationError(
                f"the embedding function {_name(embed)} returned a vector holding {bad!r} "
                f"(for text {i}): every number of an embedding must be finite",
                code="invalid_value",
            )
    if len(vectors) != len(texts):
        raise ValidationError(
            f"the embedding function {_name(embed)} returned {len(vectors)} vectors for "
            f"{len(texts)} texts",
            code="invalid_value",
        )
    dims = {len(v) for v in vectors}
    if dimension is not None:
        dims.add(dimension)
    if len(dims) > 1 or 0 in dims:
        got = sorted({len(v) for v in vectors})
        raise ValidationError(
            f"the embedding function {_name(embed)} returned vectors of dimension "
            f"{', '.join(map(str, got))}"
            + (
                f", but the vectors stored are of dimension {dimension}: use the embedding "
                "function (the model) they were made with, or a new collection or namespace"
                if dimension is not None
                else ": every vector must have the same, non-zero dimension"
            ),
            code="invalid_value",
        )
    return vectors


def _name(fn: Callable[..., Any]) -> str:
    return repr(getattr(fn, "__qualname__", None) or type(fn).__name__)


def _rank(
    query: Sequence[float], items: Sequence[tuple[str, Sequence[float]]], limit: int
) -> list[tuple[str, float]]:
    scored = ((cosine(query, vec), key) for key, vec in items)
    best = heapq.nsmallest(limit, scored, key=lambda p: (-p[0], p[1]))
    return [(key, score) for score, key in best if score > 0]


async def rank_vectors(
    query: Sequence[float], items: Sequence[tuple[str, Sequence[float]]], limit: int
) -> list[tuple[str, float]]:
    """The `limit` keys whose vectors are most similar to `query` (cosine, > 0), best
    first, computed in a worker thread."""
    return await asyncio.to_thread(_rank, query, items, limit)


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
