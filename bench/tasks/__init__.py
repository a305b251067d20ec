"""Evaluation task generators for the repair benchmarks: Erasing-NIAH (:mod:`.niah`), multi-hop
QA after a deletion (:mod:`.multihop`) and their shared chat prompt (:mod:`.prompting`)."""
