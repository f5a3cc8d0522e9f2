"""The Gemini adapter through real agents, against a scripted Gemini API on 127.0.0.1."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any, Literal

import pydantic
import pytest

from criogen_graph import (
    Agent,
    FakeModel,
    FakeReply,
    GeminiModel,
    ModelError,
    Retry,
    TextEvent,
    ToolError,
    ValidationError,
    gemini,
    tool,
)
from tests.servers import gemini_server as gs
from tests.typed_bodies import assert_gemini_request

NO_WAIT = Retry(initial_backoff_secs=0, jitter=False)
KEY = "test-key-0123456789"


@pytest.fixture
def server() -> Iterator[gs.GeminiServer]:
    with gs.GeminiServer() as srv:
        yield srv
    # Every body the adapter sent fits the official SDK's typed request models.
    for request in srv.requests:
        if isinstance(request.body, dict) and request.body.get("contents"):
            assert_gemini_request(request.body)


def model(server: gs.GeminiServer, **kw: Any) -> GeminiModel:
    return gemini("gemini-test", base_url=server.base_url, api_key=KEY, **kw)


@tool
async def get_weather(city: str) -> str:
    """The weather in a city."""
    if city == "Atlantis":
        raise ToolError("no weather under the sea")
    return f"sunny in {city}"


class Geo(pydantic.BaseModel):
    lat: float
    lon: float


class Address(pydantic.BaseModel):
    """A postal address."""

    street: str
    city: str = pydantic.Field(description="City name")
    kind: Literal["home", "work"] = "home"
    geo: Geo | None = None
    tags: list[str] = []


saved: list[Any] = []


@tool
async def save_address(name: str, address: Address) -> str:
    """Save someone's address.

    Args:
        name: Who lives there.
    """
    saved.append((name, address))
    return "saved"


@tool
async def label(tags: dict[str, str]) -> str:
    """Label things."""
    return "labelled"


@tool
async def ping() -> str:
    """Check the line."""
    return "pong"


class Forecast(pydantic.BaseModel):
    city: str
    high: int
    geo: Geo | None = None


# -- answers, usage, the wire format --------------------------------------------------------


async def test_plain_answer_maps_text_and_usage(server: gs.GeminiServer) -> None:
    server.add(
        gs.text(
            "Hello there.",
            thought="The user greets me; greet back.",
            usage={
                "promptTokenCount": 100,
                "candidatesTokenCount": 20,
                "thoughtsTokenCount": 5,
                "cachedContentTokenCount": 40,
            },
        )
    )
    result = await Agent(model(server)).run("Hi")
    assert result.text == "Hello there."  # the thought summary is not part of the answer
    assert result.stop_reason == "final_answer"
    assert result.answered_by == {"provider": "gemini", "model": "gemini-test"}
    assert result.usage == {
        "input_tokens": 100,
        "output_tokens": 25,  # thinking tokens are billed as output
        "cache_read_tokens": 40,
        "cache_write_tokens": 0,
        "reasoning_tokens": 5,
    }
    (request,) = server.requests
    assert request.path == "/v1beta/models/gemini-test:generateContent"
    assert request.body["contents"] == [{"role": "user", "parts": [{"text": "Hi"}]}]
    assert "systemInstruction" not in request.body and "tools" not in request.body


async def test_the_key_goes_only_in_the_header(server: gs.GeminiServer) -> None:
    server.add(gs.text("ok"), gs.error(403, "Permission denied on resource project."))
    agent = Agent(model(server))
    await agent.run("hi")
    with pytest.raises(ModelError) as info:
        await agent.run("hi")
    for request in server.requests:
        assert request.headers["x-goog-api-key"] == KEY
        assert KEY not in request.raw_path and "key" not in request.query
    assert KEY not in str(info.value)


async def test_instructions_become_the_system_instruction(server: gs.GeminiServer) -> None:
    server.add(gs.text("Brief."))
    await Agent(model(server), instructions="Be brief.").run("Tell me everything.")
    body = server.requests[0].body
    assert body["systemInstruction"] == {"parts": [{"text": "Be brief."}]}
    assert [c["role"] for c in body["contents"]] == ["user"]


async def test_string_form_reads_key_and_url_from_the_environment(
    server: gs.GeminiServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GEMINI_API_KEY", "env-key")
    monkeypatch.setenv("GEMINI_BASE_URL", server.base_url)
    server.add(gs.text("from the environment"))
    result = await Agent("gemini:gemini-test").run("hi")
    assert result.text == "from the environment"
    assert result.answered_by == {"provider": "gemini", "model": "gemini-test"}
    (request,) = server.requests
    assert request.headers["x-goog-api-key"] == "env-key"
    assert "env-key" not in request.raw_path


def test_a_missing_key_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GEMINI_API_KEY", raising=False)
    monkeypatch.delenv("GEMINI_BASE_URL", raising=False)
    with pytest.raises(ValidationError, match="GEMINI_API_KEY"):
        gemini("gemini-2.5-flash")
    with pytest.raises(ValidationError, match="GEMINI_API_KEY"):
        Agent("gemini:gemini-2.5-flash")


async def test_a_custom_base_url_needs_no_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GEMINI_API_KEY", raising=False)
    with gs.GeminiServer(require_key=False) as srv:
        srv.add(gs.text("through the gateway"))
        result = await Agent(gemini("gemini-test", base_url=srv.base_url)).run("hi")
    assert result.text == "through the gateway"
    assert "x-goog-api-key" not in srv.requests[0].headers


@pytest.mark.parametrize(
    ("name", "suffix"),
    [("gemini-test", ""), ("gemini-test", "/v1beta/"), ("models/gemini-test", "")],
    ids=["plain", "versioned-base-url", "models-prefix"],
)
async def test_model_names_and_base_urls(server: gs.GeminiServer, name: str, suffix: str) -> None:
    server.add(gs.text("ok"))
    agent = Agent(gemini(name, base_url=server.base_url + suffix, api_key=KEY))
    assert (await agent.run("hi")).text == "ok"
    assert server.requests[0].path == "/v1beta/models/gemini-test:generateContent"


async def test_extra_body_adds_to_every_request(server: gs.GeminiServer) -> None:
    server.add(gs.text('{"city": "Rome", "high": 30}'))
    safety = [{"category": "HARM_CATEGORY_HARASSMENT", "threshold": "BLOCK_ONLY_HIGH"}]
    extra = {"generationConfig": {"temperature": 0}, "safetySettings": safety}
    result = await Agent(model(server, extra_body=extra), output=Forecast).run("Rome?")
    assert result.output == Forecast(city="Rome", high=30)
    body = server.bodies()[0]
    assert body["safetySettings"] == safety
    # Merged into the config the adapter builds, not replacing it.
    assert body["generationConfig"]["temperature"] == 0
    assert body["generationConfig"]["responseMimeType"] == "application/json"


# -- function calls ------------------------------------------------------------------------


@pytest.mark.parametrize("with_ids", [False, True], ids=["no-call-ids", "call-ids"])
async def test_parallel_function_calls_round_trip(server: gs.GeminiServer, with_ids: bool) -> None:
    server.add(
        gs.function_calls(
            ("get_weather", {"city": "Paris"}),
            ("get_weather", {"city": "Atlantis"}),
            call_ids=with_ids,
            signature="c2lnLTE=",
        ),
        gs.text("Sunny in Paris; nobody knows about Atlantis."),
    )
    result = await Agent(model(server), tools=[get_weather]).run("Weather in Paris and Atlantis?")
    assert result.text == "Sunny in Paris; nobody knows about Atlantis."
    assert result.model_calls == 2 and result.tool_calls == 2

    first, second = server.bodies()
    assert first["tools"] == [
        {
            "functionDeclarations": [
                {
                    "name": "get_weather",
                    "description": "The weather in a city.",
                    "parameters": {
                        "type": "OBJECT",
                        "properties": {"city": {"type": "STRING"}},
                        "required": ["city"],
                    },
                }
            ]
        }
    ]
    user, model_turn, results = second["contents"]
    assert user["role"] == "user"
    assert model_turn["role"] == "model"
    calls = [p["functionCall"] for p in model_turn["parts"]]
    assert [(c["name"], c["args"]) for c in calls] == [
        ("get_weather", {"city": "Paris"}),
        ("get_weather", {"city": "Atlantis"}),
    ]
    # The thought signature goes back on the part that carried it, untouched.
    assert model_turn["parts"][0]["thoughtSignature"] == "c2lnLTE="
    assert "thoughtSignature" not in model_turn["parts"][1]
    assert results["role"] == "user"
    responses = [p["functionResponse"] for p in results["parts"]]
    assert [r["name"] for r in responses] == ["get_weather", "get_weather"]
    assert responses[0]["response"] == {"result": "sunny in Paris"}
    assert "no weather under the sea" in responses[1]["response"]["error"]

    sent_ids = [c.get("id") for c in calls]
    answered_ids = [r.get("id") for r in responses]
    transcript_ids = [c["id"] for c in result.messages[1]["tool_calls"]]
    if with_ids:
        # The API's ids are kept as the call ids and sent back on calls and responses.
        assert sent_ids == answered_ids == transcript_ids
        assert len(set(sent_ids)) == 2
    else:
        # Ids made up for the transcript are never sent to the API.
        assert sent_ids == answered_ids == [None, None]
        assert len(set(transcript_ids)) == 2 and all(transcript_ids)


async def test_calls_written_by_another_model_get_a_placeholder_signature(
    server: gs.GeminiServer,
) -> None:
    server.add(gs.text("Sunny in Oslo."))
    primary = FakeModel(
        [FakeReply.tool_call("get_weather", {"city": "Oslo"}), FakeReply.error("transient")]
    )
    agent = Agent(
        primary, fallbacks=[model(server)], tools=[get_weather], model_retry=Retry(max_attempts=1)
    )
    result = await agent.run("Weather in Oslo?")
    assert result.text == "Sunny in Oslo."
    assert result.answered_by == {"provider": "gemini", "model": "gemini-test"}
    _, model_turn, results = server.bodies()[0]["contents"]
    part = model_turn["parts"][0]
    # Gemini 3 rejects a function-call turn without a signature; this one is documented
    # for history Gemini did not write.
    assert part["thoughtSignature"] == "skip_thought_signature_validator"
    assert "id" not in part["functionCall"]
    assert results["parts"][0]["functionResponse"]["response"] == {"result": "sunny in Oslo"}


@pytest.mark.parametrize("args", [["Paris"], "Paris", 42], ids=["list", "string", "number"])
async def test_unusable_call_arguments_go_back_as_an_error(
    server: gs.GeminiServer, args: Any
) -> None:
    ran: list[str] = []

    @tool
    async def weather(city: str) -> str:
        """The weather."""
        ran.append(city)
        return "sunny"

    server.add(gs.function_calls(("weather", args)), gs.text("Sorry, I got that wrong."))
    result = await Agent(model(server), tools=[weather]).run("Weather?")
    assert result.text == "Sorry, I got that wrong."
    assert ran == []
    (tool_message,) = [m for m in result.messages if m["role"] == "tool"]
    assert tool_message["status"] == "error"
    response = server.bodies()[1]["contents"][2]["parts"][0]["functionResponse"]
    assert response["name"] == "weather"
    assert "the arguments" in response["response"]["error"]


# -- schemas -------------------------------------------------------------------------------


async def test_nested_pydantic_parameters_are_converted_to_the_schema_subset(
    server: gs.GeminiServer,
) -> None:
    saved.clear()
    server.add(
        gs.function_calls(
            (
                "save_address",
                {"name": "Ada", "address": {"street": "1 Main St", "city": "London", "geo": None}},
            )
        ),
        gs.text("Saved."),
    )
    result = await Agent(model(server), tools=[save_address]).run("Save Ada's address.")
    assert result.text == "Saved."
    assert saved == [("Ada", Address(street="1 Main St", city="London"))]
    (decl,) = server.bodies()[0]["tools"][0]["functionDeclarations"]
    assert decl == {
        "name": "save_address",
        "description": "Save someone's address.",
        "parameters": {
            "type": "OBJECT",
            "properties": {
                "name": {"type": "STRING", "description": "Who lives there."},
                "address": {
                    "type": "OBJECT",
                    "description": "A postal address.",
                    "properties": {
                        "street": {"type": "STRING"},
                        "city": {"type": "STRING", "description": "City name"},
                        "kind": {"type": "STRING", "enum": ["home", "work"], "default": "home"},
                        "geo": {
                            "type": "OBJECT",
                            "properties": {"lat": {"type": "NUMBER"}, "lon": {"type": "NUMBER"}},
                            "required": ["lat", "lon"],
                            "nullable": True,
                            "default": None,
                        },
                        "tags": {"type": "ARRAY", "items": {"type": "STRING"}, "default": []},
                    },
                    "required": ["street", "city"],
                },
            },
            "required": ["name", "address"],
        },
    }


async def test_schemas_the_subset_cannot_express_go_as_json_schema(
    server: gs.GeminiServer,
) -> None:
    server.add(gs.text("Nothing to do."))
    await Agent(model(server), tools=[label, ping]).run("hi")
    free_form, no_args = server.bodies()[0]["tools"][0]["functionDeclarations"]
    # A map (additionalProperties only) has no equivalent in `parameters`.
    assert "parameters" not in free_form
    assert free_form["parametersJsonSchema"] == label.parameters
    # An object without properties is rejected by the API: a tool without input declares none.
    assert no_args == {"name": "ping", "description": "Check the line."}


async def test_typed_output_uses_json_mode_with_the_converted_schema(
    server: gs.GeminiServer,
) -> None:
    server.add(gs.text('{"city": "Paris", "high": 21}'))
    result = await Agent(model(server), output=Forecast).run("Forecast for Paris?")
    assert result.stop_reason == "output"
    assert result.output == Forecast(city="Paris", high=21)
    config = server.bodies()[0]["generationConfig"]
    assert config == {
        "responseMimeType": "application/json",
        "responseSchema": {
            "type": "OBJECT",
            "properties": {
                "city": {"type": "STRING"},
                "high": {"type": "INTEGER"},
                "geo": {
                    "type": "OBJECT",
                    "properties": {"lat": {"type": "NUMBER"}, "lon": {"type": "NUMBER"}},
                    "required": ["lat", "lon"],
                    "propertyOrdering": ["lat", "lon"],
                    "nullable": True,
                    "default": None,
                },
            },
            "required": ["city", "high"],
            # Without it the API writes the keys in alphabetical order.
            "propertyOrdering": ["city", "high", "geo"],
        },
    }


async def test_typed_output_with_tools_asks_in_the_instructions(server: gs.GeminiServer) -> None:
    # Gemini 2.x rejects JSON mode together with function calling (the server does too).
    server.add(
        gs.function_calls(("get_weather", {"city": "Paris"})),
        gs.text('{"city": "Paris", "high": 21}'),
    )
    result = await Agent(model(server), tools=[get_weather], output=Forecast).run("Paris?")
    assert result.output == Forecast(city="Paris", high=21)
    for body in server.bodies():
        assert "responseMimeType" not in body.get("generationConfig", {})
        instruction = body["systemInstruction"]["parts"][-1]["text"]
        assert "JSON" in instruction and '"high"' in instruction


# -- safety --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "step",
    [
        gs.blocked("SAFETY"),
        gs.blocked("PROHIBITED_CONTENT"),
        gs.blocked("BLOCKLIST"),
        gs.blocked("SPII"),
        gs.blocked("RECITATION", text="It was the best of times"),
        gs.prompt_blocked("PROHIBITED_CONTENT"),
    ],
    ids=["safety", "prohibited", "blocklist", "spii", "recitation", "prompt-blocked"],
)
async def test_a_safety_stop_ends_the_run_as_content_filter(
    server: gs.GeminiServer, step: gs.Step
) -> None:
    server.add(step)
    result = await Agent(model(server), model_retry=NO_WAIT).run("something risky")
    assert result.stop_reason == "content_filter"
    assert result.answered_by == {"provider": "gemini", "model": "gemini-test"}
    assert len(server.requests) == 1  # an answer, not a failure: never retried


# -- streaming -----------------------------------------------------------------------------


async def test_streamed_text_and_function_calls(server: gs.GeminiServer, thread_id: str) -> None:
    answer = "Paris is sunny today, with a light breeze from the west."
    server.add(
        gs.function_calls(("get_weather", {"city": "Paris"}), signature="c2lnLTI="),
        gs.text(answer, chunk=7, usage={"promptTokenCount": 50, "candidatesTokenCount": 12}),
    )
    agent = Agent(model(server), tools=[get_weather])
    stream = agent.thread(thread_id).stream("Weather in Paris?")
    events = [e async for e in stream]
    reply = await stream.reply()
    pieces = [e.text for e in events if isinstance(e, TextEvent)]
    assert len(pieces) > 1
    assert "".join(pieces) == reply.text == answer
    assert [m["content"] for m in reply.messages if m["role"] == "tool"] == ["sunny in Paris"]
    for request in server.requests:
        assert request.path == "/v1beta/models/gemini-test:streamGenerateContent"
        assert request.query == {"alt": ["sse"]}
    second = server.bodies()[1]["contents"][1]["parts"][0]
    assert second["thoughtSignature"] == "c2lnLTI="
    # The last event's usage counts, not the partial ones before it.
    assert reply.usage["input_tokens"] == 11 + 50
    assert reply.usage["output_tokens"] == 7 + 12


@pytest.mark.parametrize("cleanly", [False, True], ids=["cut-short", "no-finish-reason"])
async def test_a_dropped_stream_is_retried_without_repeating_text(
    server: gs.GeminiServer, thread_id: str, cleanly: bool
) -> None:
    answer = "The quick brown fox jumps over the lazy dog, twice."
    server.add(
        gs.dropped(gs.text(answer, chunk=5), after=3, cleanly=cleanly),
        gs.text(answer, chunk=5),
    )
    agent = Agent(model(server), model_retry=NO_WAIT)
    stream = agent.thread(thread_id).stream("Say it.")
    events = [e async for e in stream]
    reply = await stream.reply()
    assert len(server.requests) == 2
    assert "".join(e.text for e in events if isinstance(e, TextEvent)) == reply.text == answer


async def test_an_error_inside_the_stream_is_retried(
    server: gs.GeminiServer, thread_id: str
) -> None:
    answer = "Overloaded servers still finish their sentences."
    server.add(gs.stream_error(gs.text(answer, chunk=6), after=2), gs.text(answer, chunk=6))
    stream = Agent(model(server), model_retry=NO_WAIT).thread(thread_id).stream("Go on.")
    events = [e async for e in stream]
    reply = await stream.reply()
    assert len(server.requests) == 2
    assert "".join(e.text for e in events if isinstance(e, TextEvent)) == reply.text == answer


async def test_an_error_inside_the_stream_is_classified(
    server: gs.GeminiServer, thread_id: str
) -> None:
    server.add(gs.stream_error(gs.text("partial answer"), after=1, status=400, message="bad"))
    stream = Agent(model(server), model_retry=NO_WAIT).thread(thread_id).stream("Go on.")
    with pytest.raises(ModelError) as info:
        await stream.reply()
    assert info.value.kind == "bad_request" and info.value.status == 400
    assert len(server.requests) == 1


# -- failures ------------------------------------------------------------------------------


async def test_rate_limit_waits_for_retry_after(server: gs.GeminiServer) -> None:
    server.add(
        gs.error(429, "Resource has been exhausted.", headers={"Retry-After": "0.3"}),
        gs.text("after the wait"),
    )
    agent = Agent(model(server), model_retry=NO_WAIT)
    started = time.monotonic()
    result = await agent.run("hi")
    assert result.text == "after the wait"
    assert len(server.requests) == 2
    assert time.monotonic() - started >= 0.3


@pytest.mark.parametrize("where", ["header", "retry-info"])
async def test_a_retry_after_beyond_the_limit_fails_over_at_once(
    server: gs.GeminiServer, where: str
) -> None:
    if where == "header":
        step = gs.error(429, "Quota exceeded.", headers={"Retry-After": "3600"})
    else:
        step = gs.error(429, "Quota exceeded.", details=[gs.retry_info(3600)])
    server.add(step)
    agent = Agent(
        model(server),
        fallbacks=[FakeModel(["from the fallback"])],
        model_retry=NO_WAIT,
        max_retry_after_secs=5,
    )
    result = await asyncio.wait_for(agent.run("hi"), 10)
    assert result.text == "from the fallback"
    assert result.answered_by == {"provider": "fake", "model": "fake"}
    assert len(server.requests) == 1


async def test_retry_info_in_the_body_is_reported(server: gs.GeminiServer) -> None:
    server.add(gs.error(429, "Quota exceeded.", details=[gs.retry_info(3600)]))
    agent = Agent(model(server), model_retry=NO_WAIT, max_retry_after_secs=5)
    with pytest.raises(ModelError) as info:
        await asyncio.wait_for(agent.run("hi"), 10)
    assert info.value.kind == "rate_limit" and info.value.status == 429
    assert info.value.retry_after == 3600


@pytest.mark.parametrize(
    ("status", "message"),
    [(500, "An internal error has occurred."), (503, "The model is overloaded.")],
)
async def test_server_errors_are_retried(
    server: gs.GeminiServer, status: int, message: str
) -> None:
    server.add(gs.error(status, message), gs.error(status, message), gs.text("third time lucky"))
    result = await Agent(model(server), model_retry=NO_WAIT).run("hi")
    assert result.text == "third time lucky"
    assert len(server.requests) == 3


@pytest.mark.parametrize(
    ("step", "kind"),
    [
        (gs.error(400, "Invalid value at 'contents[0]'."), "bad_request"),
        (
            gs.error(
                400,
                "The input token count (2000001) exceeds the maximum number of tokens "
                "allowed (1048576).",
            ),
            "context_overflow",
        ),
        (
            gs.error(
                400,
                "API key not valid. Please pass a valid API key.",
                details=[
                    {
                        "@type": "type.googleapis.com/google.rpc.ErrorInfo",
                        "reason": "API_KEY_INVALID",
                        "domain": "googleapis.com",
                    }
                ],
            ),
            "auth",
        ),
        (gs.error(403, "Permission denied."), "auth"),
        (gs.error(404, "models/gemini-test is not found for API version v1beta."), "not_found"),
    ],
    ids=["invalid-argument", "input-too-long", "bad-key", "permission-denied", "not-found"],
)
async def test_client_errors_are_not_retried(
    server: gs.GeminiServer, step: gs.Step, kind: str
) -> None:
    server.add(step)
    with pytest.raises(ModelError) as info:
        await Agent(model(server), model_retry=NO_WAIT).run("hi")
    assert info.value.kind == kind
    assert info.value.status == step.status
    assert info.value.provider == "gemini"
    assert step.body["error"]["message"] in str(info.value)
    assert len(server.requests) == 1


async def test_a_slow_response_times_out(server: gs.GeminiServer) -> None:
    server.add(gs.slow(gs.text("too late")))
    agent = Agent(model(server, timeout_secs=0.5), model_retry=Retry(max_attempts=1))
    with pytest.raises(ModelError) as info:
        await agent.run("hi")
    assert info.value.kind == "timeout"


async def test_a_timed_out_call_is_retried(server: gs.GeminiServer) -> None:
    server.add(gs.slow(gs.text("too late")), gs.text("in time"))
    result = await Agent(model(server, timeout_secs=0.5), model_retry=NO_WAIT).run("hi")
    assert result.text == "in time"
    assert len(server.requests) == 2


@pytest.mark.parametrize("streamed", [False, True], ids=["json", "sse"])
async def test_malformed_json_is_transient(
    server: gs.GeminiServer, thread_id: str, streamed: bool
) -> None:
    server.add(gs.malformed())
    agent = Agent(model(server), model_retry=Retry(max_attempts=1))
    call = agent.thread(thread_id).stream("hi").reply() if streamed else agent.run("hi")
    with pytest.raises(ModelError) as info:
        await call
    assert info.value.kind == "transient"
    assert info.value.transient


async def test_malformed_json_is_retried(server: gs.GeminiServer) -> None:
    server.add(gs.malformed(), gs.text("whole this time"))
    result = await Agent(model(server), model_retry=NO_WAIT).run("hi")
    assert result.text == "whole this time"
