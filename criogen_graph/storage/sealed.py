"""A LangGraph store whose values are sealed with the storage's cipher, so memory facts
and collection documents are encrypted at rest like checkpoints."""

from __future__ import annotations

import base64
import operator
from collections.abc import Callable, Iterable
from typing import Any

from langgraph.checkpoint.serde.base import SerializerProtocol
from langgraph.store.base import BaseStore, GetOp, Item, Op, PutOp, Result, SearchOp

#: The comparison operators of a store search's `filter` (LangGraph's documented set).
_OPERATORS: dict[str, Callable[[Any, Any], bool]] = {
    "$eq": operator.eq,
    "$ne": operator.ne,
    "$gt": operator.gt,
    "$gte": operator.ge,
    "$lt": operator.lt,
    "$lte": operator.le,
}
#: How many items a filtered search of a sealed store opens per page it reads.
_PAGE = 1000


def _matches(value: Any, wanted: Any) -> bool:
    """Whether a stored value meets one `filter` condition: a value to equal, a dict of
    operators, or (for a dict value) conditions on its keys."""
    if isinstance(wanted, dict) and wanted and all(k.startswith("$") for k in wanted):
        for op, operand in wanted.items():
            compare = _OPERATORS.get(op)
            if compare is None:
                raise ValueError(
                    f"unsupported filter operator {op!r}: use one of {list(_OPERATORS)}"
                )
            try:
                if not compare(value, operand):
                    return False
            except TypeError:
                return False
        return True
    if isinstance(wanted, dict):
        return isinstance(value, dict) and all(_matches(value.get(k), v) for k, v in wanted.items())
    return bool(value == wanted)


class SealedStore(BaseStore):
    """Wraps a store: values are put as `{"sealed": ...}` and opened on the way back.

    Sealed values cannot be indexed or filtered by the database, so a search with a
    `filter` is filtered here, on the opened values, and a search with a `query` (which
    needs the store's own embeddings) raises `NotImplementedError`: criogen_graph's
    memory and collections rank items themselves. TTLs are the inner store's."""

    def __init__(self, inner: BaseStore, serde: SerializerProtocol) -> None:
        self.inner = inner
        self.serde = serde
        self.supports_ttl = bool(inner.supports_ttl)

    def _seal(self, op: Op) -> Op:
        if isinstance(op, PutOp) and op.value is not None:
            typ, blob = self.serde.dumps_typed(dict(op.value))
            sealed = {"sealed": base64.b64encode(blob).decode(), "type": typ}
            return op._replace(value=sealed, index=False)
        return op

    def _open_item(self, item: Item) -> Item:
        value = item.value
        if isinstance(value, dict) and "sealed" in value:
            item.value = self.serde.loads_typed((value["type"], base64.b64decode(value["sealed"])))
        return item

    def _open(self, op: Op, result: Result) -> Result:
        if isinstance(op, GetOp) and isinstance(result, Item):
            return self._open_item(result)
        if isinstance(op, SearchOp) and isinstance(result, list):
            return [self._open_item(i) for i in result if isinstance(i, Item)]
        return result

    @staticmethod
    def _check(ops: list[Op]) -> None:
        for op in ops:
            if isinstance(op, SearchOp) and op.query:
                raise NotImplementedError(
                    "a store search with a `query` needs the store's own embeddings, which "
                    "an encrypted storage does not keep (its values are sealed): search "
                    "memory facts with `Memory` and documents with a collection's "
                    "`search()`, which rank them in the process, or search with a "
                    "`filter` only"
                )

    @staticmethod
    def _filtered(op: Op) -> bool:
        """A search the database cannot filter (the values it holds are sealed)."""
        return isinstance(op, SearchOp) and bool(op.filter)

    @staticmethod
    def _unfiltered(op: SearchOp, offset: int) -> SearchOp:
        return op._replace(filter=None, limit=_PAGE, offset=offset)

    @staticmethod
    def _select(op: SearchOp, items: list[Item]) -> list[Item]:
        kept = [i for i in items if _matches(i.value, op.filter or {})]
        return kept[op.offset : op.offset + op.limit]

    def batch(self, ops: Iterable[Op]) -> list[Result]:
        ops = list(ops)
        self._check(ops)
        direct = [op for op in ops if not self._filtered(op)]
        answers = iter(self.inner.batch([self._seal(op) for op in direct]))
        return [
            self._select(op, self._search_all(op))
            if isinstance(op, SearchOp) and self._filtered(op)
            else self._open(op, next(answers))
            for op in ops
        ]

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        ops = list(ops)
        self._check(ops)
        direct = [op for op in ops if not self._filtered(op)]
        answers = iter(await self.inner.abatch([self._seal(op) for op in direct]))
        results: list[Result] = []
        for op in ops:
            if isinstance(op, SearchOp) and self._filtered(op):
                results.append(self._select(op, await self._asearch_all(op)))
            else:
                results.append(self._open(op, next(answers)))
        return results

    def _search_all(self, op: SearchOp) -> list[Item]:
        items: list[Item] = []
        while True:
            page = self.inner.batch([self._unfiltered(op, len(items))])[0]
            assert isinstance(page, list)
            items += [self._open_item(i) for i in page if isinstance(i, Item)]
            if len(page) < _PAGE:
                return items

    async def _asearch_all(self, op: SearchOp) -> list[Item]:
        items: list[Item] = []
        while True:
            page = (await self.inner.abatch([self._unfiltered(op, len(items))]))[0]
            assert isinstance(page, list)
            items += [self._open_item(i) for i in page if isinstance(i, Item)]
            if len(page) < _PAGE:
                return items

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)
