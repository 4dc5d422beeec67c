# `make run`: the pipeline on the built-in sample (dvc repro). `make test`: the test suite. `make lint`: ruff (lint and
# format check) and mypy over tasks/, flows/, imagenet_parquet/, benchmarks/ (ruff.toml, mypy.ini), then the import
# rules (lint-imports: pyproject.toml [tool.importlinter]).
# All create .venv and install the project with the pipeline, test and lint extras on first use (the base install,
# `pip install .`, is only the reader: pyarrow, pillow, numpy).
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

# `make docs`: regenerate docs/params.md from the params models (tests/test_docs.py fails when it is stale).
.PHONY: run test lint docs serve server remote-local remote-s3 bench clean compact relayout

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[pipeline,test,lint,fast]' '$(TORCH_SPEC)'
	touch $@

run: $(STAMP)
	PATH=$(CURDIR)/$(BIN):$$PATH dvc repro

test: $(STAMP)
	PATH=$(CURDIR)/$(BIN):$$PATH python -m pytest -q -n auto

LINT_PATHS := tasks flows imagenet_parquet benchmarks
lint: $(STAMP)
	$(BIN)/ruff check $(LINT_PATHS) && $(BIN)/ruff format --check $(LINT_PATHS) && $(BIN)/mypy $(LINT_PATHS) \
		&& $(BIN)/lint-imports --no-cache

docs: $(STAMP)
	$(BIN)/python -m tasks.common.params_doc

# `make compact`: the curation overlay folded into shards any Parquet tool reads with the current labels, in
# data/compacted/<split>/ (`make compact OUT=data/elsewhere`: another directory inside the project).
compact: $(STAMP)
	$(BIN)/python -m tasks.curate.compact $(if $(OUT),--out '$(subst ','\'',$(OUT))')

# `make relayout`: drop the layout history (versions/layout.json) and `dvc repro`: shards appended over versions are
# rewritten into the canonical layout, byte-identical to a fresh convert of the current source (the reviewer guide
# says when it is worth it). Commit and push the result as a new version.
relayout: $(STAMP)
	$(BIN)/python -m tasks.convert.history discard && PATH=$(CURDIR)/$(BIN):$$PATH dvc repro

clean:
	rm -rf data .venv

# `make server`: the Prefect UI on http://127.0.0.1:4200. `make serve` (second shell): the pipeline's deployment.
server: $(STAMP)
	PATH=$(CURDIR)/$(BIN):$$PATH prefect server start --host 127.0.0.1 --port 4200

serve: $(STAMP)
	PATH=$(CURDIR)/$(BIN):$$PATH PREFECT_API_URL=$${PREFECT_API_URL:-http://127.0.0.1:4200/api} \
		python -m flows.pipeline serve

# DVC remote for `dvc push` / training nodes' `dvc pull` (see README): a directory, or S3 (credentials from env).
remote-local: $(STAMP)
	PATH=$(CURDIR)/$(BIN):$$PATH scripts/remote.sh local $(DIR)

remote-s3: $(STAMP)
	PATH=$(CURDIR)/$(BIN):$$PATH scripts/remote.sh s3 $(URL) $(ENDPOINT)

# Benchmarks (each prints a table; they write under benchmarks/_work/, git-ignored), each run from the repository root
# as `python -m benchmarks.<name>` (docs/contributor.md lists them).
bench: $(STAMP)
	for b in benchmarks/bench_*.py; do m=$$(basename $$b .py); echo "== $$m"; $(BIN)/python -m benchmarks.$$m || exit 1; done
