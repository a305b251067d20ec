"""The agent layer: tools, the tool registry (files and live MCP servers) and, later, the turn.

Submodules are imported on demand: ``nexus_mlx.agent.tools`` (the ``Tool`` type),
``nexus_mlx.agent.registry`` (``ToolRegistry`` and file loaders) and
``nexus_mlx.agent.mcp_server`` (live MCP servers over stdio; needs the ``mcp`` package).
Importing this package alone imports none of them.
"""
