"""The `model` node: limits, `before_model` hooks, the model call (retries, fallbacks),
`after_model` hooks, typed output, and the routing of the reply's tool calls."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.types import Command, Overwrite, Send

from criogen_graph._callbacks import report_chat
from criogen_graph._observe import run_redactor, run_spans
from criogen_graph.adapters.models.base import Model, ModelRequest, ModelResponse
from criogen_graph.errors import ModelError, ValidationError
from criogen_graph.hooks import (
    HookAction,
    HookContext,
    HookFailedError,
    call_run_hook,
    copied_messages,
)
from criogen_graph.nodes.events import RedactedText, Writer, step_of, stream_writer
from criogen_graph.nodes.segment import RunSegment, segment_of
from criogen_graph.nodes.spec import AgentSpec
from criogen_graph.nodes.state import (
    add_usage,
    new_run,
    normalize_message,
    not_run_messages,
    tool_ran,
    unique_call_ids,
)
from criogen_graph.redact import redact_messages
from criogen_graph.results import empty_usage

_EMPTY: Mapping[str, Any] = MappingProxyType({})


class _Open:
    """A chat span and the `Spans` it belongs to (for retry and fallback events)."""

    __slots__ = ("span", "spans")

    def __init__(self, spans: Any, span: Any) -> None:
        self.spans = spans
        self.span = span


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


def _memory_store() -> Any:
    from langgraph.config import get_store

    store = get_store()
    if store is None:
        raise ValidationError(
            "this agent has memory, but its graph runs without a LangGraph store: compile it "
            "with store=... (the agent's own runs use its storage's store)",
            code="invalid_value",
        )
    return store


class ModelNode:
    """One model call per superstep."""

    def __init__(self, spec: AgentSpec) -> None:
        self.spec = spec

    async def __call__(self, state: dict[str, Any], config: RunnableConfig) -> Any:
        if not self.spec.loaded:
            await self.spec.ensure_tools()  # a graph run without the API (Studio)
        seg = segment_of(config)
        writer = stream_writer(config)
        if writer is None:
            update, new = await self._run(state, None, seg)
            if seg is not None:
                _saw(seg, state, update, new)
            return update
        step = step_of(config)
        writer({"type": "other", "event": "step_started", "node": "model", "step": step})
        update, new = await self._run(state, writer, seg)
        if seg is not None:
            _saw(seg, state, update, new)
        for m in new:
            writer({"type": "message", "message": m})
        writer({"type": "other", "event": "step_finished", "node": "model", "step": step})
        return update

    async def _run(
        self, state: dict[str, Any], writer: Writer | None, seg: RunSegment | None
    ) -> tuple[Any, list[dict[str, Any]]]:
        """The node's update, and the messages it adds (for `message` events)."""
        spec = self.spec
        messages: list[dict[str, Any]] = state.get("messages") or []
        prev = state.get("run")
        if not prev or not prev.get("run_id") or prev.get("stop_reason") is not None:
            # A run started without the API (LangGraph Studio, a raw graph call).
            run = new_run(uuid.uuid4().hex, prev.get("hooks") if prev else None)
        else:
            run = dict(prev)
        user_state: Mapping[str, Any] = state.get("state") or _EMPTY
        if seg is not None:
            # The segment's first node runs `on_start`; states it saved in a node that
            # could not write them (a tool call's task) are written here.
            if not seg.started:
                states = await seg.start(run, messages, user_state)
            else:
                states, seg.unsaved_states = seg.unsaved_states, None
            if states is not None:
                run["hooks"] = states

        # Account for the tool calls answered since the previous model call.
        i = len(messages)
        ran = 0
        direct: dict[str, Any] | None = None
        while i and messages[i - 1].get("role") == "tool":
            i -= 1
            m = messages[i]
            if tool_ran(m):
                ran += 1
            sub_usage = m.get("usage")
            if sub_usage:
                run["usage"] = add_usage(run["usage"], sub_usage)
            if m.get("return_direct") and m.get("status") == "ok":
                direct = m  # walking backwards: ends on the first in call order
        if ran:
            run["tool_calls"] = run["tool_calls"] + ran
        if direct is not None:
            run["stop_reason"] = "return_direct"
            run["output"] = direct.get("content")
            return {"run": run}, []

        limits = spec.limits
        if run["model_calls"] >= limits.model_calls:
            return self._limit(run, "model_calls", limits.model_calls), []
        if limits.tokens is not None:
            usage = run["usage"]
            if usage["input_tokens"] + usage["output_tokens"] >= limits.tokens:
                return self._limit(run, "tokens", limits.tokens), []

        hooks = spec.hooks
        transcript = messages
        replaced = False
        if hooks.before_model:
            for name, fn in hooks.before_model:
                action = await self._hook(name, "before_model", fn, run, transcript, user_state)
                if action is None:
                    continue
                if action.message is not None:
                    raise HookFailedError(
                        f"hook {name!r}: before_model cannot set `message` (that is for "
                        "after_model); use `messages` to replace the transcript",
                        hook=name,
                        method="before_model",
                    )
                if action.messages is not None:
                    transcript = _checked_transcript(name, action.messages)
                    replaced = True
                if action.end:
                    run["stop_reason"] = "hook_end"
                    run["output"] = action.output
                    if replaced:
                        return {"messages": Overwrite(transcript), "run": run}, []
                    return {"run": run}, []

        system = spec.system_message
        msg_id = "msg_" + uuid.uuid4().hex
        head = [system] if system is not None else []
        if spec.memory is not None:
            recalled = await spec.memory.recall_message(_memory_store(), user_state, transcript)
            if recalled is not None:
                head.append(recalled)
        request = ModelRequest(
            [*head, *transcript] if head else transcript,
            spec.tool_specs,
            spec.output.schema if spec.output is not None else None,
        )
        redactor = run_redactor(spec)
        held: RedactedText | None = None
        held_reasoning: RedactedText | None = None
        if writer is not None:

            def emit(text: str) -> None:
                writer({"type": "text", "message_id": msg_id, "text": text})

            def emit_reasoning(text: str) -> None:
                writer({"type": "reasoning", "message_id": msg_id, "text": text})

            if redactor is not None:
                held = RedactedText(redactor, emit)
                held_reasoning = RedactedText(redactor, emit_reasoning)
                request.on_text = held
                request.on_reasoning = held_reasoning
            else:
                request.on_text = emit
                request.on_reasoning = emit_reasoning
        spans = run_spans(spec)
        if spans is None:
            response, model = await report_chat(
                spec, request, self._call_model(request, writer, None)
            )
        else:
            primary = spec.models[0]
            attributes = {
                "gen_ai.operation.name": "chat",
                "gen_ai.provider.name": primary.provider,
                "gen_ai.request.model": primary.name,
            }
            if spans.content:
                attributes["gen_ai.input.messages"] = spans.text(request.messages)
            with spans.span(f"chat {primary.name}", attributes, kind="client") as span:
                response, model = await report_chat(
                    spec, request, self._call_model(request, writer, _Open(spans, span))
                )
                spans.set(span, _chat_attributes(spans, response, model))
        if redactor is not None:
            # Ahead of every hook: what is saved, streamed and exported is redacted.
            response.message = redact_messages(redactor, [response.message])[0]
            if held is not None:
                held.finish()
            if held_reasoning is not None:
                held_reasoning.finish()
        run["model_calls"] = run["model_calls"] + 1
        run["usage"] = add_usage(run["usage"], response.usage)
        ident = model.identity
        if ident not in run["models"]:
            run["models"] = [*run["models"], ident]
        run["answered_by"] = ident
        msg = response.message
        msg["id"] = msg_id
        if msg.get("tool_calls"):
            unique_call_ids(msg["tool_calls"], transcript)  # before anything keys on them
        new: list[dict[str, Any]] = [msg]

        if response.stop_reason == "content_filter":
            msg.pop("tool_calls", None)
            run["stop_reason"] = "content_filter"
            if not msg.get("content"):
                new = []
            return self._update(transcript, replaced, new, run), new
        if response.stop_reason == "max_tokens":
            # Cut off by the output-token cap: the text is kept, but no call runs (its
            # arguments may be cut too); each is answered, so the thread stays usable.
            run["stop_reason"] = "max_tokens"
            cut = msg.get("tool_calls")
            if cut:
                new.extend(not_run_messages(cut, "the reply was cut off at max_tokens"))
            return self._update(transcript, replaced, new, run), new

        ended = False
        if hooks.after_model:
            for name, fn in hooks.after_model:
                action = await self._hook(
                    name, "after_model", fn, run, [*transcript, msg], user_state
                )
                if action is None:
                    continue
                if action.messages is not None:
                    raise HookFailedError(
                        f"hook {name!r}: after_model cannot set `messages`; use `message` to "
                        "replace the reply",
                        hook=name,
                        method="after_model",
                    )
                if action.message is not None:
                    msg = _checked_reply(name, action.message, msg["id"])
                    if msg.get("tool_calls"):
                        unique_call_ids(msg["tool_calls"], transcript)
                    new[0] = msg
                if action.end:
                    ended = True
                    run["stop_reason"] = "hook_end"
                    run["output"] = action.output
                    break

        calls: list[dict[str, Any]] | None = msg.get("tool_calls")
        if ended:
            if calls:
                new.extend(not_run_messages(calls, "the run was ended by a hook"))
            return self._update(transcript, replaced, new, run), new
        if not calls:
            output = spec.output
            if output is None:
                run["stop_reason"] = "final_answer"
                return self._update(transcript, replaced, new, run), new
            value, problem = output.parse(msg.get("content") or "")
            if problem is None:
                run["stop_reason"] = "output"
                run["output"] = value
                return self._update(transcript, replaced, new, run), new
            new.append(
                {"role": "user", "content": output.correction(problem), "kind": "output_retry"}
            )
            update = self._update(transcript, replaced, new, run)
            return Command(update=update, goto="model"), new

        if run["tool_calls"] + len(calls) > limits.tool_calls:
            new.extend(not_run_messages(calls, "the run reached its tool call limit"))
            update = self._update(transcript, replaced, new, run)
            return self._limit(run, "tool_calls", limits.tool_calls, update), new

        base: dict[str, Any] = {"run_id": run["run_id"]}
        if user_state:
            base["state"] = dict(user_state)
        approvals = spec.approvals
        if approvals:
            requests = []
            for c in calls:
                rule = approvals.get(c["name"])
                if rule is not None and _gated(rule, c):
                    requests.append(rule.request(c).to_dict())
            if requests:
                return Command(
                    update=self._update(transcript, replaced, new, run),
                    goto=Send("approval", {**base, "calls": calls, "requests": requests}),
                ), new
        return Command(
            update=self._update(transcript, replaced, new, run),
            goto=[Send("tools", {**base, "call": c}) for c in calls],
        ), new

    @staticmethod
    def _update(
        transcript: list[dict[str, Any]],
        replaced: bool,
        new: list[dict[str, Any]],
        run: dict[str, Any],
    ) -> dict[str, Any]:
        if replaced:
            return {"messages": Overwrite([*transcript, *new]), "run": run}
        return {"messages": tuple(new), "run": run} if new else {"run": run}

    @staticmethod
    def _limit(
        run: dict[str, Any], limit: str, value: int, update: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        run["stop_reason"] = "limit"
        run["error"] = {"limit": limit, "value": value}
        if update is None:
            return {"run": run}
        update["run"] = run
        return update

    async def _hook(
        self,
        name: str,
        method: str,
        fn: Any,
        run: dict[str, Any],
        transcript: list[dict[str, Any]],
        user_state: Mapping[str, Any],
    ) -> HookAction | None:
        hook_states = run.get("hooks") or {}
        # The hook's own copies (see `HookContext`): it cannot change the run in place.
        ctx = HookContext.of_run(
            run["run_id"], transcript, run["model_calls"], hook_states.get(name), user_state
        )
        action = await call_run_hook(name, method, fn, ctx)
        if action is None:
            return None
        if not isinstance(action, HookAction):
            raise HookFailedError(
                f"hook {name!r}: {method} must return a HookAction or None, got "
                f"{type(action).__name__}",
                hook=name,
                method=method,
            )
        if action.saves_state:
            run["hooks"] = {**hook_states, name: action.state}
        redactor = run_redactor(self.spec)
        if redactor is None:
            return action
        return _redacted_action(redactor, action, copied_messages(ctx), transcript)

    async def _call_model(
        self, request: ModelRequest, writer: Writer | None, span: Any
    ) -> tuple[ModelResponse, Model]:
        spec = self.spec
        retry = spec.model_retry
        failures: list[ModelError] = []
        models = spec.models
        err: ModelError | None = None
        model = models[0]
        # A stream that fails part-way is tried again (or falls back) without repeating
        # what was already emitted: each attempt emits only text beyond it.
        text_sinks = _AttemptSinks(request.on_text)
        reasoning_sinks = _AttemptSinks(request.on_reasoning)

        for index, model in enumerate(models):
            attempt = 0
            while True:
                attempt += 1
                request.on_text = text_sinks.attempt()
                request.on_reasoning = reasoning_sinks.attempt()
                try:
                    return await model.generate(request), model
                except ModelError as exc:
                    err = exc
                if err.provider is None:
                    err.provider, err.model = model.provider, model.name
                if not err.transient or attempt >= retry.max_attempts:
                    break
                wait = retry.backoff(attempt)
                if err.retry_after is not None:
                    if err.retry_after > spec.max_retry_after_secs:
                        break  # asked to wait longer than we are willing to
                    wait = max(wait, err.retry_after)
                if writer is not None:
                    writer({"type": "other", "event": "model_retry", "node": "model"})
                if span is not None:
                    span.spans.event(
                        span.span,
                        "criogen.model_retry",
                        {"attempt": attempt, "error.type": err.kind, "wait_secs": wait},
                    )
                await asyncio.sleep(wait)
            failures.append(err)
            more = index + 1 < len(models)
            if not (more and (err.transient or err.kind in spec.fallback_on)):
                break
            if writer is not None:
                writer({"type": "other", "event": "model_fallback", "node": "model"})
            if span is not None:
                span.spans.event(
                    span.span,
                    "criogen.model_fallback",
                    {
                        "from": f"{model.provider}:{model.name}",
                        "to": f"{models[index + 1].provider}:{models[index + 1].name}",
                        "error.type": err.kind,
                    },
                )
        assert err is not None
        if err.kind == "content_filter":
            # A safety stop is an answer, not a crash: the run ends with that stop reason.
            return ModelResponse(
                {"role": "assistant", "content": ""}, empty_usage(), "content_filter"
            ), model
        raise _final_error(failures)


class _AttemptSinks:
    """Hands each attempt of a model call a sink that passes on only what no earlier
    attempt emitted already."""

    __slots__ = ("_emitted", "_sink")

    def __init__(self, sink: Callable[[str], None] | None) -> None:
        self._sink = sink
        self._emitted = 0

    def attempt(self) -> Callable[[str], None] | None:
        sink = self._sink
        if sink is None:
            return None
        seen = [0]

        def emit(piece: str) -> None:
            start, seen[0] = seen[0], seen[0] + len(piece)
            if seen[0] > self._emitted:
                sink(piece[max(0, self._emitted - start) :])
                self._emitted = seen[0]

        return emit


def _saw(seg: RunSegment, state: dict[str, Any], update: Any, new: list[dict[str, Any]]) -> None:
    """Tell the segment what this model step left (for `on_end` and its outcome)."""
    values = update.update if isinstance(update, Command) else update
    run = values.get("run") if isinstance(values, Mapping) else None
    seg.saw(state.get("messages") or [], new, run if run is not None else seg.run)


def _final_error(failures: list[ModelError]) -> ModelError:
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


def _gated(rule: Any, call: dict[str, Any]) -> bool:
    try:
        return bool(rule.applies(call.get("args") or {}))
    except Exception:
        # A predicate that fails cannot vouch for the call: a person decides.
        return True


_NOT_GIVEN: Any = object()


def _redacted_action(
    redactor: Any,
    action: HookAction,
    shown: list[dict[str, Any]],
    transcript: list[dict[str, Any]],
) -> HookAction:
    """What a hook writes into the run, under the policy too: the hook saw redacted
    text, but may add its own. A message it passes on as it was shown (`shown`, its
    copy of `transcript`), unchanged, is redacted already. A malformed message is left
    for the checks that reject it."""
    if action.messages is None and action.message is None and action.output is None:
        return action
    out = HookAction(end=action.end, output=redactor.redact_value(action.output))
    out.state = action.state

    def clean(m: Any) -> Any:
        if not isinstance(m, Mapping):
            return m
        try:
            return redact_messages(redactor, [dict(m)])[0]
        except (TypeError, AttributeError):
            return m

    if isinstance(action.messages, list | tuple):
        given = {id(c): m for c, m in zip(shown, transcript, strict=False)}
        out.messages = [
            m if given.get(id(m), _NOT_GIVEN) == m else clean(m) for m in action.messages
        ]
    else:
        out.messages = action.messages
    out.message = clean(action.message) if action.message is not None else None
    return out


def _checked_transcript(hook: str, messages: Any) -> list[dict[str, Any]]:
    if isinstance(messages, str | bytes) or not isinstance(messages, list | tuple):
        raise HookFailedError(
            f"hook {hook!r}: HookAction(messages=...) must be a list of message dicts",
            hook=hook,
            method="before_model",
        )
    out = []
    for i, m in enumerate(messages):
        try:
            m = normalize_message(dict(m) if isinstance(m, Mapping) else m)
        except ValueError as exc:
            raise HookFailedError(
                f"hook {hook!r}: HookAction(messages=...) message {i}: {exc}",
                hook=hook,
                method="before_model",
            ) from exc
        problem = _message_problem(m)
        if problem is not None:
            # Checked like a model's reply before anything is saved: a malformed message
            # in the thread would fail every later run on it.
            raise HookFailedError(
                f"hook {hook!r}: HookAction(messages=...) message {i} ({m.get('role')!r}): "
                f"{problem}",
                hook=hook,
                method="before_model",
            )
        out.append(m)
    return out


_ROLES = frozenset({"system", "user", "assistant", "tool"})


def _message_problem(m: dict[str, Any]) -> str | None:
    """What is wrong with a transcript message a hook wrote (None: nothing). Fixes up, in
    `m` (the hook's copy), the shape of good tool calls."""
    role = m.get("role")
    if role not in _ROLES:
        return f"role must be one of {sorted(_ROLES)}, got {role!r}"
    content = m.get("content")
    if content is not None and not isinstance(content, str | list):
        return f"content must be text or a list of content blocks, got {type(content).__name__}"
    if role == "tool":
        call_id = m.get("tool_call_id")
        if not isinstance(call_id, str) or not call_id:
            return "a tool result needs a 'tool_call_id' (the id of the call it answers)"
        return None
    calls = m.get("tool_calls")
    if role != "assistant" or calls is None:
        return None
    if not isinstance(calls, list | tuple):
        kind = type(calls).__name__
        return f"tool_calls must be a list of {{'id', 'name', 'args'}} dicts, got {kind}"
    fixed = []
    seen: set[str] = set()
    for c in calls:
        if not isinstance(c, Mapping):
            return f"each tool call must be a dict with 'id', 'name' and 'args', got {c!r:.80}"
        call_id, name, args = c.get("id"), c.get("name"), c.get("args")
        if not isinstance(call_id, str) or not call_id:
            return f"a tool call needs an 'id' (a non-empty str), got {call_id!r:.80}"
        if call_id in seen:
            return f"two tool calls have the id {call_id!r}; ids must be unique"
        seen.add(call_id)
        if not isinstance(name, str) or not name:
            return f"tool call {call_id!r} needs a 'name' (a non-empty str), got {name!r:.80}"
        if args is not None and not isinstance(args, Mapping):
            return f"tool call {call_id!r}: 'args' must be a dict, got {type(args).__name__}"
        fixed.append({**c, "args": dict(args or {})})
    if fixed:
        m["tool_calls"] = fixed
    else:
        m.pop("tool_calls", None)
    return None


def _checked_reply(hook: str, message: Any, msg_id: str) -> dict[str, Any]:
    if not isinstance(message, Mapping):
        raise HookFailedError(
            f"hook {hook!r}: HookAction(message=...) must be an assistant message dict",
            hook=hook,
            method="after_model",
        )
    out = dict(message)
    if out.setdefault("role", "assistant") != "assistant":
        raise HookFailedError(
            f"hook {hook!r}: the replacement reply must have role 'assistant'",
            hook=hook,
            method="after_model",
        )
    out.setdefault("content", "")
    out.setdefault("id", msg_id)
    calls = out.get("tool_calls")
    if calls:
        if not isinstance(calls, list | tuple):
            raise HookFailedError(
                f"hook {hook!r}: the replacement reply's tool_calls must be a list of "
                f"{{'name', 'args'}} dicts, got {type(calls).__name__}",
                hook=hook,
                method="after_model",
            )
        fixed = []
        for c in calls:
            if (
                not isinstance(c, Mapping)
                or not isinstance(c.get("name"), str)
                or not isinstance(c.get("args") or {}, Mapping)
            ):
                raise HookFailedError(
                    f"hook {hook!r}: each tool call needs a 'name' (text) and 'args' (a dict), "
                    f"got {c!r}",
                    hook=hook,
                    method="after_model",
                )
            # Other keys (the provider's own id, a signature) stay with the call.
            fixed.append(
                {**c, "id": c.get("id"), "name": c["name"], "args": dict(c.get("args") or {})}
            )
        out["tool_calls"] = fixed
    else:
        out.pop("tool_calls", None)
    return out
