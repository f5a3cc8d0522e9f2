"""`CollectionTool`: a read-only search tool over documents kept in a storage."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from criogen_graph._search import bm25, cosine, embed_texts, snippet
from criogen_graph.errors import ValidationError
from criogen_graph.memory import check_label
from criogen_graph.storage import Storage
from criogen_graph.tools import Tool, ToolArgumentsError, ToolContext, check_tool_name

__all__ = ["CollectionTool"]

_ROOT = ("criogen", "collections")


class CollectionTool(Tool):
    """A read-only tool that searches a collection of documents kept in `storage` (its
    LangGraph store), for the model; results cite document ids.

    Manage the documents from code: `await docs.add(id, text, metadata=...)`,
    `update(...)`, `remove(id)`, `get(id)`, `ids()`. The model calls the tool with
    `{"query": ..., "limit"?: ...}` and gets the best matches as `{"id", "score", "text"
    (a snippet around the match), "metadata"}`. Ranking is keyword (BM25) unless `embed`
    is given (a sync or async function from texts to vectors), then cosine similarity.
    Search reads the whole collection, so it suits collections of up to some thousands of
    documents; bigger corpora belong in a vector database behind a tool of your own.
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

    async def _value(self, text: str, metadata: Mapping[str, Any] | None) -> dict[str, Any]:
        if not isinstance(text, str) or not text.strip():
            raise ValidationError("a document needs non-empty text", code="invalid_value")
        value: dict[str, Any] = {
            "text": text,
            "metadata": dict(metadata or {}),
            "updated_ms": int(time.time() * 1000),
        }
        if self.embed is not None:
            value["embedding"] = (await embed_texts(self.embed, [text]))[0]
        return value

    @staticmethod
    def _check_id(doc_id: object) -> str:
        if not isinstance(doc_id, str) or not doc_id:
            raise ValidationError("a document id must be a non-empty str", code="invalid_value")
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
        await store.aput(self._ns, doc_id, await self._value(text, metadata), index=False)

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
        await store.aput(self._ns, doc_id, await self._value(new_text, new_meta), index=False)

    async def remove(self, doc_id: str) -> bool:
        """Delete a document; False if there was none."""
        store = await self.storage.get_store()
        if await store.aget(self._ns, self._check_id(doc_id)) is None:
            return False
        await store.adelete(self._ns, doc_id)
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
        docs = await self._documents()
        if not docs:
            return []
        if self.embed is not None and all("embedding" in v for _, v in docs):
            (q,) = await embed_texts(self.embed, [query])
            scores = [cosine(q, v["embedding"]) for _, v in docs]
        else:
            scores = bm25(query, [v["text"] for _, v in docs])
        ranked = sorted(zip(scores, docs, strict=True), key=lambda p: (-p[0], p[1][0]))
        return [
            {
                "id": doc_id,
                "score": round(score, 4),
                "text": snippet(value["text"], query, self.snippet_chars),
                "metadata": value.get("metadata", {}),
            }
            for score, (doc_id, value) in ranked[: limit or self.limit]
            if score > 0
        ]

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
