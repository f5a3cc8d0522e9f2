"""`Telemetry`: OpenTelemetry spans for runs, model calls and tool calls.

The public home of the name; the code lives in `criogen_graph.adapters.telemetry`.
Needs the `otel` extra (`pip install -e '.[otel]'` in a checkout).
"""

from criogen_graph.adapters.telemetry import Telemetry

__all__ = ["Telemetry"]
