"""The version of criogen-graph. Written out (kept equal to pyproject.toml's by
tests/test_cli.py::test_version): reading the installed distribution's metadata would add
a scan of site-packages to every `import criogen_graph`."""

__all__ = ["__version__"]

__version__ = "0.1.0"
