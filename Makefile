# The two commands of the quick start: `make demo` and `make test`.
# Both create .venv and install deskpod into it first (once; again when pyproject.toml changes).

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# The dev/CI install pins these two (they lie on local disk on our build machines); pyproject.toml declares ranges.
TORCH_PINS := torch==2.14.1 torchvision==0.29.1
FMNIST := /usr/share/datasets/fashion-mnist
CHROMIUM := /usr/bin/chromium

.PHONY: demo test lint typecheck unit data browser slurm sandbox install bench clean

demo: install data
	$(BIN)/deskpod train

test: install data browser slurm sandbox lint typecheck unit

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip 2>&1 | grep -v '^WARNING: Location' || true
	$(BIN)/python -m pip install -q $(TORCH_PINS) 2>&1 | grep -v '^WARNING: Location' || true
	$(BIN)/python -m pip install -q -e '.[dev]' 2>&1 | grep -v '^WARNING: Location' || true
	$(BIN)/python -c "import torch, torchvision, deskpod"
	touch $@

# Fashion-MNIST comes from Debian's dataset-fashion-mnist package. Without apt-get (or root),
# `deskpod train` itself explains how to get it.
data:
	@if [ ! -f $(FMNIST)/train-images-idx3-ubyte.gz ]; then \
	  if command -v apt-get >/dev/null 2>&1; then \
	    SUDO=; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
	    echo "installing Fashion-MNIST (Debian package dataset-fashion-mnist)"; \
	    $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq dataset-fashion-mnist >/dev/null \
	      || echo "could not install dataset-fashion-mnist; deskpod will say how to get it"; \
	  else echo "no apt-get: see README for how to get Fashion-MNIST"; fi; \
	fi

# The dashboard's end-to-end tests drive Debian's Chromium with Playwright (no browser download).
browser:
	@if [ ! -x $(CHROMIUM) ]; then \
	  if command -v apt-get >/dev/null 2>&1; then \
	    SUDO=; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
	    echo "installing Chromium (Debian package chromium) for the dashboard's browser tests"; \
	    $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq chromium >/dev/null \
	      || echo "could not install chromium; the browser tests will say so"; \
	  else echo "no apt-get: install Chromium at $(CHROMIUM) for the browser tests"; fi; \
	fi

# The cluster tests run a real Slurm (slurmctld + two slurmd on 127.0.0.1, started by the tests themselves).
slurm:
	@if ! command -v slurmctld >/dev/null 2>&1 && [ ! -x /usr/sbin/slurmctld ]; then \
	  if command -v apt-get >/dev/null 2>&1; then \
	    SUDO=; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
	    echo "installing Slurm and munge (Debian packages slurm-wlm slurmctld slurmd slurm-client munge) for the cluster tests"; \
	    $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq slurm-wlm slurmctld slurmd slurm-client munge >/dev/null \
	      || echo "could not install Slurm; the cluster tests will say so"; \
	  else echo "no apt-get: install Slurm (slurmctld, slurmd, clients) and munge for the cluster tests"; fi; \
	fi

# Jobs of the pod service run in bubblewrap sandboxes; the isolation tests use it with real Unix users.
sandbox:
	@if ! command -v bwrap >/dev/null 2>&1; then \
	  if command -v apt-get >/dev/null 2>&1; then \
	    SUDO=; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
	    echo "installing bubblewrap (Debian package bubblewrap) for the pod's job sandboxes"; \
	    $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq bubblewrap >/dev/null \
	      || echo "could not install bubblewrap; deskpod up will say how jobs run without it"; \
	  else echo "no apt-get: install bubblewrap (bwrap) for the pod's job sandboxes"; fi; \
	fi

lint: install
	$(BIN)/ruff check deskpod tests benchmarks
	$(BIN)/ruff format --check deskpod tests benchmarks

typecheck: install
	$(BIN)/mypy

unit: install
	$(BIN)/python -m pytest -q -p no:cacheprovider

bench: install data
	$(BIN)/deskpod bench train

clean:
	rm -rf $(VENV) build *.egg-info .mypy_cache .ruff_cache .pytest_cache
