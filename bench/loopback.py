"""A minimal, fast HTTP/1.1 server for benchmarks: canned OpenAI Chat Completions answers
and, on `/v1/responses`, Responses API answers (JSON, or SSE when the request asks to
stream), and an OTLP/HTTP trace sink on
`/v1/traces` (accepts and drops the spans); keep-alive, run in its own process so the
client under test has a core to itself. `python bench/loopback.py PORT`."""

from __future__ import annotations

import asyncio
import json
import sys

TEXT = "Hello there! This is a short canned answer from the loopback server."
USAGE = {"prompt_tokens": 12, "completion_tokens": 14, "total_tokens": 26}


def _json_body() -> bytes:
    return json.dumps(
        {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 0,
            "model": "bench",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": TEXT},
                    "finish_reason": "stop",
                }
            ],
            "usage": USAGE,
        }
    ).encode()


def _sse_body() -> bytes:
    def chunk(delta: dict[str, object], finish: str | None = None) -> str:
        payload = {
            "id": "chatcmpl-1",
            "object": "chat.completion.chunk",
            "created": 0,
            "model": "bench",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }
        return f"data: {json.dumps(payload)}\n\n"

    parts = [chunk({"role": "assistant", "content": ""})]
    parts += [chunk({"content": TEXT[i : i + 8]}) for i in range(0, len(TEXT), 8)]
    parts.append(chunk({}, "stop"))
    usage = {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": "bench",
        "choices": [],
        "usage": USAGE,
    }
    parts.append(f"data: {json.dumps(usage)}\n\n")
    parts.append("data: [DONE]\n\n")
    return "".join(parts).encode()


def _responses_final() -> dict[str, object]:
    return {
        "id": "resp_1",
        "object": "response",
        "created_at": 0,
        "status": "completed",
        "model": "bench",
        "output": [
            {
                "id": "msg_1",
                "type": "message",
                "status": "completed",
                "role": "assistant",
                "content": [{"type": "output_text", "text": TEXT, "annotations": []}],
            }
        ],
        "usage": {
            "input_tokens": 12,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": 14,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": 26,
        },
    }


def _responses_sse() -> bytes:
    """The events the Responses API streams for `_responses_final()`."""
    final = _responses_final()
    item = final["output"][0]  # type: ignore[index]
    events: list[dict[str, object]] = [
        {"type": "response.created", "response": {**final, "status": "in_progress", "output": []}},
        {"type": "response.output_item.added", "output_index": 0, "item": {**item, "content": []}},
    ]
    events += [
        {
            "type": "response.output_text.delta",
            "item_id": "msg_1",
            "output_index": 0,
            "content_index": 0,
            "delta": TEXT[i : i + 8],
        }
        for i in range(0, len(TEXT), 8)
    ]
    events.append({"type": "response.output_item.done", "output_index": 0, "item": item})
    events.append({"type": "response.completed", "response": final})
    return "".join(
        f"event: {e['type']}\ndata: {json.dumps({**e, 'sequence_number': n})}\n\n"
        for n, e in enumerate(events)
    ).encode()


JSON = _json_body()
SSE = _sse_body()
RESPONSES_JSON = json.dumps(_responses_final()).encode()
RESPONSES_SSE = _responses_sse()


async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n"):
                if line[:15].lower() == b"content-length:":
                    length = int(line[15:])
            body = await reader.readexactly(length) if length else b""
            if head.startswith(b"POST /v1/traces "):
                # An empty ExportTraceServiceResponse: everything was accepted.
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\n"
                    b"content-length: 0\r\n\r\n"
                )
                await writer.drain()
                continue
            stream = b'"stream": true' in body or b'"stream":true' in body
            if head.startswith(b"POST /v1/responses "):
                payload, kind = (
                    (RESPONSES_SSE, b"text/event-stream")
                    if stream
                    else (RESPONSES_JSON, b"application/json")
                )
            else:
                payload, kind = (
                    (SSE, b"text/event-stream") if stream else (JSON, b"application/json")
                )
            writer.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: "
                + kind
                + b"\r\ncontent-length: "
                + str(len(payload)).encode()
                + b"\r\n\r\n"
                + payload
            )
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionResetError):
        pass
    finally:
        writer.close()


async def main(port: int) -> None:
    server = await asyncio.start_server(handle, "127.0.0.1", port)
    print("ready", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1])))
