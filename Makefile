# ddplab: the commands a user and CI run. `make help` lists them.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
DATA   ?= data/shards
# make train STEPS=.. DEPTH=..: passed to the trainer only when given (its own defaults otherwise).
STEPS  ?=
DEPTH  ?=
# make wheelhouse: the folder (ddplab_wheelhouse_dir), the nodes' Python versions, an inventory to read them from.
WHEELHOUSE ?= wheelhouse
PYTHONS ?= 3.11
# CUDA_FALLBACK=1: a Python with no reachable +cpu torch (only PyPI reachable) gets PyPI's CUDA build (~2.8 GB)
CUDA_FALLBACK ?=
# make tune: the lab's inventory, the seconds each layout trains, the processes of the 1xN layout.
INV ?=
TUNE_SECONDS ?= 120
TUNE_PROCS ?= 2
TUNE_ROUNDS ?= 1
# make test: nanochat's own dependencies, for the tests that run its real scripts (tests/byo/test_nanochat_local.py)
NANOCHAT_REQUIREMENTS := tests/byo/fixtures/nanochat/requirements.txt
# make test: test files run in this many parallel workers, each with its own simulated lab (tests/conftest.py),
# handed out in the order tests/conftest.py sorts them (xdist would otherwise start the files with most tests first)
TEST_WORKERS ?= 3
# make bench-distribution: the data sent to every node, in MiB, and the interleaved rounds
DIST_SIZE_MB ?= 1024
DIST_ROUNDS ?= 3

.PHONY: help setup lint test test-fast data wheelhouse tune train demo follow bench bench-hetero bench-wifi bench-trainer bench-preflight bench-relaunch bench-lowcomm bench-distribution bench-shard clean

help:  ## List the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-10s %s\n", $$1, $$2}'

setup: $(BIN)/.ddplab-installed  ## Create .venv and install ddplab with its pinned torch

$(BIN)/.ddplab-installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

lint: setup  ## ruff + ansible-lint (production profile)
	$(BIN)/ruff check .
	$(BIN)/ansible-lint --offline --profile production

# the venv's own torch is named in the same install: nanochat's dependencies never bring another
$(BIN)/.nanochat-installed: $(BIN)/.ddplab-installed $(NANOCHAT_REQUIREMENTS)
	$(BIN)/pip install --quiet -r $(NANOCHAT_REQUIREMENTS) \
	  "torch==$$($(BIN)/python -c 'import torch; print(torch.__version__)')"
	touch $@

test: setup $(BIN)/.nanochat-installed lint  ## Lint, then the whole test suite (simulated hosts need root)
	$(BIN)/pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=25

test-fast: setup  ## Tests without the slow and simlan markers
	$(BIN)/pytest -q -m 'not slow and not simlan'

data: setup  ## Generate the default deterministic corpus as parquet shards
	$(BIN)/python -m trainer.data prepare --out $(DATA)

wheelhouse: setup  ## The pinned CPU torch + deps and your requirements' wheels, once, for the nodes' Pythons (PYTHONS="3.11 3.12", INV=inventory/<yours>)
	$(BIN)/python -m ddplab.wheelhouse fill --dir $(WHEELHOUSE) $(foreach p,$(PYTHONS),--python $(p)) $(if $(INV),-i $(INV)) $(if $(CUDA_FALLBACK),--cuda-fallback)

tune: setup  ## tokens/s of 1 node x 1 process, 1 node x N processes and all nodes (INV=inventory/<yours>)
	$(BIN)/python -m ddplab tune -i $(or $(INV),inventory/local) --seconds $(TUNE_SECONDS) --procs $(TUNE_PROCS) --rounds $(TUNE_ROUNDS)

train: data  ## Single machine, 2 ranks, no Ansible
	$(BIN)/torchrun --standalone --nproc_per_node=2 -m trainer --data $(DATA) --out runs/train-$$(date +%Y%m%d-%H%M%S) \
	  $(if $(STEPS),--steps $(STEPS)) $(if $(DEPTH),--depth $(DEPTH))

clean:  ## Remove generated data and runs (keeps .venv)
	rm -rf data runs

demo: data  ## Fresh machine: setup, default data, a 2-rank launch on this machine, its report
	$(BIN)/ansible-playbook -i inventory/local playbooks/launch.yml -e ddplab_wait=true
	@cat runs/$$(cat ~/ddplab/local0/last_run)/report.md

follow:  ## Live view of every node's tmux pane (INV=inventory/simlan)
	$(BIN)/python -m ddplab follow -i $(or $(INV),inventory/local)

bench: data  ## Scaling lab on 2 simulated hosts at 1 Gbit/s (root, ~40 min): runs/bench-<id>/report.md
	$(BIN)/python bench/scaling_lab.py --nodes 2 --rate 1gbit

bench-hetero: setup  ## Balanced vs uniform DDP, node1 at half a core (root, ~6 min; HETERO_ARGS="--case 3" for 3 hosts, --priority on a busy machine)
	$(BIN)/python bench/hetero.py $(HETERO_ARGS)

bench-wifi: setup  ## Wired vs Wi-Fi-like links (delay, jitter, loss) at 2 hosts: tokens/s, all-reduce (root, ~10 min)
	$(BIN)/python bench/wifi.py

bench-trainer: setup  ## 1 vs 2 ranks on this machine against a textbook DDP loop
	$(BIN)/python bench/trainer_scaling.py

bench-relaunch: data  ## launch.yml vs bare ssh+tmux on a prepared lab, 2 and 8 simulated hosts (root)
	$(BIN)/python bench/relaunch.py --hosts 2 8 --rounds 3

bench-lowcomm: setup  ## Low-communication modes vs per-step DDP at equal tokens, 2 local ranks (~10 min idle, ~1 h busy; LOWCOMM_ARGS="--steps 160 --seeds 1337" for a quick look; LOWCOMM_ARGS="--corpus stdlib": Python's own source, a harder corpus, to bench/results/lowcomm-stdlib/)
	nice -n 10 $(BIN)/python bench/lowcomm.py $(LOWCOMM_ARGS)

bench-distribution: setup  ## Star vs relay: DIST_SIZE_MB to 2, 4, 8 simulated hosts, uplink 100 Mbit/s or 1 Gbit/s (root)
	$(BIN)/python bench/distribution.py --size-mb $(DIST_SIZE_MB) --rounds $(DIST_ROUNDS)

bench-shard: setup  ## DDP vs --shard on simulated hosts capped at 1100 MiB each: the largest model each trains, tokens/s where both do (root; SHARD_ARGS="--hosts 4 --depth 8", "--hosts --speed-hosts 2")
	$(BIN)/python bench/shard.py $(SHARD_ARGS)

bench-preflight: setup  ## Preflight wall time, healthy and per fault, on simulated hosts (root)
	$(BIN)/python bench/preflight_bench.py
