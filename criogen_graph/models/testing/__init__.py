"""Scripted models for tests: `FakeModel`, `FakeReply`, `FunctionModel`, `RecordingModel`.

This module gathers their public names; each lives in a module of its own:
`fake_model` (`FakeModel`), `fake_reply` (`FakeReply`, shared by the scripted models),
`function_model` (`FunctionModel`) and `recording_model` (`RecordingModel` and the
recording format).
"""

from criogen_graph.models.testing.fake_model import FakeModel
from criogen_graph.models.testing.fake_reply import FakeReply
from criogen_graph.models.testing.function_model import FunctionModel
from criogen_graph.models.testing.recording_model import RecordingModel

__all__ = ["FakeModel", "FakeReply", "FunctionModel", "RecordingModel"]
