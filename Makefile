# Two commands do all the set-up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test bench install clean

# (Re)install whenever pyproject.toml or constraints.txt changes.
$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c constraints.txt -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

# GraNNDis (FLX) beside the full-graph baseline on the embedded default graph, then a comparison table.
demo: $(STAMP)
	$(BIN)/granndis compare recipes/granndis_flx.yaml recipes/gnn_fb_base.yaml --trainer.max_epochs=10

test: $(STAMP)
	$(BIN)/python -m pytest -q tests

bench: $(STAMP)
	$(BIN)/python benchmarks/grad_sync.py
	$(BIN)/python benchmarks/graph_data.py
	$(BIN)/python benchmarks/gnn.py
	$(BIN)/python benchmarks/gnn_scale.py
	$(BIN)/python benchmarks/gnn_minibatch.py
	$(BIN)/python benchmarks/pipeline.py
	$(BIN)/python benchmarks/pipe_bd.py --epochs 10
	$(BIN)/python benchmarks/vrd.py --epochs 10
	$(BIN)/python benchmarks/faults.py

clean:
	rm -rf $(VENV) runs lightning_logs wandb
