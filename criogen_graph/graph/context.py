"""Compaction in the model node (see `criogen_graph.context.ContextPolicy`).

The stored transcript is never changed. What the model is sent is a view of it: a
summary of everything before message `through` (kept in the graph's `context` channel,
with a mark of message `through - 1` so a transcript that changed under it is noticed),
then the messages from `through` on, with old tool results replaced by a placeholder
when the budget asks for it. A new summary is written only when the view does not fit.

The `context` channel holds `{"summary", "through", "mark"}` once a summary exists, and
`calib`: what the previous call was sent (`through`, `upto` = transcript length,
`cleared`) and the input tokens the provider reported for it, so the next count is that
figure plus an estimate of what is new.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from criogen_graph.context import ContextPolicy
from criogen_graph.errors import ModelError
from criogen_graph.graph.model_call import STEP, Step
from criogen_graph.graph.spec import AgentSpec
from criogen_graph.graph.state import add_usage
from criogen_graph.messages import Message, RunRecord
from criogen_graph.middleware import ModelCall, ModelHandler
from criogen_graph.models.base import Model, ModelRequest
from criogen_graph.telemetry.observe import run_redactor

Messages = list[Message]

#: Characters per token by provider family; anything else: `DEFAULT_CHARS_PER_TOKEN`.
#: Anthropic's tokenizer packs English less densely than OpenAI's o200k and Gemini's.
CHARS_PER_TOKEN: Mapping[str, float] = {"anthropic": 3.5}
DEFAULT_CHARS_PER_TOKEN = 4.0
#: Role markers and separators a provider adds per message.
MESSAGE_OVERHEAD = 4
CLEARED = "[tool result cleared to fit the context budget]"
SUMMARY_HEADER = "Summary of the conversation so far:\n"
#: A tool result is cut to this many characters in what the summarizer reads.
_TOOL_RESULT_CHARS = 2000
_SUMMARY_INSTRUCTIONS = (
    "You keep a running summary of a conversation between a user and an AI assistant. "
    "Write one summary that merges the summary so far (if any) with the new messages. "
    "Keep every fact, name, number, decision, preference, tool result that still matters "
    "and open question needed to continue the conversation; drop small talk. Write at "
    "most {words} words. Reply with the summary only."
)


def chars_per_token(model: Model) -> float:
    """The characters-per-token rule of `model`'s provider family."""
    return CHARS_PER_TOKEN.get(model.provider, DEFAULT_CHARS_PER_TOKEN)


def message_chars(m: Mapping[str, Any]) -> int:
    """The characters of a message that count towards its tokens."""
    content = m.get("content")
    if isinstance(content, str):
        n = len(content)
    elif content:
        n = len(json.dumps(content, default=str))
    else:
        n = 0
    calls = m.get("tool_calls")
    if calls:
        n += len(json.dumps(calls, default=str))
    reasoning = m.get("reasoning")
    if isinstance(reasoning, str):
        n += len(reasoning)
    return n


def estimate(messages: Sequence[Mapping[str, Any]], cpt: float) -> int:
    """Estimated input tokens of `messages`."""
    chars = 0
    for m in messages:
        chars += message_chars(m)
    return int(chars / cpt) + MESSAGE_OVERHEAD * len(messages) + 1


def head_tokens(spec: AgentSpec, cpt: float) -> int:
    """Estimated tokens of what every call is sent besides the transcript: the
    instructions and the tool schemas."""
    chars = len(spec.instructions or "")
    if spec.tool_specs:
        chars += len(json.dumps(spec.tool_specs, default=str))
    return int(chars / cpt) + MESSAGE_OVERHEAD


def mark(m: Mapping[str, Any]) -> str:
    """What identifies a stored message: its id, else a digest of its role and content."""
    ident = m.get("id") or m.get("tool_call_id")
    if ident:
        return f"{m.get('role')}:{ident}"
    raw = f"{m.get('role')}\0{m.get('content')!r}"
    return hashlib.sha256(raw.encode("utf-8", "surrogatepass")).hexdigest()[:24]


def summary_message(summary: str) -> Message:
    return cast(Message, {"role": "user", "content": SUMMARY_HEADER + summary, "kind": "summary"})


def summarized_through(stored: Sequence[Message], ctx: Mapping[str, Any] | None) -> int:
    """How many stored messages the saved summary covers (0: none, or a summary of a
    transcript that has since changed, e.g. replaced by a hook)."""
    if not ctx:
        return 0
    through = ctx.get("through")
    if not isinstance(through, int) or not 0 < through <= len(stored):
        return 0
    if ctx.get("mark") != mark(stored[through - 1]) or not ctx.get("summary"):
        return 0
    return through


def tail_start(stored: Sequence[Message], keep_last: int, floor: int) -> int:
    """Where the newest `keep_last` messages start, moved back so no tool result is
    separated from the call that asked for it; never before `floor`."""
    i = max(floor, len(stored) - keep_last)
    while i > floor and stored[i]["role"] == "tool":
        i -= 1
    return i


@dataclass(slots=True)
class View:
    """What one model call is sent of the transcript, and how it was made."""

    messages: Messages
    start: int
    cleared: bool
    tokens: int
    ctx: dict[str, Any] | None
    compacted: bool = False


def build_view(
    stored: Sequence[Message], start: int, summary: str | None, keep_last: int, clear: bool
) -> Messages:
    """The summary (if any), the newest user message when the summary covers it and no
    later one exists, then the stored messages from `start` (old tool results cleared
    when `clear`)."""
    out: Messages = []
    rest = stored[start:]
    if start and summary:
        out.append(summary_message(summary))
        if not any(m["role"] == "user" for m in rest):
            for j in range(start - 1, -1, -1):
                if stored[j]["role"] == "user":
                    out.append(stored[j])
                    break
    if not clear:
        out.extend(rest)
        return out
    tail = tail_start(stored, keep_last, start)
    for i, m in enumerate(rest, start):
        if i < tail and m["role"] == "tool" and m.get("content") != CLEARED:
            out.append(cast(Message, {**m, "content": CLEARED}))
        else:
            out.append(m)
    return out


def current_view(
    spec: AgentSpec, policy: ContextPolicy, stored: Sequence[Message], ctx: Mapping[str, Any] | None
) -> View:
    """The view the saved summary gives, with old tool results cleared when the rest does
    not fit (no model call: a new summary is the node's to write)."""
    cpt = chars_per_token(spec.models[0])
    head = head_tokens(spec, cpt)
    start = summarized_through(stored, ctx)
    summary = cast(str, ctx["summary"]) if start and ctx else None
    calib = ctx.get("calib") if ctx else None
    kept = _kept(ctx, start)

    def count(view: Messages, cleared: bool) -> int:
        if (
            isinstance(calib, Mapping)
            and calib.get("through") == start
            and calib.get("cleared") == cleared
            and isinstance(calib.get("upto"), int)
            and 0 < calib["upto"] <= len(stored)
            and calib.get("tokens", 0) > 0
        ):
            return int(calib["tokens"]) + estimate(stored[calib["upto"] :], cpt)
        return head + estimate(view, cpt)

    plain = build_view(stored, start, summary, policy.keep_last, clear=False)
    tokens = count(plain, False)
    if tokens <= policy.max_input_tokens or not policy.clear_tool_results:
        return View(plain, start, False, tokens, kept)
    cleared = build_view(stored, start, summary, policy.keep_last, clear=True)
    return View(cleared, start, True, count(cleared, True), kept)


def _kept(ctx: Mapping[str, Any] | None, start: int) -> dict[str, Any] | None:
    """The summary part of `ctx`, when it still applies."""
    if not start or not ctx:
        return None
    return {"summary": ctx["summary"], "through": ctx["through"], "mark": ctx["mark"]}


def calibrated(view: View, stored_len: int, input_tokens: int) -> dict[str, Any]:
    """The `context` channel after a call that was sent `view` and reported
    `input_tokens`."""
    out = dict(view.ctx or {})
    if input_tokens > 0:
        out["calib"] = {
            "through": view.start,
            "upto": stored_len,
            "cleared": view.cleared,
            "tokens": input_tokens,
        }
    return out


class Compactor:
    """Makes the view of each model call fit the policy's budget, writing a summary
    (through the agent's model-call layers, without the user's middleware) when needed."""

    def __init__(self, spec: AgentSpec, policy: ContextPolicy, call: ModelHandler) -> None:
        self.spec = spec
        self.policy = policy
        self._call = call

    @property
    def summarizer(self) -> Model:
        model: Model | None = self.spec.summarizer
        return model if model is not None else self.spec.models[0]

    async def prepare(
        self,
        stored: Messages,
        ctx: Mapping[str, Any] | None,
        run: RunRecord,
        thread_id: str | None,
        user_state: Mapping[str, Any],
        *,
        harder: bool = False,
    ) -> View:
        """The view to send; a new summary first when the current one does not fit (or,
        `harder`, after the provider said the input was too long)."""
        spec, policy = self.spec, self.policy
        budget = policy.max_input_tokens
        cpt = chars_per_token(spec.models[0])
        head = head_tokens(spec, cpt)
        if head >= budget:
            raise self._overflow(
                f"the instructions and tool schemas alone take ~{head} tokens; raise "
                "max_input_tokens or shorten them"
            )
        view = current_view(spec, policy, stored, ctx)
        if not harder and view.tokens <= budget:
            return view
        cut = tail_start(stored, policy.keep_last, view.start)
        clear = policy.clear_tool_results
        if cut <= view.start:
            raise self._too_big(stored, view.start, head, cpt)
        kept = build_view(stored, cut, "x", policy.keep_last, clear=clear)[1:]
        room = budget - head - estimate(kept, cpt) - MESSAGE_OVERHEAD - len(SUMMARY_HEADER)
        if room < 16:
            raise self._too_big(stored, cut, head, cpt)
        summary = await self._summarize(
            view.ctx["summary"] if view.ctx else None,
            stored[view.start : cut],
            min(room, max(64, budget // 4)),
            room,
            run,
            thread_id,
            user_state,
        )
        ctx_new = {"summary": summary, "through": cut, "mark": mark(stored[cut - 1])}
        messages = build_view(stored, cut, summary, policy.keep_last, clear=clear)
        tokens = head + estimate(messages, cpt)
        run["compacted"] = True
        return View(messages, cut, clear, tokens, ctx_new, compacted=True)

    async def _summarize(
        self,
        previous: str | None,
        messages: Sequence[Message],
        target: int,
        room: int,
        run: RunRecord,
        thread_id: str | None,
        user_state: Mapping[str, Any],
    ) -> str:
        """The running summary with `messages` merged into it, in pieces that each fit
        the budget."""
        model = self.summarizer
        cpt = chars_per_token(model)
        budget = self.policy.max_input_tokens
        # What one summary call may be given of the conversation: the budget less the
        # running summary (at most `target`) and the instructions (~120 tokens).
        piece_chars = max(400, int((budget - target - 160) * cpt * 0.9))
        summary = previous
        for text in _pieces(messages, piece_chars):
            summary = await self._one(
                summary, text, model, target, room, run, thread_id, user_state
            )
        assert summary is not None
        return summary

    async def _one(
        self,
        previous: str | None,
        text: str,
        model: Model,
        target: int,
        room: int,
        run: RunRecord,
        thread_id: str | None,
        user_state: Mapping[str, Any],
    ) -> str:
        budget = self.policy.max_input_tokens
        words = max(30, int(target * 0.7))
        prompt = (
            f"Summary so far:\n{previous}\n\nNew messages:\n{text}"
            if previous
            else f"Messages:\n{text}"
        )
        request = ModelRequest(
            [
                {"role": "system", "content": _SUMMARY_INSTRUCTIONS.format(words=words)},
                {"role": "user", "content": prompt},
            ],
            [],
        )
        call = ModelCall(request, model, run["run_id"], thread_id, user_state, run["model_calls"])
        step = Step(None, None, None)
        step.summary = True
        token = STEP.set(step)
        try:
            response = await self._call(call)
        except ModelError as err:
            failed = ModelError(
                f"summarizing the thread to fit max_input_tokens={budget} failed: "
                f"{err.message} (nothing was lost; retry() runs again, or change the "
                "agent's ContextPolicy)",
                kind=err.kind,
                provider=err.provider,
                model=err.model,
                status=err.status,
                retry_after=err.retry_after,
                attempts=err.attempts,
            )
            raise failed from err
        finally:
            STEP.reset(token)
        run["usage"] = add_usage(run["usage"], response.usage)
        content = response.message.get("content")
        summary = content.strip() if isinstance(content, str) else ""
        answered = step.answered or model
        if not summary:
            raise ModelError(
                f"the summarizer {answered.provider}:{answered.name} returned an empty "
                f"summary, so the thread cannot be fitted into max_input_tokens={budget}",
                kind="bad_request",
                provider=answered.provider,
                model=answered.name,
            )
        redactor = run_redactor(self.spec)
        if redactor is not None:
            summary = redactor.redact(summary)
        size = estimate([summary_message(summary)], chars_per_token(self.spec.models[0]))
        if size > room:
            raise ModelError(
                f"the summarizer {answered.provider}:{answered.name} returned a summary of "
                f"~{size} tokens, over the ~{room} that max_input_tokens={budget} leaves "
                "beside the newest messages; raise max_input_tokens, lower keep_last or "
                "use another summarize_with model",
                kind="context_overflow",
                provider=answered.provider,
                model=answered.name,
            )
        return summary

    def _too_big(self, stored: Sequence[Message], start: int, head: int, cpt: float) -> ModelError:
        policy = self.policy
        newest = build_view(stored, start, None, policy.keep_last, clear=policy.clear_tool_results)
        biggest = max(newest, key=lambda m: message_chars(m), default=None)
        if biggest is not None:
            alone = estimate([biggest], cpt)
            if head + alone > policy.max_input_tokens:
                return self._overflow(
                    f"one {biggest['role']} message alone takes ~{alone} tokens (with "
                    f"instructions and tool schemas, ~{head + alone})"
                )
        return self._overflow(
            f"the newest {len(newest)} messages (keep_last={policy.keep_last}) take "
            f"~{estimate(newest, cpt)} tokens beside ~{head} for instructions and tool "
            "schemas, leaving no room for a summary; lower keep_last"
        )

    def _overflow(self, what: str) -> ModelError:
        model = self.spec.models[0]
        return ModelError(
            f"the context does not fit max_input_tokens={self.policy.max_input_tokens}: "
            f"{what}. Nothing was lost: change the agent's ContextPolicy and retry()",
            kind="context_overflow",
            provider=model.provider,
            model=model.name,
        )


def _pieces(messages: Sequence[Message], limit: int) -> list[str]:
    """The messages as text for the summarizer, in pieces of at most `limit`
    characters (a longer message is cut)."""
    pieces: list[str] = []
    current: list[str] = []
    size = 0
    for m in messages:
        line = _render(m)
        if len(line) > limit:
            line = line[: limit - 20] + " [... cut ...]"
        if current and size + len(line) > limit:
            pieces.append("\n\n".join(current))
            current, size = [], 0
        current.append(line)
        size += len(line) + 2
    if current:
        pieces.append("\n\n".join(current))
    return pieces


def _render(m: Mapping[str, Any]) -> str:
    role = m.get("role")
    content = m.get("content")
    text = content if isinstance(content, str) else json.dumps(content, default=str)
    if role == "tool":
        if len(text) > _TOOL_RESULT_CHARS:
            text = text[:_TOOL_RESULT_CHARS] + " [... cut ...]"
        return f"tool {m.get('name') or ''} result: {text}"
    if role == "assistant":
        calls = m.get("tool_calls") or ()
        asked = "; ".join(
            f"{c.get('name')}({json.dumps(c.get('args') or {}, default=str)})" for c in calls
        )
        if asked:
            text = f"{text}\n(called {asked})" if text else f"(called {asked})"
        return f"assistant: {text}"
    return f"{role}: {text}"
