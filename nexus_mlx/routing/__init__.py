"""Tool routing without the deep cache: the sentence embedder (:mod:`.bert`, :mod:`.embedder`),
the INT8 semantic lookaside buffer (:mod:`.slb`), the margin gate (:mod:`.gate`), rerankers
(:mod:`.rerank`) and the router that joins them (:mod:`.router`). It never reads an LLM's KV
cache. Importing this package imports none of them."""
