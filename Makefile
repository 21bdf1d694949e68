# `make demo` and `make test` build .venv with the machine's python3 on first use and reuse it after.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test test-fast bench bench-peers clean

# The pinned set (constraints.txt) is installed by uv, which pip installs first: the same versions
# in about 15 s instead of about 2 minutes (measured here; CI builds .venv on every run). Where uv
# cannot install (no uv wheel for the platform, an index only pip is configured for), pip does.
UV := uv==0.13.9

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade "pip>=24" "$(UV)" || $(PY) -m pip install --quiet --upgrade "pip>=24"
	$(VENV)/bin/uv pip install --quiet --python $(PY) -c constraints.txt -e ".[dev]" || $(PY) -m pip install --quiet -c constraints.txt -e ".[dev]"
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/fedpriv demo

test: $(STAMP)
	$(PY) -m pytest -n 2 --dist loadfile --no-loadscope-reorder -q

test-fast: $(STAMP)
	$(PY) -m pytest -n 2 --dist loadfile --no-loadscope-reorder -q -m "not slow"

bench: $(STAMP)
	$(PY) benchmarks/synthetic_corpus.py --preset stackoverflow --users-to-sample 5000
	$(PY) benchmarks/dp_vocab.py
	$(PY) benchmarks/dpsgd_step.py --model all
	$(PY) benchmarks/random_sampling.py
	$(PY) benchmarks/local_privacy.py
	$(PY) benchmarks/federated_engines.py --model tiny
	$(PY) benchmarks/federated_engines.py --model small
	$(PY) benchmarks/empirical_audit.py --model stackoverflow
	$(MAKE) bench-peers

# fedpriv against Opacus, TensorFlow Privacy, TensorFlow Federated, Flower's built-in DP and pfl-research; each
# peer in its own environment under .bench-envs/ (created on first use, never in .venv). A peer
# that cannot be installed is reported on the page, with pip's error (TFF 0.87 on Python 3.11 has
# no jaxlib 0.4.14: envs.sh installs it with --no-deps and jax/jaxlib 0.4.13, see its header).
# Writes docs/benchmarks.md from every section's result in .bench-envs/results/ (a section not
# rerun keeps its last result and command on the page). The slowest sections: pfl (cohorts of 100 and
# 1,000 against pfl-research and Flower: 20 minutes with --repeats 1 --pfl-rounds 1 --pfl-dp-cohorts 100,
# about an hour with the defaults, on 2 shared CPUs), opacus-bert (4 to 16 minutes) and tf-keras
# (about 6); one section alone, e.g.:
#   make bench-peers BENCH_PEERS_SECTIONS=tf-keras
BENCH_PEERS_SECTIONS ?= epsilon,opacus-nwp,opacus-bert,flower,tff,tf-keras,pfl
BENCH_PEERS_ARGS ?= --repeats 2
bench-peers: $(STAMP)
	-bash benchmarks/peers/envs.sh all
	$(PY) benchmarks/peers/run.py --sections $(BENCH_PEERS_SECTIONS) $(BENCH_PEERS_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis

# ---- Flower CLI (docs/federated.md) -------------------------------------------------------------
# `flwr run .` as a local simulation, offline: runtime dependency installation off (the apps run
# from .venv), the venv's bin on PATH (flwr starts `flower-superlink` by name), Flower's state
# (config.toml with the `local` connection, installed FABs, the background SuperLink's database
# and log) under runs/flwr-home instead of ~/.flwr. The SuperLink keeps running after the run
# (127.0.0.1:39091); `make flwr-stop` ends it. Through `fedpriv flwr-run`, which exits 2 when the
# run ends finished:failed (`flwr run` itself exits 0 then).
#   make flwr-run FLWR_CONFIG=experiments/dp-fedavg-shakespeare.toml
FLWR_CONFIG ?= experiments/fedavg-shakespeare.toml
FLWR_SUPERNODES ?= 4
FLWR_HOME_DIR ?= $(CURDIR)/runs/flwr-home
FLWR_ENV = PATH="$(CURDIR)/$(VENV)/bin:$$PATH" FLWR_HOME="$(FLWR_HOME_DIR)" FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1

.PHONY: flwr-run flwr-stop deploy-local

flwr-run: $(STAMP)
	$(FLWR_ENV) $(VENV)/bin/fedpriv flwr-run . --run-config "config='$(FLWR_CONFIG)'" \
		--federation-config "num-supernodes=$(FLWR_SUPERNODES) client-resources-num-cpus=1"

flwr-stop:
	@pids=$$(pgrep -f "[f]lower-superlink .*$(FLWR_HOME_DIR)/local-superlink" || true); \
	if [ -n "$$pids" ]; then echo "stopping local SuperLink $$pids"; kill $$pids; else echo "no local SuperLink of $(FLWR_HOME_DIR) is running"; fi

# A deployment on loopback: flower-superlink + 3 flower-supernodes, SuperNode 0 killed after round 1.
deploy-local: $(STAMP)
	$(PY) -m fedpriv.engines.flower.deploy experiments/fedavg-shakespeare-quick.toml --supernodes 3 \
		--run-dir runs/fedavg-shakespeare-quick-deploy --kill-node-after-round 1 --resume
