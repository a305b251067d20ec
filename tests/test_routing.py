"""Margin gate, calibration, LLM reranker and router on real parts: the MiniLM embedder, the
INT8 SLB over the 117 GitHub MCP tools, and the default LLM."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from nexus_mlx.agent.registry import load_tools
from nexus_mlx.routing.embedder import Embedder
from nexus_mlx.routing.gate import Calibration, CalibrationError, MarginGate, calibrate, margin
from nexus_mlx.routing.rerank import LLMReranker
from nexus_mlx.routing.router import Router, RoutingError
from nexus_mlx.routing.slb import SemanticLookasideBuffer

GITHUB = Path(__file__).resolve().parents[2] / "shared" / "data" / "github-mcp" / "tools.json"
pytestmark = pytest.mark.skipif(not GITHUB.exists(), reason="shared data not available")


@pytest.fixture(scope="module")
def github():
    registry = load_tools(GITHUB)
    embedder = Embedder.load()
    slb = SemanticLookasideBuffer.from_registry(registry, embedder, embedder_id="all-MiniLM-L6-v2")
    return registry, embedder, slb


def test_margin_and_gate():
    assert margin([0.9, 0.7, 0.1]) == pytest.approx(0.2)
    assert margin([0.5]) == float("inf")
    gate = MarginGate(0.1)
    assert gate.auto_route([0.9, 0.7]) and not gate.auto_route([0.75, 0.7])
    with pytest.raises(CalibrationError):
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
    with pytest.raises(CalibrationError, match="embedder"):
        again.check(other)


def test_router_auto_routes_a_clear_request(github):
    registry, embedder, slb = github
    router = Router(registry, embedder, slb, MarginGate(0.0))
    decision = router.route("Create a new GitHub repository called demo")
    assert decision.chosen == "create_repository" and not decision.escalated
    assert len(decision.candidates) == 5 and {"embed", "scan"} <= set(decision.timings)


def test_router_escalates_to_the_llm_reranker(github, default_model):
    registry, embedder, slb = github
    model, tokenizer = default_model
    router = Router(registry, embedder, slb, MarginGate(10.0), LLMReranker(model, tokenizer), k=3)
    decision = router.route("Create a new GitHub repository called demo")
    assert decision.escalated and decision.reranked is not None
    assert sorted(n for n, _ in decision.reranked) == sorted(n for n, _ in decision.candidates)
    assert decision.chosen == decision.reranked[0][0]
    assert "rerank" in decision.timings


def test_router_rejects_mismatched_parts(github):
    registry, embedder, slb = github
    with pytest.raises(RoutingError, match="differ"):
        Router(registry, embedder, SemanticLookasideBuffer(slb.dim, "x"), MarginGate(0.1))
    with pytest.raises(RoutingError, match="k must"):
        Router(registry, embedder, slb, MarginGate(0.1), k=0)
