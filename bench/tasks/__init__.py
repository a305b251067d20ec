"""Evaluation task generators and scorers: for the repair benchmarks, Erasing-NIAH (:mod:`.niah`),
multi-hop QA after a deletion (:mod:`.multihop`) and their shared chat prompt (:mod:`.prompting`);
for the function-calling benchmark, the AST-style call scorer (:mod:`.call_scoring`) and the
Seal-Tools gold-call converter (:mod:`.seal_queries`); for the live-session benchmarks, agent
trajectories (:mod:`.trajectories`); for a long-running server, agent traffic
(:mod:`.server_traffic`)."""
