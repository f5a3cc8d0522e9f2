"""Real MCP servers (built with the `mcp` package) that tests/test_mcp.py talks to."""
