"""A LangGraph store whose values are sealed with the storage's cipher, so memory facts
and collection documents are encrypted at rest like checkpoints."""

from __future__ import annotations

import base64
from collections.abc import Iterable
from typing import Any

from langgraph.checkpoint.serde.base import SerializerProtocol
from langgraph.store.base import BaseStore, GetOp, Item, Op, PutOp, Result, SearchOp


class SealedStore(BaseStore):
    """Wraps a store: values are put as `{"sealed": ...}` and opened on the way back.
    Sealed values cannot be indexed or filtered by the store; criogen_graph ranks items
    itself, so it does not need either."""

    def __init__(self, inner: BaseStore, serde: SerializerProtocol) -> None:
        self.inner = inner
        self.serde = serde

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

    def batch(self, ops: Iterable[Op]) -> list[Result]:
        ops = list(ops)
        results = self.inner.batch([self._seal(op) for op in ops])
        return [self._open(op, r) for op, r in zip(ops, results, strict=True)]

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        ops = list(ops)
        results = await self.inner.abatch([self._seal(op) for op in ops])
        return [self._open(op, r) for op, r in zip(ops, results, strict=True)]

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)
