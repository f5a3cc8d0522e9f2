"""Anthropic Messages API over HTTP (`POST /v1/messages`): Anthropic itself and any server
that speaks the same wire format through `base_url`."""

from __future__ import annotations

import json
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Unpack

from criogen_graph.errors import ModelError, ValidationError
from criogen_graph.messages import (
    AssistantMessage,
    Message,
    ModelStopReason,
    ToolCallData,
    ToolStatus,
    Usage,
)
from criogen_graph.models.base import ModelRequest, ModelResponse, TextSink
from criogen_graph.models.http import (
    OUTPUT_INSTRUCTION,
    HttpModel,
    HttpOptions,
    Turns,
    base_url_and_key,
    tokens,
    tool_call,
)
from criogen_graph.results import empty_usage

ANTHROPIC_URL = "https://api.anthropic.com"
API_VERSION = "2023-06-01"
_PATH = "/v1/messages"
#: Tool statuses the model is told were failures (`is_error`).
_FAILED: frozenset[ToolStatus] = frozenset({"error", "timeout", "rejected"})
#: Sent for a user turn with no text: the API rejects empty and whitespace-only text (and
#: a message without content), so `agent.run("")` would otherwise fail every time.
EMPTY_TEXT = "(empty)"
#: Reasoning blocks the API wants back, unchanged, on the next turn of a tool loop.
_REASONING_TYPES = frozenset({"thinking", "redacted_thinking"})


def _server_block(kind: object) -> bool:
    """Whether a block type is one of a server tool the API ran itself (web search, web
    fetch, code execution, tool search, MCP connector): its call (`server_tool_use`,
    `mcp_tool_use`), its result (`web_search_tool_result`, ...) or an upload. They
    are kept and go back unchanged, like thinking."""
    if not isinstance(kind, str) or kind == "tool_result":
        return False
    return kind in ("server_tool_use", "mcp_tool_use", "mcp_tool_result", "container_upload") or (
        kind.endswith("_tool_result")
    )


#: Stop reasons of an answer cut off by a token limit.
_CUT = frozenset({"max_tokens", "model_context_window_exceeded"})
#: How many times a turn the API paused (`pause_turn`) is continued before giving up.
_MAX_PAUSES = 8


@dataclass
class _Turn:
    """What one response of a (possibly paused) turn said."""

    texts: list[str] = field(default_factory=list)
    calls: list[ToolCallData] = field(default_factory=list)
    reasoning: list[dict[str, Any]] = field(default_factory=list)
    stop: Any = None
    usage: dict[str, Any] = field(default_factory=dict)
    #: its content blocks as they came, in order: what a continuation sends back
    blocks: list[Any] = field(default_factory=list)


def _as_text(content: Any) -> str:
    if content is None:
        return ""
    return content if isinstance(content, str) else json.dumps(content, default=str)


def to_anthropic_messages(messages: list[Message]) -> tuple[str, list[dict[str, Any]]]:
    """Transcript dicts as `(system, messages)` of the Messages API.

    System messages join into the top-level `system` string; tool results become
    `tool_result` blocks of a user message; consecutive messages of one role merge, so
    roles alternate as the API requires. Empty text is left out (the API rejects empty
    text blocks); an empty user message is sent as `EMPTY_TEXT`. An assistant turn's
    `reasoning_blocks` (thinking with its signature, redacted thinking) go first, as the
    API requires when thinking is combined with tools.
    """
    system: list[str] = []
    turns = Turns("content")
    add = turns.add
    for m in messages:
        text = _as_text(m.get("content"))
        if m["role"] == "system":
            if text:
                system.append(text)
        elif m["role"] == "user":
            add("user", [{"type": "text", "text": text if text.strip() else EMPTY_TEXT}])
        elif m["role"] == "assistant":
            blocks: list[dict[str, Any]] = _reasoning_blocks(m.get("reasoning_blocks"))
            if text.strip():
                blocks.append({"type": "text", "text": text})
            blocks.extend(
                {"type": "tool_use", "id": c["id"], "name": c["name"], "input": c.get("args") or {}}
                for c in m.get("tool_calls") or ()
            )
            add("assistant", blocks)
        elif m["role"] == "tool":
            block: dict[str, Any] = {
                "type": "tool_result",
                "tool_use_id": m.get("tool_call_id", ""),
            }
            if text:
                block["content"] = text
            if m.get("status", "ok") in _FAILED:
                block["is_error"] = True
            add("user", [block])
    return "\n\n".join(system), turns.user_first({"type": "text", "text": EMPTY_TEXT})


def _reasoning_blocks(raw: Any) -> list[dict[str, Any]]:
    """The kept blocks of a transcript message that can go back, in their order:
    thinking with its signature (a block whose text a redaction policy changed has lost
    it, and would be rejected), redacted thinking with its data, and server-tool blocks
    as they came."""
    out: list[dict[str, Any]] = []
    for b in raw if isinstance(raw, list) else ():
        if not isinstance(b, Mapping):
            continue
        if b.get("type") == "thinking" and b.get("signature"):
            thought = b.get("thinking") or ""
            out.append({"type": "thinking", "thinking": thought, "signature": b["signature"]})
        elif b.get("type") == "redacted_thinking" and b.get("data"):
            out.append({"type": "redacted_thinking", "data": b["data"]})
        elif _server_block(b.get("type")):
            out.append(dict(b))
    return out


def _unsigned_thinking(messages: list[Message]) -> bool:
    """Whether an assistant turn of the current tool loop (after the last user message)
    has a thinking block without its signature."""
    for m in reversed(messages):
        if m["role"] == "user":
            return False
        blocks = m.get("reasoning_blocks") if m["role"] == "assistant" else None
        for b in blocks if isinstance(blocks, list) else ():
            if isinstance(b, Mapping) and b.get("type") == "thinking" and not b.get("signature"):
                return True
    return False


def _usage(raw: Mapping[str, Any]) -> Usage:
    usage = empty_usage()
    read = tokens(raw, "cache_read_input_tokens")
    write = tokens(raw, "cache_creation_input_tokens")
    # Anthropic's `input_tokens` leaves out cached tokens; report the whole prompt, as
    # OpenAI does, with the cached parts broken out.
    usage["input_tokens"] = tokens(raw, "input_tokens") + read + write
    usage["output_tokens"] = tokens(raw, "output_tokens")
    usage["cache_read_tokens"] = read
    usage["cache_write_tokens"] = write
    usage["reasoning_tokens"] = tokens(raw, "output_tokens_details", "thinking_tokens")
    return usage


def _call(block: Mapping[str, Any], raw: Any) -> ToolCallData:
    """A transcript tool call from a `tool_use` block and its input (an object, or the
    JSON text a stream delivered)."""
    name = block.get("name")
    if not isinstance(name, str) or not name:
        raise ValueError(f"a tool_use block without a name: {json.dumps(block)[:200]}")
    call_id = block.get("id") or "toolu_" + uuid.uuid4().hex[:24]
    return tool_call(call_id, name, raw)


def _checked(block: Any) -> str:
    """The type of a content block, once its fields are what that type needs (a
    `ValueError` says what is wrong): text a string, thinking its text, redacted
    thinking its data."""
    if not isinstance(block, Mapping) or not isinstance(block.get("type"), str):
        raise ValueError(f"a content block without a type: {json.dumps(block)[:200]}")
    kind: str = block["type"]
    needs = {"text": "text", "thinking": "thinking", "redacted_thinking": "data"}.get(kind)
    if needs is not None and not isinstance(block.get(needs), str):
        raise ValueError(f"a {kind} block without its {needs}: {json.dumps(block)[:200]}")
    return kind


def _reply(
    texts: list[str],
    calls: list[ToolCallData],
    stop: Any,
    usage: Mapping[str, Any],
    reasoning: list[dict[str, Any]],
) -> ModelResponse:
    message: AssistantMessage = {"role": "assistant", "content": "".join(texts)}
    if reasoning:
        thought = "".join(b.get("thinking") or "" for b in reasoning if b["type"] == "thinking")
        if thought:
            message["reasoning"] = thought
        message["reasoning_blocks"] = reasoning
    if calls:
        message["tool_calls"] = calls
    reason: ModelStopReason | None = (
        "content_filter" if stop == "refusal" else "max_tokens" if stop in _CUT else None
    )
    return ModelResponse(message, _usage(usage), reason)


class AnthropicModel(HttpModel):
    """A model behind the Anthropic Messages API. Build it with `anthropic(...)` or
    `Agent("anthropic:<model>")`.

    Tools go out as `{name, description, input_schema}` (several calls per reply allowed);
    streaming reads the server-sent events. `max_tokens` (required by the API) bounds each
    reply. Typed output has no native mode here: the JSON Schema is put in the system
    prompt with an instruction to answer with JSON only, and the agent parses and checks
    the answer (asking again when it does not fit). A `refusal` stop reason ends the run
    with `stop_reason == "content_filter"`, a `max_tokens` stop with `"max_tokens"`.
    Extended thinking (`thinking={"type": "enabled", "budget_tokens": N}`) works with
    tools: the thinking blocks, with their signatures, are kept on the assistant message
    (`reasoning_blocks`; the text also as `reasoning`) and sent back unchanged.
    """

    provider = "anthropic"

    def __init__(
        self,
        model: str,
        *,
        api_key: str | None,
        base_url: str = ANTHROPIC_URL,
        max_tokens: int = 4096,
        headers: Mapping[str, str] | None = None,
        thinking: Mapping[str, Any] | None = None,
        **options: Unpack[HttpOptions],
    ) -> None:
        if thinking is not None:
            _check_thinking(thinking, max_tokens)
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int):
            raise TypeError(f"max_tokens must be an int, got {max_tokens!r}")
        if max_tokens < 1:
            raise ValidationError(f"max_tokens must be >= 1, got {max_tokens}")
        auth = {"x-api-key": api_key} if api_key else {}
        super().__init__(
            model,
            base_url=base_url,
            auth={**auth, "anthropic-version": API_VERSION},
            headers=headers,
            **options,
        )
        self.max_tokens = max_tokens
        self.thinking = dict(thinking) if thinking is not None else None

    def body(self, request: ModelRequest, *, stream: bool) -> dict[str, Any]:
        """The JSON body of a request."""
        system, messages = to_anthropic_messages(request.messages)
        if request.output_schema is not None:
            instruction = OUTPUT_INSTRUCTION.format(schema=json.dumps(request.output_schema))
            system = f"{system}\n\n{instruction}" if system else instruction
        body: dict[str, Any] = {
            "model": self.name,
            "max_tokens": self.max_tokens,
            "messages": messages,
        }
        if system:
            body["system"] = system
        if request.tools:
            tools = []
            for t in request.tools:
                spec: dict[str, Any] = {
                    "name": t["name"],
                    # The API only takes object schemas, and says so when `type` is missing.
                    "input_schema": {"type": "object", **t["parameters"]},
                }
                if t.get("description"):
                    spec["description"] = t["description"]
                tools.append(spec)
            body["tools"] = tools
        if self.thinking is not None:
            body["thinking"] = dict(self.thinking)
        if stream:
            body["stream"] = True
        body.update(self._extra)
        if "thinking" in body and _unsigned_thinking(request.messages):
            # A thinking block of this tool loop lost its signature (a redaction policy
            # changed its text), so it cannot go back; with thinking on, the API would
            # reject the turn without it. This request goes without thinking instead.
            del body["thinking"]
        return body

    async def _complete(self, request: ModelRequest) -> ModelResponse:
        return await self._until_done(self.body(request, stream=False), self._complete_once)

    async def _until_done(
        self, body: dict[str, Any], once: Callable[[dict[str, Any]], Awaitable[_Turn]]
    ) -> ModelResponse:
        """The reply to `body`, asking again while the API pauses a long turn of server
        tools (`stop_reason: "pause_turn"`): the paused reply goes back as it came, as
        the assistant turn the next request continues; the parts make one reply."""
        turns = [await once(body)]
        while turns[-1].stop == "pause_turn":
            if len(turns) > _MAX_PAUSES:
                raise self._error(
                    "transient", f"the answer was still paused after {_MAX_PAUSES} continuations"
                )
            messages = list(body["messages"])
            if messages and messages[-1]["role"] == "assistant":
                last = messages.pop()
                blocks = [*last["content"], *turns[-1].blocks]
            else:
                blocks = list(turns[-1].blocks)
            body = {**body, "messages": [*messages, {"role": "assistant", "content": blocks}]}
            turns.append(await once(body))
        usage: dict[str, Any] = {}
        for turn in turns:
            for key, value in turn.usage.items():
                # Each continuation reads the prompt again: its tokens count again.
                old = usage.get(key)
                if isinstance(value, int) and isinstance(old, int):
                    usage[key] = old + value
                else:
                    usage[key] = value
        return _reply(
            [t for turn in turns for t in turn.texts],
            [c for turn in turns for c in turn.calls],
            turns[-1].stop,
            usage,
            [b for turn in turns for b in turn.reasoning],
        )

    async def _complete_once(self, body: dict[str, Any]) -> _Turn:
        data = await self._post(_PATH, body)
        if isinstance(data, dict) and data.get("type") == "error":
            raise self._stream_error(data.get("error"))
        content = data.get("content") if isinstance(data, dict) else None
        if not isinstance(content, list):
            raise self._unreadable(f"the response is not a message: {str(data)[:200]}")
        if not content and not isinstance(data.get("stop_reason"), str):
            # An empty answer says why it stopped; without that it is no message at all.
            raise self._unreadable(f"no content and no stop_reason: {str(data)[:200]}")
        turn = _Turn()
        for b in content:
            try:
                kind = _checked(b)
                if kind == "tool_use":
                    turn.calls.append(_call(b, b.get("input")))
            except ValueError as exc:
                raise self._unreadable(str(exc)) from exc
            if kind == "text":
                turn.texts.append(b["text"])
            elif kind in _REASONING_TYPES or _server_block(kind):
                turn.reasoning.append(dict(b))
            elif kind != "tool_use":
                raise self._unknown_block(b)
        usage = data.get("usage")
        turn.usage = usage if isinstance(usage, dict) else {}
        turn.stop = data.get("stop_reason")
        turn.blocks = list(content)
        return turn

    def _unknown_block(self, block: Any) -> ModelError:
        kind = block.get("type") if isinstance(block, dict) else None
        return self._unreadable(
            f"a content block of unknown type {kind!r} ({json.dumps(block)[:200]}); this "
            "adapter reads text, tool_use, thinking, redacted_thinking and server-tool "
            "blocks",
            kind="bad_request",
        )

    async def _stream(self, request: ModelRequest) -> ModelResponse:
        sink, thinking = request.on_text, request.on_reasoning
        return await self._until_done(
            self.body(request, stream=True), lambda body: self._stream_once(body, sink, thinking)
        )

    async def _stream_once(
        self, body: dict[str, Any], sink: TextSink | None, thinking: TextSink | None
    ) -> _Turn:
        state = _StreamState(self, sink, thinking)
        async for name, event in self._events(_PATH, body):
            if not isinstance(event, dict):
                raise self._unreadable(f"a stream event is not an object: {str(event)[:200]}")
            kind = event.get("type") or name
            if kind == "error":
                raise self._stream_error(event.get("error"))
            try:
                state.on_event(kind, event)
            except (AttributeError, KeyError, TypeError, ValueError) as exc:
                raise self._unreadable(
                    f"{type(exc).__name__}: {exc}: {json.dumps(event)[:200]}"
                ) from exc
        if not state.finished:
            raise self._error("connection", "the stream ended before message_stop")
        if not state.started:
            raise self._unreadable("the stream has no message_start event")
        return state.turn()


class _StreamState:
    """One streamed response being put together, event by event: the blocks by their
    index, the usage so far and the stop reason."""

    def __init__(
        self, model: AnthropicModel, sink: TextSink | None, thinking: TextSink | None
    ) -> None:
        self.model = model
        self.sink = sink
        self.thinking = thinking
        self.texts: list[str] = []
        # the text of each text block by index (a paused turn goes back block by block)
        self.text_blocks: dict[int, list[str]] = {}
        # tool_use blocks by index, with the JSON text of their input so far
        self.tools: dict[int, tuple[dict[str, Any], list[str]]] = {}
        # thinking and server-tool blocks by index, filled in by their deltas
        self.thoughts: dict[int, dict[str, Any]] = {}
        # the JSON text of a server tool call's input, by index
        self.server_input: dict[int, list[str]] = {}
        self.usage: dict[str, Any] = {}
        self.stop: Any = None
        self.started = False
        self.finished = False

    def on_event(self, kind: Any, event: dict[str, Any]) -> None:
        if kind == "content_block_delta":
            self._delta(event)
        elif kind == "content_block_start":
            self._start(event)
        elif kind == "message_start":
            self.started = True
            self.usage.update((event.get("message") or {}).get("usage") or {})
        elif kind == "message_delta":
            self.stop = (event.get("delta") or {}).get("stop_reason") or self.stop
            # Its counts are cumulative; fields it leaves out keep message_start's.
            given = event.get("usage") or {}
            self.usage.update({k: v for k, v in given.items() if v is not None})
        elif kind == "message_stop":
            self.finished = True

    def _text(self, index: int, text: str) -> None:
        self.texts.append(text)
        self.text_blocks.setdefault(index, []).append(text)
        if self.sink is not None:
            self.sink(text)

    def _delta(self, event: dict[str, Any]) -> None:
        delta = event.get("delta") or {}
        dtype = delta.get("type")
        index = int(event.get("index", -1))
        if dtype == "text_delta" and delta.get("text"):
            if not isinstance(delta["text"], str):
                raise ValueError("a text_delta whose text is not a string")
            self._text(index, delta["text"])
        elif dtype == "input_json_delta":
            self._input_json(index, delta)
        elif dtype == "thinking_delta" and index in self.thoughts:
            self._thought(index, str(delta.get("thinking") or ""))
        elif dtype == "signature_delta" and index in self.thoughts:
            self.thoughts[index]["signature"] += str(delta.get("signature") or "")

    def _input_json(self, index: int, delta: dict[str, Any]) -> None:
        slot = self.tools.get(index)
        if slot is not None:
            slot[1].append(delta.get("partial_json") or "")
        elif index in self.server_input:
            self.server_input[index].append(str(delta.get("partial_json") or ""))

    def _thought(self, index: int, piece: str) -> None:
        self.thoughts[index]["thinking"] += piece
        if piece and self.thinking is not None:
            self.thinking(piece)

    def _start(self, event: dict[str, Any]) -> None:
        block: Any = event.get("content_block")
        btype = _checked(block)
        index = int(event.get("index", len(self.tools) + len(self.thoughts)))
        if btype == "tool_use":
            _call(block, None)  # a block without a name is not a call
            self.tools[index] = (block, [])
        elif btype == "text":
            self.text_blocks.setdefault(index, [])
            if block.get("text"):
                self._text(index, block["text"])
        elif btype == "thinking":
            self.thoughts[index] = {
                "type": "thinking",
                "thinking": str(block.get("thinking") or ""),
                "signature": str(block.get("signature") or ""),
            }
        elif btype == "redacted_thinking" or _server_block(btype):
            self.thoughts[index] = dict(block)
            if btype != "redacted_thinking" and "input" in block:
                self.server_input[index] = []
        else:
            raise self.model._unknown_block(block)

    def turn(self) -> _Turn:
        """The finished response: calls with their whole input, blocks in stream order."""
        calls = [
            _call(block, "".join(parts) if parts else block.get("input"))
            for _, (block, parts) in sorted(self.tools.items())
        ]
        for index, parts in self.server_input.items():
            if "".join(parts).strip():
                try:
                    self.thoughts[index]["input"] = json.loads("".join(parts))
                except ValueError as exc:
                    raise self.model._unreadable(
                        f"a server tool call's input is not JSON: {''.join(parts)[:200]!r}"
                    ) from exc
        blocks: dict[int, dict[str, Any]] = {
            **{i: {"type": "text", "text": "".join(t)} for i, t in self.text_blocks.items()},
            **{i: dict(b) for i, b in self.thoughts.items()},
        }
        for index, call in zip(sorted(self.tools), calls, strict=True):
            blocks[index] = {
                "type": "tool_use",
                "id": call["id"],
                "name": call["name"],
                "input": call["args"],
            }
        turn = _Turn(texts=self.texts, calls=calls, stop=self.stop, usage=self.usage)
        turn.reasoning = [b for _, b in sorted(self.thoughts.items())]
        turn.blocks = [b for _, b in sorted(blocks.items())]
        return turn


def _check_thinking(thinking: Any, max_tokens: Any) -> None:
    if not isinstance(thinking, Mapping) or not isinstance(thinking.get("type"), str):
        raise ValidationError(
            'thinking must be a dict such as {"type": "enabled", "budget_tokens": 2048}, got '
            f"{thinking!r}",
            code="invalid_value",
        )
    budget = thinking.get("budget_tokens")
    if isinstance(budget, int) and isinstance(max_tokens, int) and budget >= max_tokens:
        raise ValidationError(
            f"thinking budget_tokens ({budget}) must be less than max_tokens ({max_tokens}): "
            "the thinking counts towards max_tokens; raise max_tokens",
            code="invalid_value",
        )


def anthropic(
    model: str,
    *,
    api_key: str | None = None,
    base_url: str | None = None,
    max_tokens: int = 4096,
    headers: Mapping[str, str] | None = None,
    thinking: Mapping[str, Any] | None = None,
    **options: Unpack[HttpOptions],
) -> AnthropicModel:
    """An Anthropic model (the key defaults to `ANTHROPIC_API_KEY`, the URL to
    `ANTHROPIC_BASE_URL` or Anthropic's; give the URL without `/v1`).

    With another `base_url` (a proxy or a compatible server) a key is optional.
    `max_tokens` bounds each reply; `headers` are added to every request (e.g.
    `{"anthropic-beta": ...}`); `timeout_secs`, `connect_timeout_secs` and `extra_body`
    (fields added to every request, e.g. `{"stop_sequences": ["END"]}`) as in
    `HttpOptions`. `thinking` turns on extended thinking in the API's
    own form, e.g. `{"type": "enabled", "budget_tokens": 2048}` (less than `max_tokens`)
    or `{"type": "adaptive"}`; it combines with tools.
    """
    url, key = base_url_and_key(
        base_url,
        api_key,
        default_url=ANTHROPIC_URL,
        url_env="ANTHROPIC_BASE_URL",
        key_env="ANTHROPIC_API_KEY",
        what=f"anthropic:{model}",
    )
    return AnthropicModel(
        model,
        api_key=key,
        base_url=url,
        max_tokens=max_tokens,
        headers=headers,
        thinking=thinking,
        **options,
    )
