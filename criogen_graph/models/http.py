"""What the HTTP provider models share: one pooled `httpx` client per model (and event
loop), JSON and server-sent-event calls, and the classification of every failure into a
`ModelError` kind."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator, Mapping
from typing import Any, TypedDict

import httpx

from criogen_graph._retry_after import retry_after_from_headers
from criogen_graph.errors import ModelError, ValidationError
from criogen_graph.messages import ModelErrorKind, ToolCallData
from criogen_graph.models.base import Model, ModelRequest, ModelResponse

_CONTEXT_HINTS = (
    "context length",
    "context_length",
    "maximum context",
    "context window",
    "too many tokens",
    "prompt is too long",
    "input is too long",
    "exceeds the maximum",
    "token limit",
    "context limit",
)
#: How typed output is asked for when a provider has no native JSON-Schema mode.
OUTPUT_INSTRUCTION = (
    "Give your final answer as JSON only (no prose, no code fences), matching this JSON "
    "Schema:\n{schema}"
)
_FILTER_HINTS = ("content_filter", "content_policy", "content policy", "safety", "responsible ai")
#: The HTTP status an error name stands for, so an error sent inside a 200 stream (whose
#: status is long gone) is classified like the same error sent as a status. Names are the
#: `type` / `code` / `status` fields of OpenAI-style, Anthropic and Google error objects.
_ERROR_NAMES = {
    "invalid_request_error": 400,
    "invalid_argument": 400,
    "failed_precondition": 400,
    "bad_request": 400,
    "authentication_error": 401,
    "unauthenticated": 401,
    "invalid_api_key": 401,
    "billing_error": 402,
    "permission_error": 403,
    "permission_denied": 403,
    "not_found_error": 404,
    "not_found": 404,
    "timeout_error": 408,
    "request_too_large": 413,
    "rate_limit_error": 429,
    "rate_limit_exceeded": 429,
    "resource_exhausted": 429,
    "insufficient_quota": 429,
    "api_error": 500,
    "server_error": 500,
    "internal": 500,
    "internal_error": 500,
    "unavailable": 503,
    "service_unavailable": 503,
    "deadline_exceeded": 504,
    "overloaded_error": 529,
    "overloaded": 529,
}


def api_key_from(api_key: str | None, env: str, *, required: bool, what: str) -> str | None:
    """An explicit key, else the environment variable; `ValidationError` naming the
    variable when a key is needed and there is none."""
    key = api_key if api_key is not None else os.environ.get(env)
    if required and not key:
        raise ValidationError(
            f"{what} needs an API key: set {env} (or call load_env() for a .env file) or "
            "pass api_key=",
            code="invalid_value",
        )
    return key


def base_url_and_key(
    base_url: str | None,
    api_key: str | None,
    *,
    default_url: str,
    url_env: str,
    key_env: str,
    what: str,
) -> tuple[str, str | None]:
    """A provider's base URL (`base_url`, else `$url_env`, else `default_url`) and API key
    (`api_key`, else `$key_env`). The key is required only at the provider's own URL: a
    proxy or a compatible server may need none."""
    base_url = base_url or os.environ.get(url_env) or None
    custom = base_url is not None and base_url.rstrip("/") != default_url
    key = api_key_from(api_key, key_env, required=not custom, what=what)
    return base_url or default_url, key


def classify_status(status: int, text: str) -> ModelErrorKind:
    """The `ModelError.kind` of an HTTP error status (and its body)."""
    lowered = text.lower()
    if status == 429:
        # Some providers send 429 for an exhausted quota, which no retry fixes.
        return "rate_limit"
    if status == 408:
        return "timeout"
    if status in (401, 403):
        return "auth"
    if status == 404:
        return "not_found"
    if status >= 500:
        return "transient"
    if any(h in lowered for h in _CONTEXT_HINTS):
        return "context_overflow"
    if any(h in lowered for h in _FILTER_HINTS):
        return "content_filter"
    return "bad_request"


def error_message(text: str) -> str:
    """The human part of a provider's error body."""
    try:
        body = json.loads(text)
    except ValueError:
        return text.strip()[:500] or "(empty body)"
    if isinstance(body, list) and body:
        body = body[0]
    if isinstance(body, dict):
        err = body.get("error", body)
        if isinstance(err, dict):
            msg = err.get("message") or err.get("type") or err.get("status")
            if msg:
                return str(msg)[:500]
        elif isinstance(err, str):
            return err[:500]
    return text.strip()[:500]


def tokens(raw: Any, *path: str) -> int:
    """A token count at `path` in a usage object; 0 when it is missing or not a count
    (usage is bookkeeping: a provider's odd value must not fail an answer)."""
    for key in path:
        raw = raw.get(key) if isinstance(raw, Mapping) else None
    if isinstance(raw, bool) or not isinstance(raw, int | float):
        return 0
    return max(0, int(raw))


def stream_error_status(error: Mapping[str, Any]) -> int:
    """The HTTP status an error object sent inside a stream stands for: its numeric `code`
    (OpenRouter, Google), else its `type` / `code` / `status` name; 500 (a server failing
    part-way, worth another try) when it names none we know."""
    code = error.get("code")
    numeric = isinstance(code, int | str) and not isinstance(code, bool) and str(code).isdigit()
    if numeric and 400 <= int(str(code)) < 600:
        return int(str(code))
    for key in ("type", "status", "code"):
        name = error.get(key)
        if isinstance(name, str) and name.lower() in _ERROR_NAMES:
            return _ERROR_NAMES[name.lower()]
    return 500


class Turns:
    """The turns of a conversation for an API that wants roles to alternate and a user
    turn first: items added for the role of the last turn join that turn. `key` names a
    turn's list of items (`"content"`, `"parts"`)."""

    def __init__(self, key: str) -> None:
        self.key = key
        self.turns: list[dict[str, Any]] = []

    def add(self, role: str, items: list[dict[str, Any]]) -> None:
        """Items of `role` (none: nothing, the APIs reject empty turns)."""
        if not items:
            return
        if self.turns and self.turns[-1]["role"] == role:
            self.turns[-1][self.key].extend(items)
        else:
            self.turns.append({"role": role, self.key: items})

    def user_first(self, filler: dict[str, Any]) -> list[dict[str, Any]]:
        """The turns, after a user turn of `filler` when they do not start with one (a
        hook may have left no user message)."""
        if not self.turns or self.turns[0]["role"] != "user":
            self.turns.insert(0, {"role": "user", self.key: [filler]})
        return self.turns


class HttpOptions(TypedDict, total=False):
    """The options every HTTP provider model takes (its class and its factory function):
    `timeout_secs` (default 60) bounds each read, a response or a stream that goes quiet
    that long failing with kind `timeout`; `connect_timeout_secs` (default 10) the
    connection; `extra_body` adds its fields to every request."""

    timeout_secs: float
    connect_timeout_secs: float
    extra_body: Mapping[str, Any] | None


class HttpModel(Model):
    """A model behind an HTTP API (async `httpx`, one pooled client per event loop).

    `auth` (the provider's key headers) and then `headers` go with every request; for
    `timeout_secs`, `connect_timeout_secs` and `extra_body` see `HttpOptions`.
    """

    def __init__(
        self,
        name: str,
        *,
        base_url: str,
        auth: Mapping[str, str] | None = None,
        headers: Mapping[str, str] | None = None,
        timeout_secs: float = 60,
        connect_timeout_secs: float = 10,
        extra_body: Mapping[str, Any] | None = None,
        max_connections: int = 100,
    ) -> None:
        if not isinstance(name, str) or not name:
            raise TypeError("the model name must be a non-empty str")
        self.name = name
        self.base_url = base_url.rstrip("/")
        self.headers = {**dict(auth or {}), **dict(headers or {})}
        self._extra = dict(extra_body or {})
        self.timeout = httpx.Timeout(timeout_secs, connect=connect_timeout_secs)
        self._limits = httpx.Limits(
            max_connections=max_connections, max_keepalive_connections=max_connections
        )
        self._clients: dict[asyncio.AbstractEventLoop, httpx.AsyncClient] = {}

    async def generate(self, request: ModelRequest) -> ModelResponse:
        # With a text or reasoning callback the answer streams, for them to see it as the
        # model writes it.
        if request.on_text is not None or request.on_reasoning is not None:
            return await self._stream(request)
        return await self._complete(request)

    async def _complete(self, request: ModelRequest) -> ModelResponse:
        """The answer to `request` in one response."""
        raise NotImplementedError

    async def _stream(self, request: ModelRequest) -> ModelResponse:
        """The answer to `request`, streamed to its callbacks."""
        raise NotImplementedError

    def _client(self) -> httpx.AsyncClient:
        loop = asyncio.get_running_loop()
        client = self._clients.get(loop)
        if client is None:
            # Clients of event loops that have finished cannot be reused.
            for old in [lp for lp in self._clients if lp.is_closed()]:
                del self._clients[old]
            client = self._clients[loop] = httpx.AsyncClient(
                base_url=self.base_url, timeout=self.timeout, limits=self._limits
            )
        return client

    def _headers(self) -> dict[str, str]:
        return {"content-type": "application/json", **self.headers}

    def _error(
        self,
        kind: ModelErrorKind,
        message: str,
        *,
        status: int | None = None,
        retry_after: float | None = None,
    ) -> ModelError:
        return ModelError(
            f"{self.provider}:{self.name}: {message}",
            kind=kind,
            provider=self.provider,
            model=self.name,
            status=status,
            retry_after=retry_after,
        )

    def _stream_error(self, error: Any) -> ModelError:
        """The `ModelError` of an error object a provider sent with status 200 (inside a
        stream, or as the body): classified by what it names, with its message."""
        error = error if isinstance(error, Mapping) else {"message": str(error)}
        status = stream_error_status(error)
        name = next(
            (str(error[k]) for k in ("type", "status", "code") if isinstance(error.get(k), str)),
            "",
        )
        message = str(error.get("message") or name or "an unnamed error")[:500]
        label = f"{name}: {message}" if name and name not in message else message
        return self._error(
            classify_status(status, f"{name} {message}"),
            f"error in the response stream: {label}",
            status=status,
        )

    def _unreadable(self, what: str, *, kind: ModelErrorKind = "transient") -> ModelError:
        """A reply this adapter cannot read. A broken or cut reply is `transient` (another
        try usually reads well); one of a kind the adapter does not know is not."""
        return self._error(kind, f"could not read the reply: {what}")

    def _transport_error(self, exc: Exception) -> ModelError:
        if isinstance(exc, httpx.TimeoutException):
            return self._error("timeout", f"timed out ({type(exc).__name__})")
        return self._error("connection", f"connection failed: {type(exc).__name__}: {exc}")

    def _status_error(self, response: httpx.Response, text: str) -> ModelError:
        return self._error(
            classify_status(response.status_code, text),
            f"HTTP {response.status_code}: {error_message(text)}",
            status=response.status_code,
            retry_after=retry_after_from_headers(response.headers),
        )

    async def _post(
        self, path: str, body: dict[str, Any], params: Mapping[str, str] | None = None
    ) -> Any:
        """POST a JSON body; the JSON answer, or a classified `ModelError`."""
        try:
            response = await self._client().post(
                path, json=body, headers=self._headers(), params=params
            )
        except httpx.HTTPError as exc:
            raise self._transport_error(exc) from exc
        if response.status_code >= 400:
            raise self._status_error(response, response.text)
        try:
            return response.json()
        except ValueError as exc:
            raise self._error(
                "transient", f"the response is not valid JSON: {response.text[:200]!r}"
            ) from exc

    async def _events(
        self, path: str, body: dict[str, Any], params: Mapping[str, str] | None = None
    ) -> AsyncIterator[tuple[str | None, Any]]:
        """POST and read server-sent events: `(event name or None, parsed JSON data)`.
        A `[DONE]` data line ends the stream."""
        client = self._client()
        try:
            async with client.stream(
                "POST", path, json=body, headers=self._headers(), params=params
            ) as response:
                if response.status_code >= 400:
                    text = (await response.aread()).decode("utf-8", "replace")
                    raise self._status_error(response, text)
                kind = response.headers.get("content-type", "")
                if not kind.startswith("text/event-stream"):
                    text = (await response.aread()).decode("utf-8", "replace")
                    raise self._error(
                        "transient",
                        f"asked for a stream, got {kind or 'no content type'}: {text[:200]!r}",
                    )
                event: str | None = None
                data: list[str] = []
                async for line in response.aiter_lines():
                    if not line:
                        if data:
                            raw = "\n".join(data)
                            data = []
                            if raw.strip() == "[DONE]":
                                return
                            try:
                                parsed = json.loads(raw)
                            except ValueError as exc:
                                raise self._error(
                                    "transient", f"a stream event is not valid JSON: {raw[:200]!r}"
                                ) from exc
                            yield event, parsed
                        event = None
                        continue
                    if line.startswith(":"):
                        continue
                    field, _, value = line.partition(":")
                    value = value[1:] if value.startswith(" ") else value
                    if field == "data":
                        data.append(value)
                    elif field == "event":
                        event = value
                if data:
                    raw = "\n".join(data)
                    if raw.strip() != "[DONE]":
                        try:
                            parsed = json.loads(raw)
                        except ValueError as exc:
                            # The body ended inside an event: the stream was cut.
                            raise self._error(
                                "connection",
                                f"the stream ended in the middle of an event: {raw[:200]!r}",
                            ) from exc
                        yield event, parsed
        except httpx.HTTPError as exc:
            raise self._transport_error(exc) from exc

    async def aclose(self) -> None:
        clients, self._clients = self._clients, {}
        for loop, client in clients.items():
            if loop is asyncio.get_running_loop():
                await client.aclose()


def parse_args(raw: Any) -> tuple[dict[str, Any], str | None]:
    """Tool-call arguments from a JSON string: `(args, None)` or `({}, problem)`."""
    if isinstance(raw, dict):
        return raw, None
    if raw is None or raw == "":
        return {}, None
    try:
        value = json.loads(raw, parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        return {}, f"the arguments are not valid JSON ({exc.msg}): {str(raw)[:200]!r}"
    except ValueError as exc:
        # Python's json reads NaN and Infinity, which no JSON parser of a provider
        # takes back: such arguments would fail every later request of the thread.
        return {}, f"the arguments are not valid JSON ({exc}): {str(raw)[:200]!r}"
    if not isinstance(value, dict):
        return {}, f"the arguments must be a JSON object, got {str(raw)[:200]!r}"
    return value, None


def tool_call(call_id: str, name: str, raw_args: Any) -> ToolCallData:
    """A transcript tool call with the arguments a provider gave (an object, JSON text or
    nothing); arguments that are none of these, or not a JSON object, leave `args` empty
    and say why in `args_error` (the call then fails without running its tool)."""
    if raw_args is None or isinstance(raw_args, dict | str):
        args, problem = parse_args(raw_args)
    else:
        args, problem = {}, f"the arguments must be a JSON object, got {json.dumps(raw_args)[:200]}"
    call: ToolCallData = {"id": call_id, "name": name, "args": args}
    if problem is not None:
        call["args_error"] = problem
    return call


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")
