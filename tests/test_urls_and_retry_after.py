"""The one URL masker (`criogen_graph._urls.mask_url`) and the one `Retry-After` reader
(`criogen_graph._retry_after`), on their own and where the library shows URLs (storage,
MCP, OTLP) or honours a server's wait (the provider models, over loopback HTTP)."""

from __future__ import annotations

import random
import socket
import time
from datetime import UTC, datetime
from email.utils import format_datetime

import httpx
import pytest

from criogen_graph import (
    Agent,
    FakeModel,
    FakeReply,
    McpServer,
    McpServerError,
    ModelError,
    Retry,
    Storage,
    StorageError,
    Telemetry,
    ValidationError,
    openai,
)
from criogen_graph._retry_after import (
    MAX_RETRY_AFTER_SECS,
    parse_retry_after,
    retry_after_from_headers,
)
from criogen_graph._urls import mask_url
from criogen_graph.models.langchain import classify_exception
from tests.servers import openai_server as oa
from tests.servers.otlp_receiver import OtlpReceiver

# -- mask_url ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        # passwords
        (
            "postgresql://postgres:hunter2@127.0.0.1:5432/test",
            "postgresql://postgres:***@127.0.0.1:5432/test",
        ),
        ("postgres://u:@h/d", "postgres://u:***@h/d"),
        ("redis://:s3cret@cache:6379/0", "redis://:***@cache:6379/0"),
        ("HTTPS://bob:pw@Example.COM/x", "HTTPS://bob:***@Example.COM/x"),
        # a password with an unescaped `@`, `/`, `?` or `#`
        ("postgres://u:p@ss@host/db", "postgres://u:***@host/db"),
        ("postgres://u:pa/ss@host/db", "postgres://u:***@host/db"),
        ("postgres://u:pa?ss@host/db", "postgres://u:***@host/db"),
        ("postgres://u:pa#ss@host/db", "postgres://u:***@host/db"),
        ("postgres://u:a/b@c@host/db?sslmode=require", "postgres://u:***@host/db?sslmode=require"),
        # a user alone: a name for a database, a token for the web
        ("postgres://alice@db/x", "postgres://alice@db/x"),
        ("https://ghp_abc123@github.com/org/repo.git", "https://***@github.com/org/repo.git"),
        ("wss://tok@host/socket", "wss://***@host/socket"),
        # secrets in the query, the fragment and path parameters
        (
            "https://h/p?password=s3&x=1&api_key=k#access_token=t",
            "https://h/p?password=***&x=1&api_key=***#access_token=***",
        ),
        (
            "http://user:secret@127.0.0.1:9/mcp?key=secret",
            "http://user:***@127.0.0.1:9/mcp?key=***",
        ),
        (
            "https://h/?PassWord=1&pass%77=2&token=&X-Amz-Signature=abc&page=3",
            "https://h/?PassWord=***&pass%77=***&token=&X-Amz-Signature=***&page=3",
        ),
        ("https://h/a;jsessionid=XYZ?q=1", "https://h/a;jsessionid=***?q=1"),
        ("https://h/cb?code=abc&state=ok", "https://h/cb?code=***&state=ok"),
        # IPv6 literals, ports, and `@` or `:` that belong to the path or query
        (
            "postgresql://u:p@[::1]:5432/db?sslmode=require&password=zz",
            "postgresql://u:***@[::1]:5432/db?sslmode=require&password=***",
        ),
        ("http://[2001:db8::1]:8080/a@b", "http://[2001:db8::1]:8080/a@b"),
        ("https://host:443/path@x", "https://host:443/path@x"),
        ("https://medium.com/@user", "https://medium.com/@user"),
        ("http://h:4318/v1/traces?user=a@b.com", "http://h:4318/v1/traces?user=a@b.com"),
        # unicode
        ("postgres://üser:pässwörd@höst/db", "postgres://üser:***@höst/db"),
        ("https://例え.jp/パス?トークン=x&clé=v", "https://例え.jp/パス?トークン=x&clé=v"),
        ("https://例え.jp/?token=秘密", "https://例え.jp/?token=***"),
        # no scheme
        ("user:pw@host:5432/db", "user:***@host:5432/db"),
        ("host=db user=x password='se cret' dbname=y", "host=db user=x password=*** dbname=y"),
        ("host=db sslpassword=abc port=5432", "host=db sslpassword=*** port=5432"),
        ("a=1&api_key=zz", "a=1&api_key=***"),
        # nothing to hide
        ("memory://", "memory://"),
        ("sqlite:///tmp/a.db", "sqlite:///tmp/a.db"),
        ("sqlite:////abs/path/with:colon.db", "sqlite:////abs/path/with:colon.db"),
        ("/tmp/x.db", "/tmp/x.db"),
        ("threads.db", "threads.db"),
        ("", ""),
        ("http://localhost:4318", "http://localhost:4318"),
    ],
)
def test_mask_url(url: str, shown: str) -> None:
    assert mask_url(url) == shown
    assert mask_url(shown) == shown  # masking twice changes nothing


def test_mask_url_hides_any_password() -> None:
    # Passwords of every character a user may paste unescaped (except the `/?#` that end
    # an authority, pinned above), in every scheme, with and without a port and query.
    rng = random.Random(1919)
    alphabet = "abcXYZ0189!$%&'()*+,;=:@-._~ äöü€😀\"<>[]{}|\\^`"
    for _ in range(500):
        password = rng.choice("kQz") + "".join(rng.choice(alphabet) for _ in range(12))
        scheme = rng.choice(["postgresql", "postgres", "https", "redis", "mysql+aiomysql"])
        port = rng.choice(["", ":5432"])
        query = rng.choice(["", "?sslmode=require", "?x=a@b.com"])
        url = f"{scheme}://svc_user:{password}@db.internal{port}/app{query}"
        assert mask_url(url) == f"{scheme}://svc_user:***@db.internal{port}/app{query}", url


def test_mask_url_takes_only_text() -> None:
    with pytest.raises(TypeError, match="mask_url takes a str"):
        mask_url(b"postgres://u:p@h/d")  # type: ignore[arg-type]


def test_storage_shows_its_url_masked() -> None:
    storage = Storage("postgresql://nobody:hunter2@127.0.0.1:1/db?password=again")
    assert repr(storage) == (
        "Storage('postgresql://nobody:***@127.0.0.1:1/db?password=***', on_busy='fail')"
    )
    with pytest.raises(StorageError) as info:
        Storage("mysql://root:hunter2@db/app")
    assert "mysql://root:***@db/app" in str(info.value)
    assert "hunter2" not in str(info.value)


def test_mcp_and_telemetry_refuse_a_bad_url_without_showing_its_secret() -> None:
    with pytest.raises(ValidationError) as info:
        McpServer.http("ftp://user:hunter2@host/mcp?token=abc")
    assert "ftp://user:***@host/mcp?token=***" in str(info.value)
    assert "hunter2" not in str(info.value) and "abc" not in str(info.value)
    with pytest.raises(ValidationError) as info:
        Telemetry.otlp("grpc://user:hunter2@collector:4317")
    assert "grpc://user:***@collector:4317" in str(info.value)
    assert "hunter2" not in str(info.value)


async def test_otlp_logs_and_repr_show_the_endpoint_masked(
    rx: OtlpReceiver, caplog: pytest.LogCaptureFixture
) -> None:
    rx.refuse = [(400, {})]
    url = rx.url.replace("http://", "http://otel:hunter2@")
    telemetry = Telemetry.otlp(url)
    rx.users.append(telemetry)
    shown = rx.url.replace("http://", "http://otel:***@") + "/v1/traces"
    assert telemetry.endpoint is not None and "hunter2" in telemetry.endpoint  # still used
    assert repr(telemetry) == f"Telemetry({shown!r}, content=False)"
    with caplog.at_level("ERROR", logger="criogen_graph.telemetry"):
        await Agent(FakeModel([FakeReply.text("hi")]), telemetry=telemetry).run("hello")
        assert telemetry.flush(10)
    assert rx.answered == [400]
    refused = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert refused and all(shown in m for m in refused), caplog.text
    assert "hunter2" not in caplog.text


async def test_an_unreachable_mcp_server_is_named_with_its_url_masked() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # free once closed: nothing listens there
    server = McpServer.http(
        f"http://svc:hunter2@127.0.0.1:{port}/mcp?session=abc&v=2", startup_timeout_secs=10
    )
    with pytest.raises(McpServerError) as info:
        async with server:
            pass
    message = str(info.value)
    assert f"could not be reached at http://svc:***@127.0.0.1:{port}/mcp?session=***&v=2" in (
        message
    ), message
    assert "hunter2" not in message and "abc" not in message


# -- Retry-After ---------------------------------------------------------------------------

NOW = 1_800_000_000.0  # a fixed clock for the dates


def http_date(offset_secs: float) -> str:
    return format_datetime(datetime.fromtimestamp(NOW + offset_secs, tz=UTC), usegmt=True)


@pytest.mark.parametrize(
    ("value", "secs"),
    [
        ("120", 120.0),
        ("0", 0.0),
        ("1.5", 1.5),
        (".25", 0.25),
        ("2.", 2.0),
        (" 3 ", 3.0),
        ("007", 7.0),
        (http_date(30), 30.0),
        (http_date(-30), 0.0),  # a date in the past: now
        (http_date(-(10**6)), 0.0),
        ("Fri, 15 Jan 2027 08:00:00 -0000", datetime(2027, 1, 15, 8, tzinfo=UTC).timestamp() - NOW),
        ("Fri, 15 Jan 2027 09:00:00 +0100", datetime(2027, 1, 15, 8, tzinfo=UTC).timestamp() - NOW),
        # huge: capped, finite
        ("99999999999", MAX_RETRY_AFTER_SECS),
        ("9" * 400, MAX_RETRY_AFTER_SECS),
        (str(int(MAX_RETRY_AFTER_SECS) - 1), MAX_RETRY_AFTER_SECS - 1),
        ("Fri, 01 Jan 9999 00:00:00 GMT", MAX_RETRY_AFTER_SECS),
        # not a delay: the caller's own backoff applies
        (None, None),
        ("", None),
        ("   ", None),
        ("soon", None),
        ("-1", None),
        ("-0.5", None),
        ("+5", None),
        ("1e3", None),
        ("inf", None),
        ("Infinity", None),
        ("nan", None),
        ("0x10", None),
        ("1,5", None),
        ("1 2", None),
        ("１２", None),  # full-width digits are not HTTP digits
        ("Mon, 99 Foo 2020 99:99:99 GMT", None),
        ("Wed, 21 Oct", None),
    ],
)
def test_parse_retry_after(value: str | None, secs: float | None) -> None:
    got = parse_retry_after(value, now=NOW)
    if secs is None:
        assert got is None
    else:
        assert got == pytest.approx(secs)


def test_parse_retry_after_reads_dates_against_the_real_clock() -> None:
    wait = parse_retry_after(format_datetime(datetime.now(UTC), usegmt=True))
    assert wait is not None and 0 <= wait <= 1
    later = format_datetime(datetime.fromtimestamp(time.time() + 3600, tz=UTC), usegmt=True)
    wait = parse_retry_after(later)
    assert wait is not None and 3590 <= wait <= 3600


def test_parse_retry_after_takes_only_text() -> None:
    with pytest.raises(TypeError, match="Retry-After value must be a str"):
        parse_retry_after(5)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("headers", "secs"),
    [
        ({"retry-after": "2"}, 2.0),
        ({"Retry-After": "2"}, 2.0),  # a plain dict, not case-insensitive itself
        ({"RETRY-AFTER-MS": "250", "Retry-After": "9"}, 0.25),  # the precise one wins
        ({"retry-after-ms": "1500.5"}, 1.5005),
        ({"retry-after-ms": "later", "retry-after": "9"}, 9.0),  # a bad one is skipped
        ({"retry-after-ms": "-1", "retry-after": "4"}, 4.0),
        ({"retry-after-ms": "Fri, 15 Jan 2027 08:00:00 GMT"}, None),  # ms are never dates
        ({"retry-after": http_date(12)}, 12.0),
        ([("Retry-After", "4")], 4.0),
        ([(b"retry-after", b"5")], 5.0),
        (httpx.Headers({"Retry-After": "7"}), 7.0),
        (httpx.Headers([("retry-after-ms", "30")]), 0.03),
        ({}, None),
        ({"x-ratelimit-reset": "60"}, None),  # not a Retry-After
        (None, None),
        (42, None),  # not headers at all
    ],
)
def test_retry_after_from_headers(headers: object, secs: float | None) -> None:
    got = retry_after_from_headers(headers, now=NOW)
    assert got == (None if secs is None else pytest.approx(secs))


# Through a real provider adapter over loopback HTTP: what the server's header becomes
# on the `ModelError` the model node reads (one attempt, so no wait happens).
@pytest.mark.parametrize(
    ("headers", "secs"),
    [
        ({"retry-after": "2.5"}, 2.5),
        ({"retry-after-ms": "1200"}, 1.2),
        ({"retry-after": "Thu, 01 Jan 2015 00:00:00 GMT"}, 0.0),
        ({"retry-after": "soon"}, None),  # once a ValueError out of the adapter
        ({"retry-after": "-3"}, None),
        ({"retry-after": "nan"}, None),
        ({"retry-after": "1" * 30}, MAX_RETRY_AFTER_SECS),
    ],
)
async def test_a_provider_model_reads_retry_after_the_same_way(
    openai_server: oa.OpenAIServer, headers: dict[str, str], secs: float | None
) -> None:
    openai_server.add(oa.error(429, "slow down", headers=headers))
    model = openai("gpt-test", api_key="sk-test", base_url=openai_server.base_url)
    agent = Agent(model, model_retry=Retry(max_attempts=1), max_retry_after_secs=0)
    with pytest.raises(ModelError) as info:
        await agent.run("hi")
    assert info.value.kind == "rate_limit"
    assert info.value.retry_after == (None if secs is None else pytest.approx(secs))


async def test_a_garbage_retry_after_falls_back_to_our_own_backoff(
    openai_server: oa.OpenAIServer,
) -> None:
    openai_server.add(oa.error(503, "busy", headers={"retry-after": "whenever"}), oa.text("ok"))
    model = openai("gpt-test", api_key="sk-test", base_url=openai_server.base_url)
    agent = Agent(model, model_retry=Retry(max_attempts=2, initial_backoff_secs=0, jitter=False))
    assert (await agent.run("hi")).text == "ok"
    assert len(openai_server.requests) == 2


def test_a_langchain_error_reads_retry_after_the_same_way() -> None:
    class RateLimited(Exception):
        def __init__(self, response: httpx.Response) -> None:
            super().__init__("rate limited")
            self.response = response

    for headers, secs in (
        ({"Retry-After": "1.5"}, 1.5),
        ({"retry-after-ms": "400"}, 0.4),
        ({"retry-after": "Thu, 01 Jan 2015 00:00:00 GMT"}, 0.0),
        ({"retry-after": "soon"}, None),
        ({"retry-after": "inf"}, None),
    ):
        error = classify_exception(
            RateLimited(httpx.Response(429, headers=headers)), "langchain", "chat"
        )
        assert error.kind == "rate_limit"
        assert error.retry_after == (None if secs is None else pytest.approx(secs)), headers
