"""The agent floor: live MCP servers over stdio (:mod:`.mcp_server`), the routed tool-calling
agent (:mod:`.orchestrator`), the cross-turn sidecar window (:mod:`.sidecar`) and the L0 radix
arena for warm-prefix reuse (:mod:`.radix_arena`). Importing this package imports none of
them."""
