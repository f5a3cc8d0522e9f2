"""One model call as layers of middleware, outermost first: the user's middleware, then
telemetry (a `chat` span), LangChain callbacks (a chat-model run), fallback (the next
model), retry (the same model again), and the model itself.

The chain is composed once per node; what belongs to one step (stream sinks, the open
span, which model answered) travels in a `Step` held in a context variable, so layers
that are objects shared by every run keep nothing of a run on themselves. Layers that
have nothing to do are left out of the chain (no fallbacks, one attempt) or pass the
call straight on (no telemetry, no callback handlers)."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any

from criogen_graph.errors import ModelError
from criogen_graph.graph.events import Writer
from criogen_graph.graph.spec import AgentSpec
from criogen_graph.middleware import Middleware, ModelCall, ModelHandler, checked_call
from criogen_graph.models.base import Model, ModelResponse
from criogen_graph.results import empty_usage
from criogen_graph.telemetry.callbacks import report_chat
from criogen_graph.telemetry.observe import run_spans


class Step:
    """What the layers of one model step share."""

    __slots__ = ("answered", "reasoning", "span", "spans", "summary", "text", "writer")

    def __init__(
        self,
        writer: Writer | None,
        on_text: Callable[[str], None] | None,
        on_reasoning: Callable[[str], None] | None,
    ) -> None:
        self.writer = writer
        self.spans: Any = None
        self.span: Any = None
        #: The model whose answer the innermost layer returned last.
        self.answered: Model | None = None
        self.text = _AttemptSinks(on_text)
        self.reasoning = _AttemptSinks(on_reasoning)
        #: A call that summarizes the thread (`ContextPolicy`), not one of the run's turns.
        self.summary = False

    def event(self, event: str, span_event: str, attributes: dict[str, Any]) -> None:
        """A retry or fallback, as a stream event and an event on the `chat` span."""
        if self.writer is not None:
            self.writer({"type": "other", "event": event, "node": "model"})
        if self.span is not None:
            self.spans.event(self.span, span_event, attributes)


STEP: ContextVar[Step] = ContextVar("criogen_model_step")


def compose(spec: AgentSpec, *, user: bool = True) -> tuple[ModelHandler, bool]:
    """The model call of `spec`'s agent with every layer around it (without the user's
    middleware unless `user`), and whether the user's middleware is among them."""
    layers: list[Middleware] = [
        m
        for m in (spec.middleware if user else ())
        if type(m).wrap_model_call is not Middleware.wrap_model_call
    ]
    users = len(layers)
    layers += [_Telemetry(spec), _Callbacks(spec)]
    if len(spec.models) > 1:
        layers.append(_Fallback(spec))
    if spec.model_retry.max_attempts > 1:
        layers.append(_Retry(spec))
    handler: ModelHandler = _generate
    for i, layer in reversed(list(enumerate(layers))):
        handler = _bind_checked(layer, handler) if i < users else _bind(layer, handler)
    return handler, users > 0


def _bind(layer: Middleware, inner: ModelHandler) -> ModelHandler:
    async def call(model_call: ModelCall) -> ModelResponse:
        return await layer.wrap_model_call(model_call, inner)

    return call


def _bind_checked(layer: Middleware, inner: ModelHandler) -> ModelHandler:
    """A user's middleware: what it returns is checked before anything keeps it."""

    async def call(model_call: ModelCall) -> ModelResponse:
        response: ModelResponse = await checked_call(layer, "wrap_model_call", model_call, inner)
        return response

    return call


async def _generate(call: ModelCall) -> ModelResponse:
    """The innermost layer: one attempt of one model. A stream that failed part-way is
    tried again (or falls back) without repeating what was already emitted: each attempt
    emits only text beyond it."""
    step = STEP.get()
    model = call.model
    request = call.request
    if request.on_text is not None or request.on_reasoning is not None:
        # Only a streamed call has sinks to wrap; an unstreamed one is passed as it is.
        request = dataclasses.replace(
            request,
            on_text=step.text.attempt(request.on_text),
            on_reasoning=step.reasoning.attempt(request.on_reasoning),
        )
    try:
        response = await model.generate(request)
    except ModelError as err:
        if err.provider is None:
            err.provider, err.model = model.provider, model.name
        raise
    step.answered = model
    return response


class _Telemetry(Middleware):
    """A `chat {model}` span around the call (retries and fallbacks are its events)."""

    def __init__(self, spec: AgentSpec) -> None:
        self._spec = spec

    async def wrap_model_call(self, call: ModelCall, handler: ModelHandler) -> ModelResponse:
        spans = run_spans(self._spec)
        if spans is None:
            return await handler(call)
        model = call.model
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": model.provider,
            "gen_ai.request.model": model.name,
        }
        if spans.content:
            attributes["gen_ai.input.messages"] = spans.text(call.request.messages)
        step = STEP.get()
        if step.summary:
            attributes["criogen.summary"] = True
        with spans.span(f"chat {model.name}", attributes, kind="client") as span:
            step.spans, step.span = spans, span
            try:
                response = await handler(call)
            finally:
                step.span = None
            spans.set(span, _chat_attributes(spans, response, step.answered or model))
        return response


class _Callbacks(Middleware):
    """A chat-model run for the LangChain callback handlers of the run, if it has any."""

    def __init__(self, spec: AgentSpec) -> None:
        self._spec = spec

    async def wrap_model_call(self, call: ModelCall, handler: ModelHandler) -> ModelResponse:
        async def answered() -> tuple[ModelResponse, Model]:
            response = await handler(call)
            return response, STEP.get().answered or call.model

        response, _ = await report_chat(self._spec, call.request, answered(), model=call.model)
        return response


class _Fallback(Middleware):
    """The next model when one fails with an error the agent falls back on."""

    def __init__(self, spec: AgentSpec) -> None:
        self._spec = spec

    async def wrap_model_call(self, call: ModelCall, handler: ModelHandler) -> ModelResponse:
        spec = self._spec
        models = (call.model, *spec.models[1:])
        failures: list[ModelError] = []
        for index, model in enumerate(models):
            try:
                return await handler(call if index == 0 else call.replace(model=model))
            except ModelError as err:
                failures.append(err)
                more = index + 1 < len(models)
                if not (more and (err.transient or err.kind in spec.fallback_on)):
                    break
                after = models[index + 1]
                STEP.get().event(
                    "model_fallback",
                    "criogen.model_fallback",
                    {
                        "from": f"{model.provider}:{model.name}",
                        "to": f"{after.provider}:{after.name}",
                        "error.type": err.kind,
                    },
                )
        last = failures[-1]
        if last.kind == "content_filter":
            raise last  # an answer, not a crash: the node ends the run with that reason
        raise final_error(failures)


class _Retry(Middleware):
    """The same model again after a transient failure, with backoff and `Retry-After`."""

    def __init__(self, spec: AgentSpec) -> None:
        self._spec = spec

    async def wrap_model_call(self, call: ModelCall, handler: ModelHandler) -> ModelResponse:
        spec = self._spec
        retry = spec.model_retry
        attempt = 0
        while True:
            attempt += 1
            try:
                return await handler(call)
            except ModelError as err:
                if not err.transient or attempt >= retry.max_attempts:
                    raise
                wait = retry.backoff(attempt)
                if err.retry_after is not None:
                    if err.retry_after > spec.max_retry_after_secs:
                        raise  # asked to wait longer than we are willing to
                    wait = max(wait, err.retry_after)
                STEP.get().event(
                    "model_retry",
                    "criogen.model_retry",
                    {"attempt": attempt, "error.type": err.kind, "wait_secs": wait},
                )
            await asyncio.sleep(wait)


def finished(err: ModelError) -> ModelResponse:
    """What the step makes of the error its layers raised: a safety stop is an answer
    (the run ends with stop reason `content_filter`); anything else is raised, in the one
    shape that names the model(s) tried."""
    if err.kind == "content_filter":
        return ModelResponse({"role": "assistant", "content": ""}, empty_usage(), "content_filter")
    raise err if err.attempts else final_error([err])


class _AttemptSinks:
    """Hands each attempt of a model call a sink that passes on only what no earlier
    attempt of the step emitted already."""

    __slots__ = ("_emitted", "_sink")

    def __init__(self, sink: Callable[[str], None] | None) -> None:
        self._sink = sink
        self._emitted = 0

    def attempt(self, sink: Callable[[str], None] | None) -> Callable[[str], None] | None:
        if sink is None:
            return None
        if sink is not self._sink:
            return sink  # a middleware gave the request a sink of its own
        seen = [0]

        def emit(piece: str) -> None:
            start, seen[0] = seen[0], seen[0] + len(piece)
            if seen[0] > self._emitted:
                sink(piece[max(0, self._emitted - start) :])
                self._emitted = seen[0]

        return emit


def _chat_attributes(spans: Any, response: ModelResponse, model: Model) -> dict[str, Any]:
    calls = response.message.get("tool_calls")
    finish = response.stop_reason or ("tool_calls" if calls else "stop")
    usage = response.usage
    attributes: dict[str, Any] = {
        "gen_ai.provider.name": model.provider,
        "gen_ai.response.model": model.name,
        "gen_ai.response.finish_reasons": [finish],
        "gen_ai.usage.input_tokens": usage.get("input_tokens", 0),
        "gen_ai.usage.output_tokens": usage.get("output_tokens", 0),
    }
    if usage.get("cache_read_tokens"):
        attributes["gen_ai.usage.cache_read_input_tokens"] = usage["cache_read_tokens"]
    if spans.content:
        attributes["gen_ai.output.messages"] = spans.text([response.message])
    return attributes


def final_error(failures: list[ModelError]) -> ModelError:
    """One error for a step whose models all failed: the first failure's kind, every
    failure in `attempts`."""
    primary = failures[0]
    last = failures[-1]
    if len(failures) == 1:
        message = f"{primary.provider}:{primary.model} failed ({primary.kind}): {primary.message}"
    else:
        tried = ", ".join(f"{f.provider}:{f.model} ({f.kind})" for f in failures[1:])
        message = (
            f"{primary.provider}:{primary.model} failed ({primary.kind}): {primary.message}; "
            f"fallbacks tried: {tried}"
        )
    error = ModelError(
        message,
        kind=primary.kind,
        provider=primary.provider,
        model=primary.model,
        status=primary.status,
        retry_after=primary.retry_after,
        attempts=[
            {"provider": f.provider, "model": f.model, "kind": f.kind, "message": f.message}
            for f in failures
        ],
    )
    error.__cause__ = last
    return error
