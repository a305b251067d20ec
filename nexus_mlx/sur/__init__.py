"""The Semantic-Unit Refresh core (paper 2), shared by repair and by query-directed splice
repair: semantic units (:mod:`.units`), token relevance from the frozen input embeddings
(:mod:`.relevance`) and the budgeted unit selection (:mod:`.select`). It reads a model's
embedding table and a tokenizer; it never runs the model's layers or touches a cache."""
