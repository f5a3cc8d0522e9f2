"""URLs as they may be shown: in error messages, logs and reprs.

One function, `mask_url`, used wherever the library displays a URL (storage URLs, MCP
server URLs, OTLP endpoints), so a password never reaches a message by one path while
another path hides it.
"""

from __future__ import annotations

import re
from urllib.parse import unquote_plus

__all__ = ["MASK", "mask_url"]

#: What a hidden secret is shown as.
MASK = "***"

_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://")
#: Schemes where a user name without a password is usually a token
#: (`https://<token>@github.com/...`), not a name worth showing.
_TOKEN_USER_SCHEMES = frozenset({"http", "https", "ws", "wss", "git+https", "git+http"})
#: Parameter names whose values are hidden: passwords, keys, tokens, signatures,
#: sessions, OAuth codes (matched anywhere in the name, case-insensitively).
_SENSITIVE = re.compile(
    r"pass|pwd|secret|token|key|auth|sig|credential|session|cookie|code|jwt|bearer", re.I
)
#: A `name=value` parameter of a query or fragment.
_PARAM = re.compile(r"([?&;#])([^=&;#?]*)=([^&;#]*)")
#: A `;name=value` parameter of a path segment (`/a;jsessionid=...`).
_PATH_PARAM = re.compile(r"(;)([^=;/]*)=([^;/]*)")
#: A `name=value` pair of a string that is not a URL (a libpq conninfo
#: `host=db password='x y'`, a bare query), values optionally single-quoted.
_PAIR = re.compile(r"(?<![^\s&;?#])([^\s=&;?#]+)(\s*=\s*)('(?:[^'\\]|\\.)*'?|[^\s&;#]*)")


def mask_url(url: str) -> str:
    """`url` with its secrets replaced by `***`, for display.

    Hidden: the password of the user info (`postgresql://user:***@host/db`), a user
    name alone on http(s) URLs (there it is usually a token: `https://***@host`), and
    the values of query, fragment and path parameters whose names look secret
    (`password`, `key`, `api_key`, `token`, `secret`, `sig`, `auth`, `code`, ...). The
    rest (scheme, host, IPv6 literal, port, path, other parameters) is kept as written,
    so the URL stays recognisable. Strings without `scheme://` are masked the same way
    (`user:pw@host/db`), and so are libpq-style `key=value` strings
    (`host=db password=***`). A password holding an unescaped `@`, `/`, `?` or `#` is
    still hidden (at worst with some of the host), unless its part before the `/` is
    all digits, which reads as a port (`user:1234/x@host`), as it does for libpq.
    """
    if not isinstance(url, str):
        raise TypeError(f"mask_url takes a str, got {type(url).__name__}")
    match = _SCHEME.match(url)
    if match is None:
        return _mask_bare(url)
    head = match.group(0)
    scheme = head[:-3].lower()
    rest = url[len(head) :]
    split = _authority_end(rest)
    authority, tail = rest[:split], rest[split:]
    return (
        head
        + _mask_userinfo(authority, token_user=scheme in _TOKEN_USER_SCHEMES)
        + _mask_params(tail)
    )


def _authority_end(rest: str) -> int:
    """Where the authority (`user:password@host:port`) of `rest` ends."""
    end = len(rest)
    for stop in "/?#":
        found = rest.find(stop)
        if found != -1 and found < end:
            end = found
    if "@" in rest[:end] or rest.startswith("["):
        # Up to the last `@` of the authority: a password may hold an unescaped `@`.
        return end
    colon = rest.find(":", 0, end)
    at = rest.find("@", end)
    if colon == -1 or at == -1:
        return end
    port = rest[colon + 1 : end]
    if port.isdigit() or not port:
        return end  # `host:port/path@...`: the `@` belongs to the path
    # `user:pa/ss@host`: a password with an unescaped `/`, `?` or `#` (browsers and libpq
    # disagree on such URLs; hiding too much beats showing part of a password).
    query = min((i for i in (rest.find("?", at), rest.find("#", at)) if i != -1), default=len(rest))
    last_at = rest.rfind("@", 0, query)
    return _authority_end(rest[last_at + 1 :]) + last_at + 1


def _mask_userinfo(authority: str, *, token_user: bool) -> str:
    at = authority.rfind("@")
    if at == -1:
        return authority
    userinfo, host = authority[:at], authority[at + 1 :]
    user, colon, _password = userinfo.partition(":")
    if colon:
        return f"{user}:{MASK}@{host}"
    if token_user and user:
        return f"{MASK}@{host}"
    return authority


def _mask_params(text: str) -> str:
    """The path, query and fragment with secret parameter values masked."""
    if "=" not in text:
        return text
    cut = min((i for i in (text.find("?"), text.find("#")) if i != -1), default=len(text))
    path, rest = text[:cut], text[cut:]
    return _PATH_PARAM.sub(_masked_param, path) + _PARAM.sub(_masked_param, rest)


def _masked_param(match: re.Match[str]) -> str:
    sep, name, value = match.groups()
    if value and _SENSITIVE.search(unquote_plus(name)):
        return f"{sep}{name}={MASK}"
    return match.group(0)


def _mask_bare(text: str) -> str:
    """A string without `scheme://`: `user:password@host...` and `name=value` pairs."""
    first = text.split(None, 1)[0] if text.strip() else ""
    at = first.rfind("@")
    if at != -1:
        userinfo = first[:at]
        user, colon, _password = userinfo.partition(":")
        if colon and not any(c in user for c in "/?#=&;"):
            start = text.find(first)
            text = f"{text[:start]}{user}:{MASK}{text[start + at :]}"
    if "=" not in text:
        return text
    return _PAIR.sub(_masked_pair, text)


def _masked_pair(match: re.Match[str]) -> str:
    name, eq, value = match.groups()
    if value and _SENSITIVE.search(unquote_plus(name)):
        return f"{name}{eq}{MASK}"
    return match.group(0)
