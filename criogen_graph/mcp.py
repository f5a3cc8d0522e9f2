"""MCP (Model Context Protocol) servers as tools: `McpServer`, `McpServerError`, `McpTool`.

The public home of these names; the code lives in `criogen_graph.adapters.mcp`. Needs
the `mcp` extra (`pip install -e '.[mcp]'` in a checkout), imported only when a server is
created.
"""

from criogen_graph.adapters.mcp import McpServer, McpServerError, McpTool

__all__ = ["McpServer", "McpServerError", "McpTool"]
