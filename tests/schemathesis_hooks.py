"""Loaded by schemathesis (SCHEMATHESIS_HOOKS) in tests/test_serve_fuzz.py: a check that
every refusal of `criogen-graph serve` is `{"detail": "..."}` with no traceback."""

from __future__ import annotations

from typing import Any

import schemathesis


@schemathesis.check
def refusals_name_the_problem(ctx: Any, response: Any, case: Any) -> bool | None:
    if not 400 <= response.status_code < 500:
        return None
    try:
        body = response.json()
    except ValueError:
        raise AssertionError(f"a {response.status_code} without a JSON body") from None
    if not isinstance(body, dict) or not isinstance(body.get("detail"), str):
        raise AssertionError(f"a {response.status_code} without a detail: {body!r}")
    if "Traceback" in response.text:
        raise AssertionError("a traceback in a response")
    return True
