"""`CollectionTool`: a read-only search tool over documents kept in a storage."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from criogen_graph.errors import ValidationError
from criogen_graph.memory import check_label
from criogen_graph.memory import fts as _fts
from criogen_graph.memory import vectors as _vectors
from criogen_graph.memory.search import check_storable, embed_texts, rank_vectors, snippet
from criogen_graph.storage import Storage
from criogen_graph.tools import Tool, ToolArgumentsError, ToolContext, check_tool_name

__all__ = ["CollectionTool"]

_ROOT = ("criogen", "collections")
#: The longest text a document may have, in characters: split longer ones (search finds
#: and cites the pieces, and a snippet is cut from the matching one).
MAX_DOCUMENT_CHARS = 1_000_000


class CollectionTool(Tool):
    """A read-only tool that searches a collection of documents kept in `storage` (its
    LangGraph store), for the model; results cite document ids.

    Manage the documents from code: `await docs.add(id, text, metadata=...)`,
    `update(...)`, `remove(id)`, `get(id)`, `ids()`. The model calls the tool with
    `{"query": ..., "limit"?: ...}` and gets the best matches as `{"id", "score", "text"
    (a snippet around the match), "metadata"}`.

    Search is keyword search in an index of the database: SQLite FTS5 (porter stemming)
    on `sqlite:`, PostgreSQL full-text search (`english` configuration) on `postgres:`,
    an in-process FTS5 index on `memory://`; words match in any form ("refund" finds
    "Refunds are possible…"), ranked by BM25 (SQLite) or `ts_rank` (PostgreSQL). Only
    the first 10,000 characters and 64 distinct words of a query count; operator
    characters are read as text. With `embed` (a sync or async function from a list of
    texts to vectors) ranking is by cosine similarity instead (scores > 0, best first):
    on `postgres:` with the pgvector extension, in the database over every document (an
    exact scan of a collection of up to 5,000 vectors, an HNSW index beyond); elsewhere
    (SQLite, memory://, a server without pgvector) in a worker thread over at most
    `max_documents` documents. Every vector of a collection must have one dimension; a
    collection with a document lacking a vector is searched by keywords. On an encrypted
    storage the database holds no readable text or vector, so each search indexes or
    ranks up to `max_documents` documents in a worker thread.
    """

    def __init__(
        self,
        name: str = "search_documents",
        description: str | None = None,
        *,
        storage: Storage | str,
        collection: str | None = None,
        limit: int = 5,
        embed: Callable[[list[str]], Any] | None = None,
        snippet_chars: int = 400,
        max_documents: int = 10_000,
    ) -> None:
        check_tool_name(name)
        if isinstance(storage, str):
            storage = Storage(storage)
        elif not isinstance(storage, Storage):
            raise TypeError(f"storage must be a Storage or a URL, got {storage!r}")
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ValidationError("limit must be an int >= 1", code="invalid_value")
        if embed is not None and not callable(embed):
            raise TypeError("embed must be a function from a list of texts to vectors")
        if collection is not None and not isinstance(collection, str):
            raise TypeError(f"collection must be a str, got {type(collection).__name__}")
        self.collection = check_label(collection or name, "a collection name")
        super().__init__(
            name,
            description
            or f"Search the {self.collection} documents; results cite each document's id.",
            {
                "type": "object",
                "properties": {
                    "query": {"type": "string", "description": "What to look for."},
                    "limit": {
                        "type": "integer",
                        "minimum": 1,
                        "maximum": 50,
                        "description": f"How many results (default {limit}).",
                    },
                },
                "required": ["query"],
                "additionalProperties": False,
            },
            read_only=True,
        )
        self.storage = storage
        self.limit = limit
        self.embed = embed
        self.snippet_chars = snippet_chars
        self.max_documents = max_documents
        self._ns = (*_ROOT, self.collection)

    # -- managing documents ------------------------------------------------------------------

    async def _dimension(self, store: Any, skip: str | None = None) -> int | None:
        """The dimension of the embeddings the collection holds, or None."""
        for item in await store.asearch(self._ns, limit=2):
            vec = item.value.get("embedding") if isinstance(item.value, dict) else None
            if item.key != skip and isinstance(vec, list):
                return len(vec)
        return None

    async def _value(
        self, text: str, metadata: Mapping[str, Any] | None, store: Any, doc_id: str
    ) -> dict[str, Any]:
        if not isinstance(text, str) or not text.strip():
            raise ValidationError("a document needs non-empty text", code="invalid_value")
        check_storable(text, f"the text of document {doc_id!r}", max_chars=MAX_DOCUMENT_CHARS)
        if metadata is not None and not isinstance(metadata, Mapping):
            raise TypeError(f"metadata must be a dict, got {type(metadata).__name__}")
        check_storable(dict(metadata or {}), f"the metadata of document {doc_id!r}")
        # The index set up (or upgraded) before the write its trigger is part of.
        await _fts.ensure_index(store)
        value: dict[str, Any] = {
            "text": text,
            "metadata": dict(metadata or {}),
            "updated_ms": int(time.time() * 1000),
        }
        if self.embed is not None:
            dim = await self._dimension(store, skip=doc_id)
            value["embedding"] = (await embed_texts(self.embed, [text], dimension=dim))[0]
            await _vectors.prepare(store, len(value["embedding"]))
        return value

    @staticmethod
    def _check_id(doc_id: object) -> str:
        if not isinstance(doc_id, str) or not doc_id:
            raise ValidationError("a document id must be a non-empty str", code="invalid_value")
        check_storable(doc_id, "a document id")
        return doc_id

    async def add(
        self, doc_id: str, text: str, *, metadata: Mapping[str, Any] | None = None
    ) -> None:
        """Add a document; `ValidationError` if the id is taken (see `update`)."""
        store = await self.storage.get_store()
        if await store.aget(self._ns, self._check_id(doc_id)) is not None:
            raise ValidationError(
                f"collection {self.collection!r} already has a document {doc_id!r}; use update()",
                code="invalid_value",
            )
        value = await self._value(text, metadata, store, doc_id)
        await store.aput(self._ns, doc_id, value, index=False)
        await _fts.noted(store, self._ns, doc_id, value["text"])

    async def update(
        self, doc_id: str, text: str | None = None, *, metadata: Mapping[str, Any] | None = None
    ) -> None:
        """Change a document's text and/or metadata; `ValidationError` if there is none."""
        store = await self.storage.get_store()
        item = await store.aget(self._ns, self._check_id(doc_id))
        if item is None:
            raise ValidationError(
                f"collection {self.collection!r} has no document {doc_id!r}; use add()",
                code="unknown",
            )
        new_text = item.value["text"] if text is None else text
        new_meta = item.value.get("metadata") if metadata is None else metadata
        value = await self._value(new_text, new_meta, store, doc_id)
        await store.aput(self._ns, doc_id, value, index=False)
        await _fts.noted(store, self._ns, doc_id, value["text"])

    async def remove(self, doc_id: str) -> bool:
        """Delete a document; False if there was none."""
        store = await self.storage.get_store()
        if await store.aget(self._ns, self._check_id(doc_id)) is None:
            return False
        await store.adelete(self._ns, doc_id)
        await _fts.noted(store, self._ns, doc_id, None)
        return True

    async def get(self, doc_id: str) -> dict[str, Any] | None:
        """`{"id", "text", "metadata"}`, or None."""
        store = await self.storage.get_store()
        item = await store.aget(self._ns, self._check_id(doc_id))
        if item is None:
            return None
        return {
            "id": doc_id,
            "text": item.value["text"],
            "metadata": item.value.get("metadata", {}),
        }

    async def _documents(self) -> list[tuple[str, dict[str, Any]]]:
        store = await self.storage.get_store()
        items = await store.asearch(self._ns, limit=self.max_documents)
        return [(i.key, i.value) for i in items if i.namespace == self._ns]

    async def ids(self) -> list[str]:
        """The ids of the documents, sorted."""
        return sorted(doc_id for doc_id, _ in await self._documents())

    async def search(self, query: str, *, limit: int | None = None) -> list[dict[str, Any]]:
        """What the tool returns for `query`: the best matches, best first."""
        if not isinstance(query, str) or not query.strip():
            raise ValidationError("a search query must be a non-empty str", code="invalid_value")
        count = limit or self.limit
        store = await self.storage.get_store()
        if self.embed is not None:
            embed = self.embed

            async def embed_query(dim: int) -> list[float]:
                (q,) = await embed_texts(embed, [query[: _fts.MAX_QUERY_CHARS]], dimension=dim)
                return q

            ranked: list[tuple[str, float, dict[str, Any]]] | _vectors.Unranked | None
            ranked = await _vectors.search(store, self._ns, embed_query, count)
            if ranked is _vectors.Unranked.THREAD:
                ranked = await self._rank_in_thread(embed_query, count)
            if isinstance(ranked, list):
                return [self._result(key, score, value, query) for key, score, value in ranked]
        found = await _fts.search(store, self._ns, query, count, max_items=self.max_documents)
        return [self._result(key, score, value, query) for key, score, value in found]

    async def _rank_in_thread(
        self, embed_query: Callable[[int], Awaitable[list[float]]], count: int
    ) -> list[tuple[str, float, dict[str, Any]]] | None:
        """Cosine ranking of up to `max_documents` documents in a worker thread; None when
        some document has no vector (keyword search then)."""
        docs = await self._documents()
        vectors = [(k, v["embedding"]) for k, v in docs if isinstance(v.get("embedding"), list)]
        if not vectors or len(vectors) != len(docs):
            return None
        q = await embed_query(len(vectors[0][1]))
        values = dict(docs)
        return [(key, score, values[key]) for key, score in await rank_vectors(q, vectors, count)]

    def _result(self, key: str, score: float, value: dict[str, Any], query: str) -> dict[str, Any]:
        return {
            "id": key,
            "score": round(score, 4),
            "text": snippet(value["text"], query[: _fts.MAX_QUERY_CHARS], self.snippet_chars),
            "metadata": value.get("metadata", {}),
        }

    # -- as a tool ---------------------------------------------------------------------------

    def validate(self, args: Mapping[str, Any]) -> Any:
        query = args.get("query")
        limit = args.get("limit", self.limit)
        if not isinstance(query, str) or not query.strip():
            raise ToolArgumentsError("query must be a non-empty string")
        if set(args) - {"query", "limit"}:
            raise ToolArgumentsError("takes only query and limit")
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 50:
            raise ToolArgumentsError("limit must be an integer from 1 to 50")
        return {"query": query, "limit": limit}

    async def run(self, args: Any, ctx: ToolContext) -> Any:
        results = await self.search(args["query"], limit=args["limit"])
        return results or f"No document of {self.collection!r} matches {args['query']!r}."
