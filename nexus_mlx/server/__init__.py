"""An OpenAI-compatible HTTP server whose sessions keep their KV cache across requests.

``serve(model, tokenizer, port=0)`` starts a :class:`Server` (``POST /v1/chat/completions``,
``POST /v1/completions``, ``POST /v1/responses`` with ``GET`` / ``DELETE /v1/responses/{id}``,
``GET /v1/models``, ``GET /health``) and returns its handle; ``server.stop()`` ends it.
Clients resend the whole conversation (or, in the Responses API, name the stored response
they continue); a pool of live sessions recognises it by its tokens and turns the difference
into cache operations (see :mod:`nexus_mlx.agent.session`).
"""

from nexus_mlx.server.runner import Server, bind_socket, serve

__all__ = ["Server", "bind_socket", "serve"]
