"""Real models in the field, round two: recorded replies nobody here wrote (DeepSeek's and
OpenRouter's Responses endpoints, GPT-5.5 with `phase`, o3-mini without encrypted
reasoning, Mistral's Magistral through the OpenAI-compatible adapter, Anthropic's web
search server tool), replayed byte for byte over loopback HTTP from
tests/fixtures/provider_replay/, and compared with the request the recording's own client
sent next. Every request body is checked against the official SDK's typed params."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from anthropic.types.message_create_params import (
    MessageCreateParamsNonStreaming,
    MessageCreateParamsStreaming,
)
from openai.types.chat.completion_create_params import (
    CompletionCreateParamsNonStreaming,
    CompletionCreateParamsStreaming,
)
from openai.types.responses.response_create_params import (
    ResponseCreateParamsNonStreaming,
    ResponseCreateParamsStreaming,
)

from criogen_graph import (
    Agent,
    Model,
    ModelError,
    ReasoningEvent,
    Retry,
    TextEvent,
    anthropic,
    openai,
    openai_responses,
    tool,
)
from tests.servers.replay_server import ReplayServer, load
from tests.typed_bodies import assert_request

NO_WAIT = Retry(max_attempts=3, initial_backoff_secs=0, jitter=False)
_OPEN: list[Model] = []


@tool
async def get_temperature(city: str) -> str:
    """Get the current temperature in a city."""
    return "21.0"


@tool
async def get_capital(country: str) -> str:
    """Get the capital of a country."""
    return "Potato City"


@pytest.fixture
def srv() -> Iterator[ReplayServer]:
    with ReplayServer() as server:
        yield server


@pytest.fixture(autouse=True)
async def close_models() -> AsyncIterator[None]:
    yield
    while _OPEN:
        await _OPEN.pop().aclose()


def responses(server: ReplayServer, name: str, **kw: Any) -> Any:
    m = openai_responses(name, api_key="sk-test", base_url=server.base_url + "/v1", **kw)
    _OPEN.append(m)
    return m


def chat(server: ReplayServer, name: str, **kw: Any) -> Any:
    m = openai(name, api_key="sk-test", base_url=server.base_url + "/v1", **kw)
    _OPEN.append(m)
    return m


def claude(server: ReplayServer, name: str, **kw: Any) -> Any:
    m = anthropic(name, api_key="test", base_url=server.base_url, **kw)
    _OPEN.append(m)
    return m


async def run(a: Agent[Any], prompt: str, *, streamed: bool, thread: str = "t") -> Any:
    """The reply and, when streamed, its events."""
    if not streamed:
        return await a.thread(thread).send(prompt), []
    stream = a.thread(thread).stream(prompt)
    events = [e async for e in stream]
    return await stream.reply(), events


def texts(events: list[Any], message_id: str | None = None) -> str:
    return "".join(
        e.text for e in events if isinstance(e, TextEvent) and message_id in (None, e.message_id)
    )


def check_responses_bodies(server: ReplayServer) -> None:
    """Every request fits the `openai` SDK's typed Responses params (no unknown keys)."""
    assert server.requests
    for body in server.requests:
        typed: Any = (
            ResponseCreateParamsStreaming
            if body.get("stream")
            else ResponseCreateParamsNonStreaming
        )
        assert_request(body, typed)
        json.dumps(body, allow_nan=False)


def check_chat_bodies(server: ReplayServer) -> None:
    assert server.requests
    for body in server.requests:
        typed: Any = (
            CompletionCreateParamsStreaming
            if body.get("stream")
            else CompletionCreateParamsNonStreaming
        )
        assert_request(body, typed)


def check_anthropic_bodies(server: ReplayServer) -> None:
    assert server.requests
    for body in server.requests:
        typed: Any = (
            MessageCreateParamsStreaming if body.get("stream") else MessageCreateParamsNonStreaming
        )
        assert_request(body, typed)


def reasoning_inputs(body: dict[str, Any]) -> list[dict[str, Any]]:
    return [i for i in body["input"] if i.get("type") == "reasoning"]


# -- 1. reasoning items that carry their text ----------------------------------------------


@pytest.mark.parametrize("streamed", [False, True])
async def test_reasoning_text_goes_back_as_the_recorded_client_sent_it(
    srv: ReplayServer, streamed: bool
) -> None:
    first, after = (
        ("deepseek_reasoning_text_stream_function_call", "deepseek_stream_text_after_tool")
        if streamed
        else ("deepseek_reasoning_text_function_call", "deepseek_text_after_tool")
    )
    srv.replay(f"openai_responses/{first}", f"openai_responses/{after}")
    agent = Agent(responses(srv, "deepseek-v4-flash"), tools=[get_temperature], model_retry=NO_WAIT)
    reply, events = await run(agent, "What is the temperature in Tokyo?", streamed=streamed)
    assert reply.text.replace("**", "") == "The current temperature in Tokyo is 21.0°C."
    sent_back = load(f"openai_responses/{first}")["sent_back"]
    thought = sent_back["content"][0]["text"]
    # The model's reasoning is the reply's reasoning, streamed as it was written.
    turn = next(m for m in reply.messages if m.get("tool_calls"))
    assert turn["reasoning"] == thought
    if streamed:
        assert "".join(e.text for e in events if isinstance(e, ReasoningEvent)) == thought
    # The next request carries the reasoning text back, as the recording's client sent it.
    assert reasoning_inputs(srv.requests[1]) == [sent_back]
    check_responses_bodies(srv)


async def test_reasoning_text_survives_the_thread_and_goes_back_every_turn(
    srv: ReplayServer,
) -> None:
    srv.replay(
        "openai_responses/deepseek_reasoning_text_function_call",
        "openai_responses/deepseek_text_after_tool",
        "openai_responses/deepseek_text_after_tool",
    )
    thread = Agent(responses(srv, "deepseek-v4-flash"), tools=[get_temperature]).thread("tokyo")
    await thread.send("What is the temperature in Tokyo?")
    await thread.send("And tomorrow?")
    sent_back = load("openai_responses/deepseek_reasoning_text_function_call")["sent_back"]
    assert reasoning_inputs(srv.requests[2]) == [sent_back]
    check_responses_bodies(srv)


# -- 5. reasoning items with neither encrypted content nor text ----------------------------


@pytest.mark.parametrize("reasoning", [False, None])
async def test_an_id_only_reasoning_item_is_never_sent_back_without_storage(
    srv: ReplayServer, reasoning: bool | None, caplog: pytest.LogCaptureFixture
) -> None:
    fixture = "openai_responses/o3_mini_reasoning_without_content"
    srv.replay(fixture, fixture)
    thread = Agent(responses(srv, "o3-mini", reasoning=reasoning)).thread("alfajor")
    first = await thread.send("Explain me how to cook uruguayan alfajor.")
    assert first.text.startswith("Ingredients for the dough:")
    # Kept on the message (an `extra_body={"store": True}` server can resolve it) ...
    kept = first.messages[-1]["reasoning_items"]
    assert kept == [{"id": "rs_67e539329f808191ae793066c0ee20800e395386ebcf3a62", "summary": []}]
    with caplog.at_level(logging.DEBUG, logger="criogen_graph.models"):
        await thread.send("And without butter?")
    # ... but under store: false an id alone is refused ("Items are not persisted"): left out.
    second = srv.requests[1]
    assert second["store"] is False
    assert reasoning_inputs(second) == []
    assert [i["role"] for i in second["input"]] == ["user", "assistant", "user"]
    assert "rs_67e539329f808191ae793066c0ee20800e395386ebcf3a62" in caplog.text
    assert "store: false" in caplog.text
    check_responses_bodies(srv)


async def test_with_stored_items_the_id_alone_goes_back(srv: ReplayServer) -> None:
    fixture = "openai_responses/o3_mini_reasoning_without_content"
    srv.replay(fixture, fixture)
    model = responses(srv, "o3-mini", reasoning=False, extra_body={"store": True})
    thread = Agent(model).thread("stored")
    await thread.send("Explain me how to cook uruguayan alfajor.")
    await thread.send("And without butter?")
    assert srv.requests[1]["store"] is True
    assert reasoning_inputs(srv.requests[1]) == [
        {
            "type": "reasoning",
            "id": "rs_67e539329f808191ae793066c0ee20800e395386ebcf3a62",
            "summary": [],
        }
    ]


# -- 2. item ids that change during a stream -----------------------------------------------


async def test_item_ids_come_from_the_completed_response(srv: ReplayServer) -> None:
    fixture = "openai_responses/openrouter_gpt_oss_stream_ids_change"
    srv.replay(fixture, fixture)
    thread = Agent(responses(srv, "openai/gpt-oss-20b"), model_retry=NO_WAIT).thread("sum")
    stream = thread.stream("What is 2+2?")
    events = [e async for e in stream]
    reply = await stream.reply()
    assert reply.text == texts(events) == "4"
    thought = (
        'The user asks: "What is 2+2?" They expect a straightforward answer: 4. Just answer 4.'
    )
    assert "".join(e.text for e in events if isinstance(e, ReasoningEvent)) == thought
    # What the `openai` SDK's final response holds: the id of response.completed.
    assert reply.messages[-1]["reasoning_items"] == [
        {"id": "rs_tmp_ku4i7pagjwn", "summary": [], "content": [thought]}
    ]
    assert reply.messages[-1]["reasoning"] == thought
    again = thread.stream("And 3+3?")
    _ = [e async for e in again]
    assert reasoning_inputs(srv.requests[1]) == [
        {
            "type": "reasoning",
            "id": "rs_tmp_ku4i7pagjwn",
            "summary": [],
            "content": [{"type": "reasoning_text", "text": thought}],
        }
    ]
    check_responses_bodies(srv)


def test_the_recorded_stream_is_what_the_sdk_reads() -> None:
    """The fixture's final response, read by the `openai` SDK, names the item as we do."""
    import pydantic
    from openai.types.responses import ResponseOutputItem

    lines = load("openai_responses/openrouter_gpt_oss_stream_ids_change")["sse"]
    events = [json.loads(x[6:]) for x in lines if x.startswith("data: {")]
    done = next(e for e in events if e["type"] == "response.completed")
    output = pydantic.TypeAdapter(list[ResponseOutputItem]).validate_python(
        done["response"]["output"]
    )
    assert output[0].id == "rs_tmp_ku4i7pagjwn"
    added = next(e for e in events if e["type"] == "response.output_item.added")
    assert added["item"]["id"] == "rs_tmp_2kbe7x16sax"


# -- 3. `phase` on output messages ---------------------------------------------------------

PREAMBLE = 'I\'ll check the capital lookup tool for "PotatoLand."'
ANSWER = "The capital of PotatoLand is **Potato City**."


@pytest.mark.parametrize("streamed", [False, True])
async def test_phase_is_kept_and_sent_back(srv: ReplayServer, streamed: bool) -> None:
    prefix = "gpt55_stream_" if streamed else "gpt55_"
    srv.replay(
        f"openai_responses/{prefix}commentary_function_call",
        f"openai_responses/{prefix}final_answer",
        f"openai_responses/{prefix}final_answer",
    )
    agent = Agent(
        responses(srv, "gpt-5.5"),
        instructions="Briefly narrate what you are about to do before calling each tool.",
        tools=[get_capital],
        model_retry=NO_WAIT,
    )
    reply, events = await run(
        agent, "What is the capital of PotatoLand?", streamed=streamed, thread="potato"
    )
    preamble = PREAMBLE if not streamed else "I’ll check the capital lookup tool for “PotatoLand.”"
    assert reply.text == ANSWER
    turn = next(m for m in reply.messages if m.get("tool_calls"))
    assert turn["content"] == preamble and turn["phase"] == "commentary"
    assert reply.messages[-1]["phase"] == "final_answer"
    if streamed:
        # Each message's streamed text is its saved text.
        assert texts(events, turn["id"]) == preamble
        assert texts(events, reply.messages[-1]["id"]) == ANSWER
    # The preamble goes back with its phase, before the call it announced (the recorded
    # client sent the same item, as an output message).
    said = [i for i in srv.requests[1]["input"] if i.get("role") == "assistant"]
    assert said == [
        {"type": "message", "role": "assistant", "content": preamble, "phase": "commentary"}
    ]
    kinds = [i.get("type") for i in srv.requests[1]["input"]]
    assert kinds[-3:] == ["message", "function_call", "function_call_output"]
    await run(agent, "Thanks", streamed=streamed, thread="potato")
    said = [i for i in srv.requests[2]["input"] if i.get("role") == "assistant"]
    assert [(i["content"], i["phase"]) for i in said] == [
        (preamble, "commentary"),
        (ANSWER, "final_answer"),
    ]
    check_responses_bodies(srv)


@pytest.mark.parametrize("streamed", [False, True])
async def test_a_preamble_and_a_final_answer_in_one_reply(
    srv: ReplayServer, streamed: bool
) -> None:
    """The two recorded message items of gpt-5.5 in one reply (as OpenAI documents it):
    the answer is the final answer, the preamble is kept apart and goes back before it."""
    recorded = load("openai_responses/gpt55_commentary_function_call")
    preamble_item = next(i for i in recorded["body"]["output"] if i["type"] == "message")
    final = load("openai_responses/gpt55_final_answer")
    answer_item = final["body"]["output"][0]
    body = {**final["body"], "output": [preamble_item, answer_item]}
    if not streamed:
        srv.add({"source": "two recorded gpt-5.5 items in one reply", "body": body})
    else:
        events = []
        for index, item in enumerate(body["output"]):
            events.append(
                {
                    "type": "response.output_item.added",
                    "output_index": index,
                    "item": {**item, "content": []},
                }
            )
            for piece in (item["content"][0]["text"][:9], item["content"][0]["text"][9:]):
                events.append(
                    {
                        "type": "response.output_text.delta",
                        "output_index": index,
                        "item_id": item["id"],
                        "content_index": 0,
                        "delta": piece,
                    }
                )
            events.append(
                {"type": "response.output_item.done", "output_index": index, "item": item}
            )
        events.append({"type": "response.completed", "response": body})
        sse = [line for e in events for line in (f"data: {json.dumps(e)}", "")]
        srv.add({"source": "two recorded gpt-5.5 items in one reply", "sse": sse})
    srv.replay("openai_responses/gpt55_final_answer")
    agent = Agent(responses(srv, "gpt-5.5"), model_retry=NO_WAIT)
    reply, events = await run(agent, "What is the capital of PotatoLand?", streamed=streamed)
    assert reply.text == ANSWER
    assert reply.messages[-1]["commentary"] == PREAMBLE
    if streamed:
        assert texts(events) == ANSWER
    await agent.thread("t").send("Thanks")
    said = [i for i in srv.requests[1]["input"] if i.get("role") == "assistant"]
    assert [(i["content"], i["phase"]) for i in said] == [
        (PREAMBLE, "commentary"),
        (ANSWER, "final_answer"),
    ]
    check_responses_bodies(srv)


# -- 4. Mistral's reasoning replies through the OpenAI-compatible adapter ------------------


def mistral_parts(fixture: str) -> tuple[str, str]:
    """`(text, thinking)` of a recorded Magistral reply, read straight from the fixture."""
    data = load(fixture)
    if "body" in data:
        contents = [data["body"]["choices"][0]["message"]["content"]]
    else:
        chunks = [json.loads(x[6:]) for x in data["sse"] if x.startswith("data: {")]
        contents = [c["delta"].get("content") for e in chunks for c in e["choices"]]
    text: list[str] = []
    thought: list[str] = []
    for content in contents:
        if isinstance(content, str):
            text.append(content)
            continue
        for chunk in content or ():
            if chunk["type"] == "text":
                text.append(chunk["text"])
            elif chunk["type"] == "thinking":
                thought += [t["text"] for t in chunk["thinking"]]
    return "".join(text), "".join(thought)


@pytest.mark.parametrize(
    ("fixture", "streamed"),
    [
        ("openai/mistral_magistral_thinking", False),
        ("openai/mistral_magistral_thinking_stream", True),
    ],
)
async def test_magistral_thinking_chunks_are_reasoning_and_text_chunks_the_answer(
    srv: ReplayServer, fixture: str, streamed: bool
) -> None:
    srv.replay(fixture, fixture)
    agent = Agent(chat(srv, "magistral-medium-latest"), model_retry=NO_WAIT)
    reply, events = await run(agent, "How do I cross the street?", streamed=streamed)
    text, thought = mistral_parts(fixture)
    assert text and thought
    assert reply.text == text
    assert reply.messages[-1]["reasoning"] == thought
    assert "reasoning_field" not in reply.messages[-1]
    if streamed:
        assert texts(events) == text
        assert "".join(e.text for e in events if isinstance(e, ReasoningEvent)) == thought
    # The next turn sends the answer back as text, in the typed Chat Completions form.
    await run(agent, "And a river?", streamed=streamed)
    assistant = [m for m in srv.requests[1]["messages"] if m["role"] == "assistant"]
    assert assistant == [{"role": "assistant", "content": text}]
    check_chat_bodies(srv)


# -- 6. Anthropic server-tool blocks -------------------------------------------------------


def anthropic_parts(fixture: str) -> tuple[str, list[dict[str, Any]]]:
    """`(text, server-tool blocks)` of a recorded reply, read straight from the fixture."""
    data = load(fixture)
    if "body" in data:
        blocks = data["body"]["content"]
    else:
        events = [json.loads(x[6:]) for x in data["sse"] if x.startswith("data: {")]
        blocks = []
        for e in events:
            if e["type"] == "content_block_start":
                blocks.append(dict(e["content_block"]))
                blocks[-1]["_json"] = ""
            elif e["type"] == "content_block_delta":
                delta = e["delta"]
                if delta["type"] == "text_delta":
                    blocks[e["index"]]["text"] += delta["text"]
                elif delta["type"] == "input_json_delta":
                    blocks[e["index"]]["_json"] += delta["partial_json"]
        for b in blocks:
            raw = b.pop("_json")
            if raw:
                b["input"] = json.loads(raw)
    text = "".join(b["text"] for b in blocks if b["type"] == "text")
    server = [b for b in blocks if b["type"] in ("server_tool_use", "web_search_tool_result")]
    return text, server


@pytest.mark.parametrize(
    ("fixture", "streamed"),
    [
        ("anthropic/web_search_server_tool", False),
        ("anthropic/web_search_server_tool_stream", True),
    ],
)
async def test_server_tool_blocks_are_kept_and_sent_back_unchanged(
    srv: ReplayServer, fixture: str, streamed: bool
) -> None:
    srv.replay(fixture, fixture)
    web_search = {"tools": [{"type": "web_search_20250305", "name": "web_search"}]}
    model = claude(srv, "claude-sonnet-4-0", extra_body=web_search)
    agent = Agent(model, model_retry=NO_WAIT)
    reply, events = await run(
        agent, "What is the weather in San Francisco today?", streamed=streamed
    )
    text, server = anthropic_parts(fixture)
    assert len(server) >= 2 and server[0]["input"]["query"]
    assert reply.stop_reason == "final_answer"
    assert reply.text == text
    if streamed:
        assert texts(events) == text
    kept = reply.messages[-1]["reasoning_blocks"]
    assert [b for b in kept if b["type"] != "thinking"] == server
    await run(agent, "And in Mexico City?", streamed=streamed)
    (assistant,) = [m for m in srv.requests[1]["messages"] if m["role"] == "assistant"]
    sent = [
        b
        for b in assistant["content"]
        if b["type"] in ("server_tool_use", "web_search_tool_result")
    ]
    assert sent == server
    check_anthropic_bodies(srv)


async def test_a_reply_of_only_a_server_tool_call_is_kept(srv: ReplayServer) -> None:
    # Until now a non-retried bad_request ("a content block of unknown type").
    srv.replay("anthropic/unknown_block")
    reply, _ = await run(Agent(claude(srv, "claude-sonnet-4")), "Rome?", streamed=False)
    assert reply.text == ""
    assert (
        reply.messages[-1]["reasoning_blocks"] == load("anthropic/unknown_block")["body"]["content"]
    )


# -- the new text the messages keep goes through the redactor -------------------------------


async def test_reasoning_text_commentary_and_search_queries_are_redacted(
    srv: ReplayServer,
) -> None:
    from criogen_graph import Redactor

    srv.replay(
        "openai_responses/deepseek_reasoning_text_function_call",
        "openai_responses/deepseek_text_after_tool",
    )
    policy = Redactor({r"Tokyo": "[CITY]", r"PotatoLand": "[LAND]", r"San Francisco": "[SF]"})
    reply = await Agent(
        responses(srv, "deepseek-v4-flash"), tools=[get_temperature], redact=policy
    ).run("What is the temperature in Tokyo?")
    saved = json.dumps(reply.messages)
    assert "Tokyo" not in saved and "[CITY]" in saved
    (item,) = next(m for m in reply.messages if m.get("tool_calls"))["reasoning_items"]
    assert "[CITY]" in item["content"][0]

    recorded = load("openai_responses/gpt55_commentary_function_call")
    both = {
        **recorded["body"],
        "output": [
            recorded["body"]["output"][1],
            *load("openai_responses/gpt55_final_answer")["body"]["output"],
        ],
    }
    srv.add({"source": "two recorded gpt-5.5 items in one reply", "body": both})
    reply = await Agent(responses(srv, "gpt-5.5"), redact=policy).run("Capital?")
    assert "PotatoLand" not in json.dumps(reply.messages[-1])
    assert "[LAND]" in reply.messages[-1]["commentary"]

    srv.replay("anthropic/web_search_server_tool")
    web_search = {"tools": [{"type": "web_search_20250305", "name": "web_search"}]}
    reply = await Agent(claude(srv, "claude-sonnet-4-0", extra_body=web_search), redact=policy).run(
        "What is the weather in San Francisco today?"
    )
    call = next(b for b in reply.messages[-1]["reasoning_blocks"] if b["type"] == "server_tool_use")
    assert call["input"] == {"query": "[SF] weather today"}


@pytest.mark.parametrize("streamed", [False, True])
async def test_a_paused_server_tool_turn_is_continued(srv: ReplayServer, streamed: bool) -> None:
    """`stop_reason: pause_turn` (a long run of web searches): the paused reply goes back
    as it came, as the assistant turn the next request continues (what the recording's
    client did), and the two parts make one answer whose every search has its result."""
    suffix = "_stream" if streamed else ""
    paused, after = (
        f"anthropic/web_search_pause_turn{suffix}",
        f"anthropic/web_search_after_pause{suffix}",
    )
    srv.replay(
        paused,
        after,
        "anthropic/web_search_server_tool_stream"
        if streamed
        else "anthropic/web_search_server_tool",
    )
    web_search = {"tools": [{"type": "web_search_20250305", "name": "web_search"}]}
    model = claude(srv, "claude-sonnet-4-5", max_tokens=15000, extra_body=web_search)
    agent = Agent(model, model_retry=NO_WAIT)
    reply, events = await run(agent, "Run a series of web searches.", streamed=streamed)
    first_text, first_server = anthropic_parts(paused)
    second_text, second_server = anthropic_parts(after)
    assert reply.stop_reason == "final_answer"
    assert reply.text == first_text + second_text
    if streamed:
        assert texts(events) == reply.text
    # The continuation: the same conversation, then the paused reply as the assistant turn.
    continued = srv.requests[1]["messages"]
    assert continued[:-1] == srv.requests[0]["messages"]
    assert continued[-1]["role"] == "assistant"
    sent = continued[-1]["content"]
    if not streamed:
        assert sent == load(paused)["body"]["content"]
    kinds = [b["type"] for b in sent]
    assert kinds[-1] == "server_tool_use"  # its result comes in the continuation
    assert [
        b for b in sent if b["type"] in ("server_tool_use", "web_search_tool_result")
    ] == first_server
    # One saved answer in which every search has its result, so it can go back.
    kept = reply.messages[-1]["reasoning_blocks"]
    calls = [b["id"] for b in kept if b["type"] == "server_tool_use"]
    results = [b["tool_use_id"] for b in kept if b["type"] == "web_search_tool_result"]
    assert calls == results and len(calls) == len(first_server + second_server) // 2
    assert reply.usage["input_tokens"] > 0
    await run(agent, "Thanks", streamed=streamed)
    check_anthropic_bodies(srv)


async def test_a_turn_paused_again_and_again_gives_up(srv: ReplayServer) -> None:
    srv.replay(*["anthropic/web_search_pause_turn"] * 9)
    web_search = {"tools": [{"type": "web_search_20250305", "name": "web_search"}]}
    model = claude(srv, "claude-sonnet-4-5", max_tokens=15000, extra_body=web_search)
    with pytest.raises(ModelError) as info:
        await Agent(model, model_retry=Retry(max_attempts=1)).run("Search forever.")
    assert info.value.kind == "transient" and "still paused" in str(info.value)
    assert len(srv.requests) == 9
    # Each continuation carries the whole paused turn so far, as one assistant message.
    assert [m["role"] for m in srv.requests[-1]["messages"]] == ["user", "assistant"]
