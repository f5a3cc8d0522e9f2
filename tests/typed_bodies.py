"""Check a JSON request body against an official SDK's typed request model (a TypedDict):
pydantic validates the types, and a walk of the TypedDicts rejects keys they do not have."""

from __future__ import annotations

import types
import typing
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NotRequired, Required

import pydantic
from typing_extensions import ReadOnly, is_typeddict

_WRAPPERS = (Required, NotRequired, ReadOnly, typing.Annotated)


def _unwrap(tp: Any) -> Any:
    while typing.get_origin(tp) in _WRAPPERS:
        tp = typing.get_args(tp)[0]
    return tp


def _problems(value: Any, tp: Any, path: str) -> list[str]:
    tp = _unwrap(tp)
    origin = typing.get_origin(tp)
    if is_typeddict(tp):
        if not isinstance(value, Mapping):
            return [f"{path}: expected an object"]
        hints = typing.get_type_hints(tp, include_extras=True)
        out = [f"{path}: unknown key {k!r}" for k in value if k not in hints]
        for k, v in value.items():
            if k in hints:
                out += _problems(v, hints[k], f"{path}.{k}")
        return out
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in typing.get_args(tp):
            return []
        arms = [a for a in typing.get_args(tp) if a is not type(None)]
        found: list[str] = []
        for arm in arms:
            try:
                pydantic.TypeAdapter(arm).validate_python(value)
            except pydantic.ValidationError as exc:
                found.append(f"{path}: {exc.errors()[0]['msg']}")
                continue
            problems = _problems(value, arm, path)
            if not problems:
                return []
            found += problems
        return found[:3]
    if origin in (list, Iterable, Sequence, typing.Iterable) and isinstance(value, list):
        (item,) = typing.get_args(tp) or (Any,)
        out = []
        for i, v in enumerate(value):
            out += _problems(v, item, f"{path}[{i}]")
        return out
    return []


def assert_request(body: Mapping[str, Any], typed_dict: Any) -> None:
    pydantic.TypeAdapter(typed_dict).validate_python(body)
    problems = _problems(body, typed_dict, "body")
    assert not problems, problems


def assert_gemini_request(body: Mapping[str, Any]) -> None:
    """Check a Gemini `generateContent` JSON body against the google-genai SDK's typed
    models (pydantic, camelCase aliases, unknown keys rejected at every depth)."""
    from google.genai import types

    fields: dict[str, Any] = {
        "contents": list[types.Content],
        "tools": list[types.Tool],
        "systemInstruction": types.Content,
        "generationConfig": types.GenerationConfig,
        "safetySettings": list[types.SafetySetting],
        "toolConfig": types.ToolConfig,
        "cachedContent": str,
    }
    unknown = sorted(set(body) - set(fields))
    assert not unknown, f"body: unknown keys {unknown}"
    assert body.get("contents"), "body: contents must not be empty"
    for key, value in body.items():
        pydantic.TypeAdapter(fields[key]).validate_python(value)
