"""Tools as data: the :class:`~.tool.Tool` type, :class:`~.registry.ToolRegistry` and its file
formats, and the compressed signature IR (:mod:`.ir`). Pure Python and JSON: no MLX, no model,
no server (live MCP servers are :mod:`nexus_mlx.agent.mcp_server`)."""
