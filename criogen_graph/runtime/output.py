"""Typed output: a JSON Schema dict or a Pydantic model class, parsed from the answer."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

import pydantic

_FENCE_RE = re.compile(r"^\s*```(?:json)?\s*(.*?)\s*```\s*$", re.DOTALL)


class OutputSpec:
    """How the final answer is checked and handed to the user."""

    __slots__ = ("_validator", "model_cls", "schema")

    def __init__(self, output: Any) -> None:
        self.model_cls: type[pydantic.BaseModel] | None = None
        self._validator: Any = None
        if isinstance(output, type) and issubclass(output, pydantic.BaseModel):
            self.model_cls = output
            self.schema: dict[str, Any] = output.model_json_schema()
        elif isinstance(output, Mapping):
            self.schema = json.loads(json.dumps(output))
            import jsonschema

            cls = jsonschema.validators.validator_for(self.schema)
            try:
                cls.check_schema(self.schema)
            except jsonschema.SchemaError as exc:
                from criogen_graph.errors import ValidationError

                raise ValidationError(
                    f"output is not a valid JSON Schema: {exc.message}", code="invalid_value"
                ) from None
            self._validator = cls(self.schema)
        else:
            raise TypeError(
                f"output must be a JSON Schema dict or a Pydantic model class, got {output!r}"
            )

    def parse(self, text: str) -> tuple[Any, str | None]:
        """`(json_value, None)` for a valid answer, `(None, problem)` otherwise. The value
        is plain JSON so it can be saved in a checkpoint."""
        m = _FENCE_RE.match(text)
        if m:
            text = m.group(1)
        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            return None, f"the answer is not JSON ({exc.msg} at position {exc.pos})"
        if self.model_cls is not None:
            try:
                obj = self.model_cls.model_validate(value)
            except pydantic.ValidationError as exc:
                errs = exc.errors(include_url=False)[:5]
                return None, "; ".join(
                    f"{'.'.join(str(p) for p in e.get('loc', ())) or '(root)'}: {e.get('msg')}"
                    for e in errs
                )
            return obj.model_dump(mode="json"), None
        errors = sorted(self._validator.iter_errors(value), key=lambda e: list(e.path))
        if errors:
            return None, "; ".join(
                f"{'.'.join(str(p) for p in e.path) or '(root)'}: {e.message}" for e in errors[:5]
            )
        return value, None

    def to_user(self, value: Any) -> Any:
        """The saved JSON value as the user gets it (a model instance for a class)."""
        if value is None or self.model_cls is None:
            return value
        return self.model_cls.model_validate(value)

    def correction(self, problem: str) -> str:
        return (
            "Your answer does not match the required output schema: "
            f"{problem}. Answer again with JSON only, matching the schema."
        )
