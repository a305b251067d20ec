"""Margin gate, calibration, LLM rerankers and router on real parts: the MiniLM embedder, the
INT8 SLB over the 117 GitHub MCP tools, BM25 fusion (the router's default), and the default
LLM."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from nexus_mlx.errors import ArgumentError
from nexus_mlx.models.forward import forward, make_cache
from nexus_mlx.routing.embedder import Embedder
from nexus_mlx.routing.gate import Calibration, MarginGate, calibrate, margin
from nexus_mlx.routing.lexical import BM25Index
from nexus_mlx.routing.rerank import (
    QL_ANSWER,
    QL_PROMPT,
    LLMReranker,
    QueryLikelihoodReranker,
    chat_prompt,
    tool_prose,
)
from nexus_mlx.routing.router import (
    DEFAULT_K,
    DEFAULT_LEXICAL_WEIGHT,
    QUERY_PREFIX,
    Router,
    build_router,
)
from nexus_mlx.routing.slb import SemanticLookasideBuffer
from nexus_mlx.tools.registry import ToolRegistry, load_tools


@pytest.fixture(scope="module")
def github(github_tools_file):
    registry = load_tools(github_tools_file)
    embedder = Embedder.load()
    slb = SemanticLookasideBuffer.from_registry(registry, embedder, embedder_id="all-MiniLM-L6-v2")
    return registry, embedder, slb


def test_margin_and_gate():
    assert margin([0.9, 0.7, 0.1]) == pytest.approx(0.2)
    assert margin([0.5]) == float("inf")
    gate = MarginGate(0.1)
    assert gate.auto_route([0.9, 0.7]) and not gate.auto_route([0.75, 0.7])
    with pytest.raises(ArgumentError):
        margin([])


def test_calibration_is_the_20th_percentile_of_adversarial_margins(github, tmp_path):
    _, embedder, slb = github
    cal = calibrate(slb)
    assert cal.n_queries == len(slb.names) and cal.n_adversarial >= 5
    # recompute by hand
    tools = slb.vectors
    adversarial = []
    for q in tools:
        idx, scores = slb.scan(q, 2)
        a, b = tools[idx[0]], tools[idx[1]]
        if a @ b / (np.linalg.norm(a) * np.linalg.norm(b)) >= cal.duplicate_cosine:
            adversarial.append(scores[0] - scores[1])
    assert cal.tau == pytest.approx(np.percentile(adversarial, 20), abs=1e-6)
    assert 0.0 <= cal.fire_rate <= 1.0
    cal.save(tmp_path / "cal.json")
    again = Calibration.load(tmp_path / "cal.json")
    assert again == cal
    again.check(slb)
    other = SemanticLookasideBuffer(slb.dim, "another-embedder")
    with pytest.raises(ArgumentError, match="embedder"):
        again.check(other)


def test_router_auto_routes_a_clear_request(github):
    registry, embedder, slb = github
    router = Router(registry, embedder, slb, MarginGate(0.0))
    decision = router.route("Create a new GitHub repository called demo")
    assert decision.chosen == "create_repository" and not decision.escalated
    assert len(decision.candidates) == DEFAULT_K and {"embed", "scan"} <= set(decision.timings)


def test_router_escalates_to_the_llm_reranker(github, default_model):
    registry, embedder, slb = github
    model, tokenizer = default_model
    router = Router(registry, embedder, slb, MarginGate(10.0), LLMReranker(model, tokenizer), k=3)
    decision = router.route("Create a new GitHub repository called demo")
    assert decision.escalated and decision.reranked is not None
    assert sorted(n for n, _ in decision.reranked) == sorted(n for n, _ in decision.candidates)
    assert decision.chosen == decision.reranked[0][0]
    assert "rerank" in decision.timings


def _fused_by_hand(registry, slb, vector, query, weight):
    rows, cosines = slb.scan(vector, len(slb))
    dense = np.empty(len(slb), np.float32)
    dense[rows] = cosines
    return dense + np.float32(weight) * BM25Index(registry.texts_for_embedding()).normalized(query)


@pytest.mark.parametrize(("query", "dense_pick", "fused_pick"), [
    ("List the CI workflows defined in acme/payments", "actions_get", "actions_list"),
    ("List every release that nodejs/node has published", "get_release_by_tag", "list_releases"),
    ("Make me a new private repo called budget-tracker",
     "manage_repository_notification_subscription", "create_repository"),
])
def test_router_fuses_bm25_by_default(github, query, dense_pick, fused_pick):
    registry, embedder, slb = github
    fused = Router(registry, embedder, slb, MarginGate(0.0))
    dense = Router(registry, embedder, slb, MarginGate(0.0), lexical_weight=0.0)
    assert fused.lexical_weight == DEFAULT_LEXICAL_WEIGHT > 0 and dense.lexical is None
    vector = embedder.embed([query], kind="query")[0]
    plain = dense.route(query)
    assert plain.candidates == slb.lookup(vector, DEFAULT_K)  # weight 0: the SLB scan as before
    assert plain.lexical_weight == 0.0 and plain.chosen == dense_pick
    decision = fused.route(query)
    assert decision.chosen == fused_pick and decision.lexical_weight == DEFAULT_LEXICAL_WEIGHT
    by_hand = _fused_by_hand(registry, slb, vector, query, DEFAULT_LEXICAL_WEIGHT)
    order = np.argsort(-by_hand, kind="stable")[:DEFAULT_K]
    assert [n for n, _ in decision.candidates] == [slb.names[i] for i in order]
    np.testing.assert_allclose([s for _, s in decision.candidates], by_hand[order], rtol=1e-6)
    assert decision.margin == pytest.approx(float(by_hand[order[0]] - by_hand[order[1]]),
                                            abs=1e-6)


def test_fused_calibration_takes_margins_on_the_fused_score(github):
    registry, _, slb = github
    texts = registry.texts_for_embedding()
    index = BM25Index(texts)
    cal = calibrate(slb, lexical=index, lexical_weight=0.6, query_texts=texts)
    assert cal.lexical_weight == 0.6 and "BM25" in cal.describe()
    tools = slb.vectors
    adversarial = []
    for i, q in enumerate(tools):
        rows, cosines = slb.scan(q, len(slb))
        dense = np.empty(len(slb), np.float32)
        dense[rows] = cosines
        fused = dense + np.float32(0.6) * index.normalized(texts[i])
        a, b = np.argsort(-fused, kind="stable")[:2]
        cos = tools[a] @ tools[b] / (np.linalg.norm(tools[a]) * np.linalg.norm(tools[b]))
        if cos >= cal.duplicate_cosine - 1e-6:
            adversarial.append(fused[a] - fused[b])
    assert cal.n_adversarial == len(adversarial)
    assert cal.tau == pytest.approx(np.percentile(adversarial, 20), abs=1e-6)
    cal.check(slb, lexical_weight=0.6)
    with pytest.raises(ArgumentError, match="lexical weight"):
        cal.check(slb, lexical_weight=0.0)
    assert calibrate(slb).lexical_weight == 0.0
    with pytest.raises(ArgumentError, match="query text"):
        calibrate(slb, lexical=index, lexical_weight=0.6)


def test_router_rejects_mismatched_parts(github):
    registry, embedder, slb = github
    with pytest.raises(ArgumentError, match="differ"):
        Router(registry, embedder, SemanticLookasideBuffer(slb.dim, "x"), MarginGate(0.1))
    with pytest.raises(ArgumentError, match="k must"):
        Router(registry, embedder, slb, MarginGate(0.1), k=0)
    with pytest.raises(ArgumentError, match="lexical_weight"):
        Router(registry, embedder, slb, MarginGate(0.1), lexical_weight=-0.5)
    with pytest.raises(ArgumentError, match="lexical index"):
        Router(registry, embedder, slb, MarginGate(0.1), lexical=BM25Index(["a", "b"]))


# -- the query-likelihood reranker and the default router --------------------------------------
def _fresh_mean_logprob(model, tokenizer, tool, query):
    """Oracle: one uncached forward over prompt + request, mean log-probability of the request."""
    prompt = chat_prompt(tokenizer, QL_PROMPT.format(tool=tool_prose(tool)), QL_ANSWER)
    request = tokenizer.encode(" " + query, add_special_tokens=False)
    logits = forward(model, prompt + request, make_cache(model))[0]  # (T, V)
    logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    rows = mx.arange(len(prompt) - 1, len(prompt) + len(request) - 1)
    return float(logprobs[rows, mx.array(request)].mean())


def test_query_likelihood_equals_a_fresh_forward_pass(github, default_model):
    registry, _, _ = github
    model, tokenizer = default_model
    tools = [registry.get("create_repository"), registry.get("list_issues")]
    query = "Create a new GitHub repository called demo"
    reranker = QueryLikelihoodReranker(model, tokenizer, max_prompts=1)  # forces evictions
    for tool in tools + tools:
        assert reranker.likelihood(query, tool) == pytest.approx(
            _fresh_mean_logprob(model, tokenizer, tool, query), abs=1e-4)


def test_query_likelihood_fuses_the_retrieval_score(github, default_model):
    registry, _, _ = github
    model, tokenizer = default_model
    tools = [registry.get(n) for n in ("create_repository", "fork_repository", "list_issues")]
    query = "Create a new GitHub repository called demo"
    plain = dict(QueryLikelihoodReranker(model, tokenizer, retrieval_weight=0.0)
                 .rerank(query, tools, [0.9, 0.1, 0.5]))
    fused = QueryLikelihoodReranker(model, tokenizer, retrieval_weight=2.0).rerank(
        query, tools, [0.9, 0.1, 0.5])
    assert [s for _, s in fused] == sorted((s for _, s in fused), reverse=True)
    for (name, score), cosine in zip(sorted(fused), (0.9, 0.1, 0.5), strict=True):
        assert score == pytest.approx(plain[name] + 2.0 * cosine, abs=1e-9)
    assert fused[0][0] == "create_repository"
    with pytest.raises(ArgumentError, match="2 retrieval scores for 3"):
        QueryLikelihoodReranker(model, tokenizer).rerank(query, tools, [0.1, 0.2])
    with pytest.raises(ArgumentError, match="retrieval_weight"):
        QueryLikelihoodReranker(model, tokenizer, retrieval_weight=-1.0)
    with pytest.raises(ArgumentError, match="max_prompts"):
        QueryLikelihoodReranker(model, tokenizer, max_prompts=0)


def test_build_router_uses_the_tuned_defaults(github, default_model):
    registry, _, _ = github
    model, tokenizer = default_model
    embedder = Embedder.load(query_prefix=QUERY_PREFIX)
    router = build_router(registry, model, tokenizer, embedder=embedder)
    assert isinstance(router.reranker, QueryLikelihoodReranker)
    assert router.calibration is not None and router.gate.tau == router.calibration.tau
    assert router.lexical_weight == DEFAULT_LEXICAL_WEIGHT and router.lexical is not None
    assert router.calibration.lexical_weight == DEFAULT_LEXICAL_WEIGHT  # gate on fused margins
    dense = build_router(registry, model, tokenizer, embedder=embedder, lexical_weight=0.0)
    assert dense.lexical is None and dense.calibration is not None
    assert dense.calibration.lexical_weight == 0.0
    assert router.slb.tools_digest == registry.digest()
    decision = router.route("Create a new GitHub repository called demo")
    assert decision.chosen == "create_repository"
    escalating = Router(registry, embedder, router.slb, MarginGate(10.0), router.reranker)
    decision = escalating.route("Create a new GitHub repository called demo")
    assert decision.escalated and decision.reranked is not None
    names = [n for n, _ in decision.candidates]
    assert sorted(n for n, _ in decision.reranked) == sorted(names)
    with pytest.raises(ArgumentError, match="empty"):
        build_router(ToolRegistry(), model, tokenizer, embedder=embedder)
