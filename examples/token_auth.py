"""An `--auth` callable for `criogen-graph serve`: bearer tokens mapped to user ids.

    CRIOGEN_TOKENS="s3cret-ada=ada,s3cret-bob=bob" \\
        criogen-graph serve --agent examples.support_agent:agent \\
        --auth examples.token_auth:identity

    python examples/token_auth.py   # the identity of a known and of an unknown token

Each request's `Authorization: Bearer <token>` becomes the user id the token maps to (the
owner of the threads it creates, the actor of its audit records); any other request is
refused with 401. A real deployment asks its identity provider instead.
"""

from __future__ import annotations

import hmac
import os
from collections.abc import Mapping

TOKENS_ENV = "CRIOGEN_TOKENS"


def _tokens() -> dict[str, str]:
    pairs = (item.partition("=") for item in os.environ.get(TOKENS_ENV, "").split(","))
    return {token.strip(): user.strip() for token, _, user in pairs if token.strip() and user}


def identity(headers: Mapping[str, str]) -> str | None:
    """The user id of the request's bearer token (None refuses the request)."""
    token = headers.get("authorization", "").removeprefix("Bearer ").strip()
    for known, user in _tokens().items():
        # Compared in constant time, so response times do not reveal a token's prefix.
        if hmac.compare_digest(token.encode(), known.encode()):
            return user
    return None


if __name__ == "__main__":
    os.environ.setdefault(TOKENS_ENV, "s3cret-ada=ada")
    for header in ("Bearer s3cret-ada", "Bearer guessed"):
        print(f"{header} -> {identity({'authorization': header})}")
