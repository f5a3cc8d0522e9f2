"""The `model` node: limits, `before_model` hooks, the model call (through the layers of
`model_call`: the user's middleware, telemetry, callbacks, fallbacks, retries),
`after_model` hooks, typed output, and the routing of the reply's tool calls."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, cast

from langchain_core.runnables import RunnableConfig
from langgraph.types import Command, Overwrite, Send

from criogen_graph.errors import ModelError, ValidationError
from criogen_graph.graph.context import Compactor, View, calibrated, tail_start
from criogen_graph.graph.events import RedactedText, Writer, step_of, stream_writer
from criogen_graph.graph.hook_actions import checked_reply, checked_transcript, redacted_action
from criogen_graph.graph.invocation import Invocation, invocation_of
from criogen_graph.graph.model_call import STEP, Step, compose, finished
from criogen_graph.graph.spec import AgentSpec
from criogen_graph.graph.state import (
    add_usage,
    new_run,
    not_run_messages,
    tool_ran,
    unique_call_ids,
)
from criogen_graph.hooks import (
    HookAction,
    HookContext,
    HookFailedError,
    call_run_hook,
    copied_messages,
    copy_value,
)
from criogen_graph.messages import (
    AssistantMessage,
    LimitName,
    Message,
    RunRecord,
    StopReason,
    ToolCallData,
    ToolMessage,
)
from criogen_graph.middleware import Middleware, ModelCall
from criogen_graph.models.base import Model, ModelRequest, ModelResponse
from criogen_graph.redact import redact_messages
from criogen_graph.telemetry.callbacks import token_sink, wants_tokens
from criogen_graph.telemetry.observe import run_redactor

_EMPTY: Mapping[str, Any] = MappingProxyType({})
Update = dict[str, Any]
Messages = list[Message]
_KEEP: Any = object()


def _plain(messages: Messages) -> list[dict[str, Any]]:
    """The messages as the hook layer reads them: the plain dicts they are at run time."""
    return cast(list[dict[str, Any]], messages)


def _thread_id(config: RunnableConfig) -> str | None:
    thread_id: str | None = (config.get("configurable") or _EMPTY).get("thread_id")
    return thread_id


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


class _Turn:
    """What one model step works on: the run record, the transcript the model sees (a
    `before_model` hook may have replaced it), and the messages the step adds.

    With a `ContextPolicy`, `transcript` is the view the model is sent (`view`), and
    `stored` the whole transcript; a hook's replacement then changes only what is sent,
    unless the view is the whole transcript. `ctx` is the `context` channel to write."""

    __slots__ = (
        "ctx",
        "new",
        "replaced",
        "reply",
        "run",
        "stored",
        "transcript",
        "user_state",
        "view",
        "viewed",
    )

    def __init__(self, run: RunRecord, transcript: Messages, user_state: Mapping[str, Any]) -> None:
        self.run = run
        self.transcript = transcript
        self.stored = transcript
        self.user_state = user_state
        self.replaced = False
        self.new: Messages = []
        #: The model's reply (or the `after_model` hook's replacement), `new[0]`.
        self.reply: AssistantMessage = {"role": "assistant", "content": ""}
        self.view: View | None = None
        self.viewed = False
        self.ctx: dict[str, Any] | None = None

    def show(self, view: View) -> None:
        """Send the model `view` instead of the stored transcript."""
        self.view = view
        self.viewed = bool(view.start or view.cleared)
        if self.viewed:
            self.transcript = view.messages
        if view.compacted:
            self.ctx = dict(view.ctx or {})

    @property
    def known(self) -> Messages:
        """The whole transcript as it will be stored (what call ids must be unique in)."""
        return self.stored if self.viewed else self.transcript

    def set_reply(self, msg: AssistantMessage) -> None:
        self.reply = msg
        if self.new:
            self.new[0] = msg
        else:
            self.new = [msg]

    def update(self) -> Update:
        """The node's state update for what the step did."""
        out: Update
        if self.replaced and not self.viewed:
            out = {"messages": Overwrite([*self.transcript, *self.new]), "run": self.run}
        elif self.new:
            out = {"messages": tuple(self.new), "run": self.run}
        else:
            out = {"run": self.run}
        if self.ctx is not None:
            out["context"] = self.ctx
        return out

    def stop(self, reason: StopReason, output: Any = _KEEP) -> Update:
        self.run["stop_reason"] = reason
        if output is not _KEEP:
            self.run["output"] = output
        return self.update()

    def limit(self, limit: LimitName, value: int) -> Update:
        self.run["stop_reason"] = "limit"
        self.run["error"] = {"limit": limit, "value": value}
        return self.update()


class ModelNode:
    """One model call per superstep."""

    def __init__(self, spec: AgentSpec) -> None:
        self.spec = spec
        self._call, self._wrapped = compose(spec)
        self._compactor = (
            Compactor(spec, spec.context, compose(spec, user=False)[0])
            if spec.context is not None
            else None
        )
        # A middleware may re-ask the model or rewrite its reply: stream clients get the
        # text it keeps, once it has, unless every one says it leaves the text alone.
        self._hold_text = any(
            not m.passes_text
            for m in spec.middleware
            if type(m).wrap_model_call is not Middleware.wrap_model_call
        )

    async def __call__(self, state: dict[str, Any], config: RunnableConfig) -> Any:
        if not self.spec.loaded:
            await self.spec.ensure_tools()  # a graph run without the API (Studio)
        seg = invocation_of(config)
        writer = stream_writer(config)
        if writer is None:
            update, new = await self._run(state, config, None, seg)
            if seg is not None:
                _saw(seg, state, update, new)
            return update
        step = step_of(config)
        writer({"type": "other", "event": "step_started", "node": "model", "step": step})
        update, new = await self._run(state, config, writer, seg)
        if seg is not None:
            _saw(seg, state, update, new)
        for m in new:
            writer({"type": "message", "message": m})
        writer({"type": "other", "event": "step_finished", "node": "model", "step": step})
        return update

    async def _run(
        self,
        state: dict[str, Any],
        config: RunnableConfig,
        writer: Writer | None,
        seg: Invocation | None,
    ) -> tuple[Any, Messages]:
        """The node's update, and the messages it adds (for `message` events)."""
        messages: Messages = state.get("messages") or []
        user_state: Mapping[str, Any] = state.get("state") or _EMPTY
        run = await _begin(state.get("run"), seg, messages, user_state)
        early = _tool_results(run, messages) or _over_limit(self.spec, run)
        if early is not None:
            return early, []
        turn = _Turn(run, messages, user_state)
        if self._compactor is not None:
            view = await self._compactor.prepare(
                messages, state.get("context"), run, _thread_id(config), user_state
            )
            turn.show(view)
        ended = await self._before_model(turn)
        if ended is not None:
            return ended, []
        response = await self._answer(turn, config, writer)
        cut = _cut_short(turn, response.stop_reason)
        if cut is not None:
            return cut, turn.new
        if await self._after_model(turn):
            calls = turn.reply.get("tool_calls")
            if calls:
                turn.new.extend(not_run_messages(calls, "the run was ended by a hook"))
            return turn.update(), turn.new
        return self._route(turn), turn.new

    async def _before_model(self, turn: _Turn) -> Update | None:
        """Run the `before_model` hooks; the update when one ended the run."""
        for name, fn in self.spec.hooks.before_model:
            action = await self._hook(name, "before_model", fn, turn.run, turn.transcript, turn)
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
                turn.transcript = checked_transcript(name, action.messages)
                turn.replaced = True
            if action.end:
                turn.run["stop_reason"] = "hook_end"
                turn.run["output"] = action.output
                return turn.update()
        return None

    async def _after_model(self, turn: _Turn) -> bool:
        """Run the `after_model` hooks on the reply (`turn.new[0]`); True if one ended
        the run."""
        for name, fn in self.spec.hooks.after_model:
            msg = turn.reply
            shown: Messages = [*turn.transcript, msg]
            action = await self._hook(name, "after_model", fn, turn.run, shown, turn)
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
                msg = checked_reply(name, action.message, msg.get("id", ""))
                if msg.get("tool_calls"):
                    unique_call_ids(msg["tool_calls"], turn.known)
                turn.set_reply(msg)
            if action.end:
                turn.run["stop_reason"] = "hook_end"
                turn.run["output"] = action.output
                return True
        return False

    def _request(self, turn: _Turn, recalled: Message | None) -> ModelRequest:
        spec = self.spec
        head: Messages = [spec.system_message] if spec.system_message is not None else []
        if recalled is not None:
            head.append(recalled)
        messages = [*head, *turn.transcript] if head else turn.transcript
        if self._wrapped:
            # The user's middleware gets its own copy, like a hook: changing it in place
            # cannot change the saved transcript.
            messages = cast(Messages, copy_value(messages))
        schema = spec.output.schema if spec.output is not None else None
        return ModelRequest(messages, spec.tool_specs, schema)

    async def _answer(
        self, turn: _Turn, config: RunnableConfig, writer: Writer | None
    ) -> ModelResponse:
        """Call the model (through its layers) and record its reply in the turn."""
        spec = self.spec
        recalled = None
        if spec.memory is not None:
            store = _memory_store()
            recalled = await spec.memory.recall_message(store, turn.user_state, turn.transcript)
        request = self._request(turn, recalled)
        msg_id = "msg_" + uuid.uuid4().hex
        redactor = run_redactor(spec)
        held = _sinks(request, None if self._hold_text else writer, redactor, msg_id)
        if request.on_text is None and not self._hold_text and wants_tokens():
            request.on_text = _no_text  # the chat-model run's handler reads the tokens
        # Ahead of the step's sinks: a retried attempt does not repeat tokens either.
        request.on_text = token_sink(request.on_text)
        step = Step(writer, request.on_text, request.on_reasoning)
        run = turn.run
        call = ModelCall(
            request,
            spec.models[0],
            run["run_id"],
            (config.get("configurable") or _EMPTY).get("thread_id"),
            turn.user_state,
            run["model_calls"],
        )
        token = STEP.set(step)
        try:
            response = await self._call_fitting(call, turn, config, recalled)
        except ModelError as err:
            response = finished(err)
        finally:
            STEP.reset(token)
        if turn.view is not None:
            self._calibrate(turn, response.usage.get("input_tokens", 0))
        if redactor is not None:
            # Ahead of every hook: what is saved, streamed and exported is redacted.
            response.message = redact_messages(redactor, [response.message])[0]
            for sink in held:
                sink.finish()
        _record(run, response, step.answered or spec.models[0])
        msg = response.message
        msg["id"] = msg_id
        if self._hold_text and writer is not None:
            _kept_reply_events(writer, msg, msg_id)
        if msg.get("tool_calls"):
            unique_call_ids(msg["tool_calls"], turn.known)  # before anything keys on them
        turn.set_reply(msg)
        return response

    async def _call_fitting(
        self, call: ModelCall, turn: _Turn, config: RunnableConfig, recalled: Any
    ) -> ModelResponse:
        """The model's reply; after a context overflow the policy compacts harder, the
        call is made once more with the smaller view."""
        try:
            return await self._call(call)
        except ModelError as err:
            if not await self._compact_harder(err, turn, config):
                raise
            request = call.request
            again = self._request(turn, recalled)
            again.on_text, again.on_reasoning = request.on_text, request.on_reasoning
            return await self._call(call.replace(request=again))

    async def _compact_harder(self, err: ModelError, turn: _Turn, config: RunnableConfig) -> bool:
        """After a provider's context-overflow error: summarize all but the newest
        messages, once, when the policy says so; whether the call is to be made again."""
        compactor = self._compactor
        view = turn.view
        if (
            compactor is None
            or view is None
            or err.kind != "context_overflow"
            or compactor.policy.on_overflow != "compact"
            or turn.replaced
            or tail_start(turn.stored, compactor.policy.keep_last, view.start) <= view.start
        ):
            # Nothing older than the newest messages to summarize: the provider's error
            # says best what did not fit.
            return False
        try:
            harder = await compactor.prepare(
                turn.stored,
                turn.ctx if turn.ctx is not None else view.ctx,
                turn.run,
                _thread_id(config),
                turn.user_state,
                harder=True,
            )
        except ModelError as own:
            raise own from err
        turn.show(harder)
        return True

    def _calibrate(self, turn: _Turn, input_tokens: int) -> None:
        """Keep the provider's count of what this call was sent, for the next count."""
        view = turn.view
        assert view is not None
        if turn.replaced:
            turn.ctx = dict(view.ctx or {})
        else:
            turn.ctx = calibrated(view, len(turn.stored), input_tokens)

    def _route(self, turn: _Turn) -> Any:
        """Where the run goes after the reply: the end (an answer, typed output), the
        model again (output that did not parse), approval, or the tool calls."""
        spec = self.spec
        run = turn.run
        msg = turn.reply
        calls = msg.get("tool_calls")
        if not calls:
            return self._answered(turn, msg)
        limit = spec.limits.tool_calls
        if run["tool_calls"] + len(calls) > limit:
            turn.new.extend(not_run_messages(calls, "the run reached its tool call limit"))
            return turn.limit("tool_calls", limit)
        base: dict[str, Any] = {"run_id": run["run_id"]}
        if turn.user_state:
            base["state"] = dict(turn.user_state)
        requests = _approval_requests(spec, calls)
        if requests:
            return Command(
                update=turn.update(),
                goto=Send("approval", {**base, "calls": calls, "requests": requests}),
            )
        return Command(
            update=turn.update(), goto=[Send("tools", {**base, "call": c}) for c in calls]
        )

    def _answered(self, turn: _Turn, msg: AssistantMessage) -> Any:
        output = self.spec.output
        if output is None:
            return turn.stop("final_answer")
        value, problem = output.parse(msg.get("content") or "")
        if problem is None:
            return turn.stop("output", value)
        turn.new.append(
            {"role": "user", "content": output.correction(problem), "kind": "output_retry"}
        )
        return Command(update=turn.update(), goto="model")

    async def _hook(
        self,
        name: str,
        method: str,
        fn: Any,
        run: RunRecord,
        transcript: Messages,
        turn: _Turn,
    ) -> HookAction | None:
        hook_states = run.get("hooks") or {}
        # The hook's own copies (see `HookContext`): it cannot change the run in place.
        ctx = HookContext(
            run["run_id"], transcript, run["model_calls"], hook_states.get(name), turn.user_state
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
        return redacted_action(redactor, action, copied_messages(ctx), transcript)


async def _begin(
    prev: RunRecord | None,
    seg: Invocation | None,
    messages: Messages,
    user_state: Mapping[str, Any],
) -> RunRecord:
    """The run record this step works on (a new one for a run started without the API,
    e.g. from LangGraph Studio), with the hook states `on_start` saved."""
    if not prev or not prev.get("run_id") or prev.get("stop_reason") is not None:
        run = new_run(uuid.uuid4().hex, prev.get("hooks") if prev else None)
    else:
        run = cast(RunRecord, dict(prev))
    if seg is not None:
        # The segment's first node runs `on_start`; states it saved in a node that could
        # not write them (a tool call's task) are written here.
        if not seg.started:
            states = await seg.start(run, _plain(messages), user_state)
        else:
            states, seg.unsaved_states = seg.unsaved_states, None
        if states is not None:
            run["hooks"] = states
    return run


def _tool_results(run: RunRecord, messages: Messages) -> Update | None:
    """Account for the tool calls answered since the previous model call; the update when
    one of them ends the run (`return_direct`)."""
    i = len(messages)
    ran = 0
    direct: ToolMessage | None = None
    while i and messages[i - 1]["role"] == "tool":
        i -= 1
        m = cast(ToolMessage, messages[i])
        if tool_ran(m):
            ran += 1
        sub_usage = m.get("usage")
        if sub_usage:
            run["usage"] = add_usage(run["usage"], sub_usage)
        if m.get("return_direct") and m.get("status") == "ok":
            direct = m  # walking backwards: ends on the first in call order
    if ran:
        run["tool_calls"] = run["tool_calls"] + ran
    if direct is None:
        return None
    run["stop_reason"] = "return_direct"
    run["output"] = direct.get("content")
    return {"run": run}


def _over_limit(spec: AgentSpec, run: RunRecord) -> Update | None:
    limits = spec.limits
    if run["model_calls"] >= limits.model_calls:
        return _Turn(run, [], _EMPTY).limit("model_calls", limits.model_calls)
    if limits.tokens is not None:
        usage = run["usage"]
        if usage["input_tokens"] + usage["output_tokens"] >= limits.tokens:
            return _Turn(run, [], _EMPTY).limit("tokens", limits.tokens)
    return None


def _sinks(
    request: ModelRequest, writer: Writer | None, redactor: Any, msg_id: str
) -> tuple[RedactedText, ...]:
    """Point the request's stream sinks at the writer (through redaction, which holds
    back text a secret may still be arriving in); the held sinks to finish."""
    if writer is None:
        return ()

    def emit(text: str) -> None:
        writer({"type": "text", "message_id": msg_id, "text": text})

    def emit_reasoning(text: str) -> None:
        writer({"type": "reasoning", "message_id": msg_id, "text": text})

    if redactor is None:
        request.on_text, request.on_reasoning = emit, emit_reasoning
        return ()
    held = RedactedText(redactor, emit), RedactedText(redactor, emit_reasoning)
    request.on_text, request.on_reasoning = held
    return held


def _no_text(text: str) -> None:
    pass


def _record(run: RunRecord, response: ModelResponse, model: Model) -> None:
    run["model_calls"] = run["model_calls"] + 1
    run["usage"] = add_usage(run["usage"], response.usage)
    ident = model.identity
    if ident not in run["models"]:
        run["models"] = [*run["models"], ident]
    run["answered_by"] = ident


def _cut_short(turn: _Turn, stop_reason: str | None) -> Update | None:
    """The update for a reply the provider stopped early, else None."""
    msg = turn.reply
    if stop_reason == "content_filter":
        msg.pop("tool_calls", None)
        if not msg.get("content"):
            turn.new = []
        return turn.stop("content_filter")
    if stop_reason == "max_tokens":
        # Cut off by the output-token cap: the text is kept, but no call runs (its
        # arguments may be cut too); each is answered, so the thread stays usable.
        cut = msg.get("tool_calls")
        if cut:
            turn.new.extend(not_run_messages(cut, "the reply was cut off at max_tokens"))
        return turn.stop("max_tokens")
    return None


def _approval_requests(spec: AgentSpec, calls: list[ToolCallData]) -> list[dict[str, Any]]:
    approvals = spec.approvals
    if not approvals:
        return []
    requests = []
    for c in calls:
        rule = approvals.get(c["name"])
        if rule is not None and _gated(rule, c):
            requests.append(rule.request(c).to_dict())
    return requests


def _saw(seg: Invocation, state: dict[str, Any], update: Any, new: Messages) -> None:
    """Tell the segment what this model step left (for `on_end` and its outcome)."""
    values = update.update if isinstance(update, Command) else update
    run = values.get("run") if isinstance(values, Mapping) else None
    seg.saw(state.get("messages") or [], _plain(new), run if run is not None else seg.run)


def _gated(rule: Any, call: ToolCallData) -> bool:
    try:
        return bool(rule.applies(call.get("args") or {}))
    except Exception:
        # A predicate that fails cannot vouch for the call: a person decides.
        return True


def _kept_reply_events(writer: Writer, msg: Mapping[str, Any], msg_id: str) -> None:
    """The reply a middleware kept (already redacted), as one event of each kind."""
    if msg.get("reasoning"):
        writer({"type": "reasoning", "message_id": msg_id, "text": msg["reasoning"]})
    if msg.get("content"):
        writer({"type": "text", "message_id": msg_id, "text": msg["content"]})
