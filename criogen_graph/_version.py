"""The version of criogen-graph: the installed distribution's, else the source tree's."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

__all__ = ["__version__"]

try:
    __version__: str = version("criogen-graph")
except PackageNotFoundError:
    # Run from a source tree that was never installed: keep in step with pyproject.toml.
    __version__ = "0.1.0"
