"""Long-term memory: facts kept in the storage's LangGraph store, recalled before each
model call, and tools for the model to remember, forget and search them."""

from __future__ import annotations

import hashlib
import math
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, TypedDict, Unpack

from criogen_graph.errors import ToolError, ValidationError
from criogen_graph.memory import fts as _fts
from criogen_graph.memory import vectors as _vectors
from criogen_graph.memory.search import check_storable, embed_texts, rank_vectors
from criogen_graph.tools import Tool, ToolArgumentsError, ToolContext

if TYPE_CHECKING:
    from criogen_graph.storage import Storage

__all__ = ["Memory", "MemoryOptions", "MemoryView"]

_ROOT = ("criogen", "memory")
#: The longest fact, in characters: every recalled fact goes into the model's
#: instructions, so a fact is a sentence or a paragraph, not a document (see
#: `CollectionTool` for those).
MAX_FACT_CHARS = 10_000
#: A pool's key as the label itself (where every version stored string keys), or encoded.
_PLAIN, _ENCODED = "by", "keyed"
#: The longest label kept as it is (UTF-8 bytes): PostgreSQL's index on a store's
#: namespaces takes entries up to ~2.7 KB; a longer encoded key is replaced by its hash.
_MAX_LABEL = 1024


def check_label(value: str, what: str) -> str:
    """`value` if a LangGraph store accepts it as a namespace label, else a
    `ValidationError` naming `what` it is."""
    if "." in value or "\x00" in value:
        raise ValidationError(
            f"{what} {value!r} must not contain '.' or NUL (LangGraph store namespaces "
            "cannot hold them)",
            code="invalid_value",
        )
    return value


def _escape(text: str) -> str:
    # Percent-encoding of what a label cannot hold (and of lone surrogates, which no
    # database text can hold); '%' is escaped too, so decoding is unique.
    out: list[str] = []
    for ch in text:
        code = ord(ch)
        if ch in "%.\x00":
            out.append(f"%{code:02X}")
        elif 0xD800 <= code <= 0xDFFF:
            out.append(f"%u{code:04X}")
        else:
            out.append(ch)
    return "".join(out)


def _plain(value: str) -> bool:
    if not value or "." in value or "\x00" in value:
        return False
    try:
        return len(value.encode("utf-8")) <= _MAX_LABEL
    except UnicodeEncodeError:  # a lone surrogate
        return False


def key_labels(value: str | int | float) -> tuple[str, str]:
    """Where the pool of a state key value lives: `("by", value)` for a string that is
    a valid label (the place every version kept string keys, so their facts stay
    readable), else `("keyed", "<type>:<escaped value>")`, so `0`, `"0"`, `0.0` and
    `False` are different pools; an encoded label longer than 1 KB becomes
    `"h:<sha256>"`. Injective (but for SHA-256 collisions)."""
    if isinstance(value, str) and _plain(value):
        return _PLAIN, value
    if isinstance(value, bool):
        label = f"b:{value}"
    elif isinstance(value, int):
        label = f"i:{int(value)}"
    elif isinstance(value, float):
        label = "f:" + _escape(repr(float(value)))
    else:
        label = "s:" + _escape(str.__str__(value))
    if len(label.encode("utf-8")) > _MAX_LABEL:
        label = "h:" + hashlib.sha256(label.encode("utf-8")).hexdigest()
    return _ENCODED, label


class MemoryOptions(TypedDict, total=False):
    """The options both `Memory` constructors take besides the scope (see `Memory`)."""

    recall: int
    tools: bool
    embed: Callable[[list[str]], Any] | None
    max_facts: int


class Memory:
    """Facts an agent keeps between conversations, in its storage's LangGraph store.

    `Memory.by_state(key)` keeps one pool of facts per value of `state[key]` (per user,
    say): a run sees and changes only the pool of its own `state[key]`, and a run whose
    state lacks the key fails with `ValidationError` before any model call.
    `Memory.shared(namespace)` is one pool for every run.

    Before each model call the `recall` most relevant facts (to the latest user message)
    are given to the model in a system message, not saved in the transcript; if fewer
    match, the most recent facts fill the rest. Relevance is keyword ranking in the
    database's full-text index (FTS5 BM25 on SQLite and memory://, `ts_rank` on
    PostgreSQL) unless `embed` is given: a function (sync or async) from a list of texts
    to their vectors, for semantic (cosine) ranking. Unless `tools=False`, the model also
    gets the tools `remember(fact)`, `forget(fact_id)` and `search_memory(query)`. A pool
    keeps at most `max_facts` facts (the oldest go first).
    """

    def __init__(
        self,
        *,
        key: str | None,
        namespace: str,
        recall: int = 5,
        tools: bool = True,
        embed: Callable[[list[str]], Any] | None = None,
        max_facts: int = 1000,
    ) -> None:
        if key is not None and (not isinstance(key, str) or not key):
            raise TypeError("Memory.by_state needs the name of a state key (a str)")
        if not isinstance(namespace, str) or not namespace:
            raise TypeError("a memory namespace must be a non-empty str")
        if isinstance(recall, bool) or not isinstance(recall, int) or recall < 0:
            raise ValidationError("recall must be an int >= 0", code="invalid_value")
        if isinstance(max_facts, bool) or not isinstance(max_facts, int) or max_facts < 1:
            raise ValidationError("max_facts must be an int >= 1", code="invalid_value")
        if embed is not None and not callable(embed):
            raise TypeError("embed must be a function from a list of texts to vectors")
        check_label(namespace, "a memory namespace")
        if key is not None:
            check_label(key, "the state key of Memory.by_state")
        self.key = key
        self.namespace = namespace
        self.recall = recall
        self.tools_enabled = bool(tools)
        self.embed = embed
        self.max_facts = max_facts

    @classmethod
    def by_state(
        cls, key: str, *, namespace: str = "facts", **options: Unpack[MemoryOptions]
    ) -> Memory:
        """One pool of facts per value of `state[key]` (e.g. `Memory.by_state("user_id")`):
        any `str` (an e-mail address too), `int`, `float` or `bool`, each value (and
        type: `0` is not `"0"`) a pool of its own; see `pool`."""
        return cls(key=key, namespace=namespace, **options)

    @classmethod
    def shared(cls, namespace: str = "shared", **options: Unpack[MemoryOptions]) -> Memory:
        """One pool of facts for every run of the agents that use it."""
        return cls(key=None, namespace=namespace, **options)

    def __repr__(self) -> str:
        scope = f"by_state({self.key!r})" if self.key else "shared"
        return f"Memory.{scope} namespace={self.namespace!r}"

    # -- scope ---------------------------------------------------------------------------

    def pool(self, state: Mapping[str, Any] | None) -> tuple[str, ...]:
        """The store namespace of the facts a run with `state` may see.

        Any `str` (an e-mail address, text with `.`, `%` or NUL, any length), `int`,
        `float` or `bool` scopes a pool of its own: values of different types never
        share one (`0`, `"0"`, `0.0` and `False` are four pools). A missing or empty
        value raises `ValidationError` (code `"missing"`), so runs that lack a user
        never pool together; NaN (not equal to itself) and other types are refused."""
        if self.key is None:
            return (*_ROOT, self.namespace, "shared")
        value = (state or {}).get(self.key)
        if value is None or (isinstance(value, str) and not value):
            raise ValidationError(
                f"this agent's memory is kept per state[{self.key!r}], and the run's state "
                f"has no {self.key!r}: pass state={{{self.key!r}: ...}}",
                code="missing",
            )
        if not isinstance(value, str | int | float):
            raise ValidationError(
                f"state[{self.key!r}] must be a str, an int, a float or a bool to scope "
                f"memory, got {type(value).__name__}",
                code="invalid_type",
            )
        if isinstance(value, float) and math.isnan(value):
            raise ValidationError(
                f"state[{self.key!r}] is NaN, which is not equal to itself: it cannot name a "
                "pool of facts",
                code="invalid_value",
            )
        region, label = key_labels(value)
        return (*_ROOT, self.namespace, region, self.key, label)

    # -- operations on one pool ----------------------------------------------------------

    async def facts(self, store: Any, pool: tuple[str, ...]) -> list[dict[str, Any]]:
        """Every fact of the pool, newest first: `{"id", "text", "created_ms", ...}`."""
        items = await store.asearch(pool, limit=self.max_facts + 50)
        out = [
            {"id": i.key, **i.value}
            for i in items
            if i.namespace == pool and isinstance(i.value, dict) and "text" in i.value
        ]
        # Facts made in the same millisecond keep their order by the nanosecond stamp.
        out.sort(
            key=lambda f: f.get("created_ns", f.get("created_ms", 0) * 1_000_000), reverse=True
        )
        return out

    async def remember(
        self,
        store: Any,
        pool: tuple[str, ...],
        text: str,
        *,
        source: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Save a fact; returns it (with its `id`)."""
        text = text.strip()
        if not text:
            raise ValidationError("a fact must not be empty", code="invalid_value")
        check_storable(text, "a fact", max_chars=MAX_FACT_CHARS)
        if source:
            check_storable(dict(source), "a fact's source")
        ns = time.time_ns()
        fact: dict[str, Any] = {"text": text, "created_ms": ns // 1_000_000, "created_ns": ns}
        if source:
            fact["source"] = dict(source)
        if self.embed is not None:
            fact["embedding"] = (await embed_texts(self.embed, [text]))[0]
            await _vectors.prepare(store, len(fact["embedding"]))
        fact_id = "fact_" + uuid.uuid4().hex[:16]
        await store.aput(pool, fact_id, fact, index=False)
        existing = await self.facts(store, pool)
        for old in existing[self.max_facts :]:
            await store.adelete(pool, old["id"])
        return {"id": fact_id, **fact}

    async def forget(self, store: Any, pool: tuple[str, ...], fact_id: str) -> bool:
        """Delete a fact of this pool; False when the pool has no such fact."""
        if await store.aget(pool, fact_id) is None:
            return False
        await store.adelete(pool, fact_id)
        return True

    async def search(
        self, store: Any, pool: tuple[str, ...], query: str, *, limit: int, fill: bool = False
    ) -> list[dict[str, Any]]:
        """The `limit` facts most relevant to `query` (with `fill`, the most recent ones
        complete the list when fewer match): keyword search in the database's index
        (see `CollectionTool`), or cosine similarity with `embed`: in the database with
        pgvector on PostgreSQL, else in a worker thread (keyword search when some fact
        of the pool has no vector)."""
        if limit <= 0:
            return []
        chosen: list[dict[str, Any]] | None = None
        facts: list[dict[str, Any]] | None = None
        if self.embed is not None and query.strip():
            chosen, facts = await self._by_vectors(store, pool, query, limit)
        if chosen is None:
            found = await _fts.search(
                store, pool, query, limit, max_items=self.max_facts + 50, keep_local=False
            )
            chosen = [{"id": key, **value} for key, _, value in found]
        if fill and len(chosen) < limit:
            ids = {f["id"] for f in chosen}
            recent = facts if facts is not None else await self.facts(store, pool)
            chosen += [f for f in recent if f["id"] not in ids][: limit - len(chosen)]
        return [_public(f) for f in chosen]

    async def _by_vectors(
        self, store: Any, pool: tuple[str, ...], query: str, limit: int
    ) -> tuple[list[dict[str, Any]] | None, list[dict[str, Any]] | None]:
        """The facts ranked by cosine similarity (None: some fact has no vector), and
        the pool's facts when they were loaded to rank them."""
        embed = self.embed
        assert embed is not None

        async def embed_query(dim: int) -> list[float]:
            (q,) = await embed_texts(embed, [query[: _fts.MAX_QUERY_CHARS]], dimension=dim)
            return q

        ranked = await _vectors.search(store, pool, embed_query, limit)
        if isinstance(ranked, list):
            return [{"id": key, **value} for key, _, value in ranked], None
        if ranked is _vectors.Unranked.KEYWORDS:
            return None, None
        facts = await self.facts(store, pool)
        vectors = [(f["id"], f["embedding"]) for f in facts if "embedding" in f]
        if not facts or len(vectors) != len(facts):
            return None, None
        q = await embed_query(len(vectors[0][1]))
        by_id = {f["id"]: f for f in facts}
        return [by_id[k] for k, _ in await rank_vectors(q, vectors, limit)], facts

    async def recall_message(
        self, store: Any, state: Mapping[str, Any], messages: list[dict[str, Any]]
    ) -> dict[str, Any] | None:
        """The system message of recalled facts for a model call, or None."""
        if self.recall <= 0:
            return None
        query = next(
            (m.get("content") or "" for m in reversed(messages) if m.get("role") == "user"), ""
        )
        facts = await self.search(store, self.pool(state), str(query), limit=self.recall, fill=True)
        if not facts:
            return None
        lines = "\n".join(f"- [{f['id']}] {f['text']}" for f in facts)
        return {
            "role": "system",
            "content": "Facts from your long-term memory (ids in brackets; relevant ones "
            f"first):\n{lines}",
        }

    def make_tools(self) -> list[Tool]:
        """The memory tools the model gets (none with `tools=False`)."""
        if not self.tools_enabled:
            return []
        return [_MemoryTool(self, *spec) for spec in _TOOLS]


def _public(fact: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in fact.items() if k not in ("embedding", "created_ns")}


def _store_or_fail() -> Any:
    from langgraph.config import get_store

    store = get_store()
    if store is None:
        raise ToolError("long-term memory is not available in this run (no store)")
    return store


async def _remember(
    memory: Memory, store: Any, pool: tuple[str, ...], fact: str, ctx: ToolContext
) -> Any:
    try:
        # The model's own text: what is wrong with it is for the model to read and fix.
        check_storable(fact.strip(), "the fact", max_chars=MAX_FACT_CHARS)
    except ValidationError as exc:
        raise ToolError(exc.message) from None
    saved = await memory.remember(
        store, pool, fact, source={"run_id": ctx.run_id, "thread_id": ctx.thread_id}
    )
    return f"Remembered [{saved['id']}]: {saved['text']}"


async def _forget(
    memory: Memory, store: Any, pool: tuple[str, ...], fact_id: str, ctx: ToolContext
) -> Any:
    fact_id = fact_id.strip().strip("[]")
    if not await memory.forget(store, pool, fact_id):
        raise ToolError(f"there is no fact {fact_id} in memory")
    return f"Forgot [{fact_id}]"


async def _search(
    memory: Memory, store: Any, pool: tuple[str, ...], query: str, ctx: ToolContext
) -> Any:
    facts = await memory.search(store, pool, query, limit=10)
    return [{"id": f["id"], "fact": f["text"]} for f in facts] or "No matching facts."


#: What a memory tool does with its one argument.
_Act = Callable[["Memory", Any, tuple[str, ...], str, ToolContext], Awaitable[Any]]

#: The memory tools: name, description, argument, the argument's description, what the
#: tool does, and whether it only reads.
_TOOLS: tuple[tuple[str, str, str, str, _Act, bool], ...] = (
    (
        "remember",
        "Save a fact to long-term memory so it can be recalled in later conversations "
        "(for example a preference or a detail the user shared). One fact per call.",
        "fact",
        "The fact, as a short self-contained sentence.",
        _remember,
        False,
    ),
    (
        "forget",
        "Delete a fact from long-term memory, by the id shown in brackets.",
        "fact_id",
        "The id of the fact, e.g. fact_0123abcd.",
        _forget,
        False,
    ),
    (
        "search_memory",
        "Search long-term memory for facts about something.",
        "query",
        "What to look for.",
        _search,
        True,
    ),
)


class _MemoryTool(Tool):
    """A memory tool of `_TOOLS`: one non-empty string argument, `act` on the run's pool."""

    def __init__(
        self,
        memory: Memory,
        name: str,
        description: str,
        field: str,
        what: str,
        act: _Act,
        read_only: bool,
    ) -> None:
        super().__init__(
            name,
            description,
            {
                "type": "object",
                "properties": {field: {"type": "string", "description": what}},
                "required": [field],
                "additionalProperties": False,
            },
            read_only=read_only,
        )
        self.memory = memory
        self.field = field
        self.act = act

    def validate(self, args: Mapping[str, Any]) -> Any:
        value = args.get(self.field)
        if set(args) != {self.field} or not isinstance(value, str) or not value.strip():
            raise ToolArgumentsError(
                f"takes exactly one argument, {self.field} (a non-empty string)"
            )
        return {self.field: value}

    async def run(self, args: Any, ctx: ToolContext) -> Any:
        store = _store_or_fail()
        return await self.act(
            self.memory, store, self.memory.pool(ctx.state), args[self.field], ctx
        )


class MemoryView:
    """An agent's memory, to read and change from code: `agent.memory.remember(...)`.

    Every method takes the run `state` that scopes the pool (for `Memory.by_state`)."""

    def __init__(self, memory: Memory, storage: Storage) -> None:
        self.memory = memory
        self.storage = storage

    async def _pool(self, state: Mapping[str, Any] | None) -> tuple[Any, tuple[str, ...]]:
        return await self.storage.get_store(), self.memory.pool(state)

    async def remember(
        self, fact: str, *, state: Mapping[str, Any] | None = None
    ) -> dict[str, Any]:
        """Save a fact; returns `{"id", "text", "created_ms"}`."""
        store, pool = await self._pool(state)
        saved = await self.memory.remember(store, pool, fact)
        return _public(saved)

    async def forget(self, fact_id: str, *, state: Mapping[str, Any] | None = None) -> bool:
        """Delete a fact; False if the pool has no such fact."""
        store, pool = await self._pool(state)
        return await self.memory.forget(store, pool, fact_id)

    async def search(
        self, query: str, *, state: Mapping[str, Any] | None = None, limit: int = 5
    ) -> list[dict[str, Any]]:
        """The facts most relevant to `query`."""
        store, pool = await self._pool(state)
        return await self.memory.search(store, pool, query, limit=limit)

    async def facts(self, *, state: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
        """Every fact of the pool, newest first."""
        store, pool = await self._pool(state)
        return [_public(f) for f in await self.memory.facts(store, pool)]

    async def clear(self, *, state: Mapping[str, Any] | None = None) -> int:
        """Delete every fact of the pool; returns how many."""
        store, pool = await self._pool(state)
        facts = await self.memory.facts(store, pool)
        for f in facts:
            await store.adelete(pool, f["id"])
        return len(facts)
