# ddplab: `make demo` runs the main job, `make test` the whole suite. Both set everything up first:
# the virtual environment, a Docker engine with Compose v2 (installed and started where we are root
# on Debian and none runs), the OpenSSH client and rsync, and the node image.
#
# PYTHON is the interpreter labctl's virtual environment is made with: any CPython 3.10 or newer
# (`make demo PYTHON=python3.13`). The nodes run the image's own Python whatever it is; labctl
# itself needs no torch, only `make test` adds it, for the tests that run the trainer on the host.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# One stamp per interpreter asked for: naming another one remakes the environment with it.
VENV_STAMP := $(VENV)/.installed-$(subst /,_,$(PYTHON))
# The documentation toolchain (the `docs` extra: MkDocs, its Material theme and plug-ins; about 15,000
# files, most of them the theme's icons) only where the site is built: `make docs` and the suite.
DOCS_STAMP := $(VENV)/.docs
LABCTL := $(BIN)/labctl
TORCH_VERSION ?= 2.13.0
TORCH_INDEX_URL ?= https://download.pytorch.org/whl/cpu
NODES ?= 3
PYTEST_ARGS ?=

.PHONY: demo test unit host integration docs docs-serve docs-tools venv host-torch tools test-engines netem-vm engine image image-cuda image-mismatch down clean

demo: image
	$(LABCTL) up --nodes $(NODES)
	$(LABCTL) run -- -m trainer --epochs 3
	@echo "The lab is still up: '$(LABCTL) status' shows it, '$(LABCTL) down' removes it."

# The tests that drive real labs, a module per worker (its tests in order, on the worker's shared labs
# or the module's own: tests/integration/conftest.py says which; the longest modules first, in the
# order that conftest gives them, which --no-loadscope-reorder keeps), INTEGRATION_WORKERS at a time; then, one at a time, those marked `alone`, which measure
# links, round trips and CPU shares that a second test would skew. They leave the cores idle about
# 45% of the time, so `make test` runs the unit and host tests (tests/unit, tests/host: two processes,
# pytest-xdist) beside them at idle CPU priority (tests/idle.sh: a cgroup with cpu.idle, which ranks
# below the nodes' containers too), their output kept in .lab/unit-tests.log and printed after.
# Each step runs whatever the ones before gave; make fails if any did (5, "no tests selected" by a
# PYTEST_ARGS filter, is not a failure).
#
# Three workers on two cores: a lab test waits as well as computes (containers starting, timeouts,
# shaped links), and a third worker fills those waits: alternated on one tree here, three took 12 min
# 33 s to 13 min 51 s (cores idle 5.5 to 8.5%), two 14 min 33 s and 16 min 2 s (idle 11%); see
# docs/explanation/measurements.md.
INTEGRATION_WORKERS ?= 3
INTEGRATION := tests/docs tests/integration
PYTEST := $(BIN)/python -m pytest
# The netem VM's tests (QEMU: a host process, no container) run in `make test` beside the `alone` ones
# at idle priority, as the unit tests do: the VM's clock counts instructions, so what they measure is
# the same on a busy host, and its boot (about 31 CPU-seconds) leaves the part run three at a time.
NETEM_TESTS := tests/integration/test_netem_kernel.py
RUN_SIDE_BY_SIDE := $(PYTEST) $(INTEGRATION) -n $(INTEGRATION_WORKERS) --dist loadfile --no-loadscope-reorder \
	-m "not alone" --ignore=$(NETEM_TESTS) $(PYTEST_ARGS) || passed_or_empty $$?
RUN_ALONE := $(PYTEST) $(INTEGRATION) -m alone --ignore=$(NETEM_TESTS) $(PYTEST_ARGS) || passed_or_empty $$?
RUN_NETEM := $(PYTEST) $(NETEM_TESTS) $(PYTEST_ARGS) || passed_or_empty $$?
RUN_INTEGRATION := $(RUN_SIDE_BY_SIDE); $(RUN_ALONE); $(RUN_NETEM)
UNIT_LOG := .lab/unit-tests.log
NETEM_LOG := .lab/netem-tests.log
define TRACK_STATUS
status=0; passed_or_empty() { [ "$$1" -eq 5 ] || status=$$1; }
endef

# The node images and torch on the host, side by side (make -j2): one is pip unpacking and compiling
# torch into the venv (about 45 s on a fresh clone), the other the engine and pip resolving the nodes'
# wheels (about 30 s), each mostly on one core. What may run apt (netem-vm, engine, tools,
# test-engines) runs first, one at a time, so two apt-gets never meet; in the -j2 part and in the
# tests, engine, tools and the engines under test find everything there.
SETUP_IMAGES_AND_HOST_TORCH := $(MAKE) --no-print-directory -j2 --output-sync=target image-mismatch host-torch

test: docs netem-vm engine tools test-engines
	+@$(SETUP_IMAGES_AND_HOST_TORCH)
	@$(TRACK_STATUS); \
	$(RUN_SIDE_BY_SIDE); \
	mkdir -p $(dir $(UNIT_LOG)); \
	sh tests/idle.sh $(PYTEST) tests/host tests/unit -n 2 $(PYTEST_ARGS) >$(UNIT_LOG) 2>&1 & unit=$$!; \
	sh tests/idle.sh $(PYTEST) $(NETEM_TESTS) $(PYTEST_ARGS) >$(NETEM_LOG) 2>&1 & netem=$$!; \
	$(RUN_ALONE); \
	wait $$netem || passed_or_empty $$?; \
	wait $$unit || passed_or_empty $$?; \
	echo "--- the netem VM's tests, run beside the alone ones at idle priority ($(NETEM_LOG)):"; cat $(NETEM_LOG); \
	echo "--- the unit and host tests, run beside the alone ones at idle priority ($(UNIT_LOG)):"; cat $(UNIT_LOG); \
	exit $$status

# The unit tests, in this process or in short ones of their own: the quick check of a change.
unit: venv host-torch tools
	$(PYTEST) tests/unit $(PYTEST_ARGS)

# The host tests: real processes and real torch.distributed on this machine (torchrun, the fork
# server's workers, other Pythons, real pip, pytest sessions), no Docker.
host: venv host-torch
	$(PYTEST) tests/host $(PYTEST_ARGS)

integration: docs-tools netem-vm engine tools test-engines
	+@$(SETUP_IMAGES_AND_HOST_TORCH)
	@$(TRACK_STATUS); $(RUN_INTEGRATION); exit $$status

# The documentation site (mkdocs.yml, docs/): built strict into site/, so a broken link or a page
# missing from the nav fails `make test`; it needs no network and browses from file://.
docs: docs-tools
	NO_MKDOCS_2_WARNING=1 $(BIN)/python -m mkdocs build --strict --site-dir site

docs-serve: docs-tools
	NO_MKDOCS_2_WARNING=1 $(BIN)/python -m mkdocs serve

venv: $(VENV_STAMP)

docs-tools: $(DOCS_STAMP)

$(DOCS_STAMP): $(VENV_STAMP)
	$(BIN)/pip install -q -e ".[docs]"
	touch $@

$(VENV_STAMP): pyproject.toml
	@py=$$(bash labctl/scripts/find-python.sh "$(PYTHON)") || exit 2; \
	if [ "$$(cat $(VENV)/.python 2>/dev/null)" != "$$py" ]; then \
	  rm -rf $(VENV); echo "[venv] $(VENV) with $$py ($$("$$py" -V 2>&1))"; \
	  "$$py" -m venv $(VENV) && echo "$$py" > $(VENV)/.python; \
	fi
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e ".[test,plot]"
	@# Bytecode up front: where PYTHONDONTWRITEBYTECODE is set (as on CI runners), every labctl
	@# command would otherwise compile its modules again (about 25 ms of each `labctl up`).
	$(BIN)/python -m compileall -q labctl trainer >/dev/null
	touch $@

# torch on the host: the trainer's unit tests, the host-vs-lab comparisons and bench scaling's host
# rows run it here. Its CPU build alone (--no-deps) first, from pip's local find-links if it has the
# wheel, else from the CPU index (plain PyPI would install the CUDA build, several GB); then its
# dependencies from the ordinary index.
host-torch: $(VENV)/.torch

$(VENV)/.torch: $(VENV_STAMP)
	$(BIN)/pip install -q --no-deps --no-index "torch==$(TORCH_VERSION)" 2>/dev/null \
	  || $(BIN)/pip install -q --no-deps --index-url $(TORCH_INDEX_URL) "torch==$(TORCH_VERSION)" \
	  || { echo "error: found no CPU build of torch $(TORCH_VERSION) for $$($(BIN)/python -V 2>&1) locally or at" \
	       "$(TORCH_INDEX_URL). The lab itself needs none ('make demo'); for the tests, set TORCH_INDEX_URL" \
	       "to an index that has it, or use PYTHON=python3.11 here." >&2; exit 1; }
	$(BIN)/pip install -q -e ".[trainer]"
	touch $@

# The netem VM that tests/integration/test_netem_kernel.py boots to run labctl's delay, jitter and loss
# on a kernel with sch_netem: QEMU, cpio, busybox-static and iperf3 (installed as root on Debian where
# missing), then Debian's stock kernel (about 70 MB through apt, once per kernel version) and an
# initramfs, cached in .lab/netem-vm/ (or $DDPLAB_CACHE_DIR/netem-vm/). A second time: under a second.
netem-vm: venv
	bash tests/netem/ensure-vm-tools.sh
	$(BIN)/python tests/netem/netem_vm.py prepare

engine: venv
	PYTHON=$(BIN)/python bash labctl/scripts/ensure-docker.sh

# ssh, ssh-keygen and rsync: `labctl hosts` and its tests (installed as root on Debian where missing).
tools:
	bash labctl/scripts/ensure-tools.sh

# The engines the suite tests labctl against besides the one it runs on: Podman (refused by name) and
# rootless Docker (rootlesskit, uidmap, slirp4netns), installed here, before the tests run in
# parallel, so no test installs a package while another does (apt takes one at a time). Where we
# are not root on Debian this only warns: those two tests then say what is missing.
test-engines:
	-bash labctl/scripts/ensure-tools.sh test-engines podman:podman rootlesskit:rootlesskit newuidmap:uidmap \
		slirp4netns:slirp4netns

image: venv engine tools
	$(LABCTL) build

# The GPU node image (Dockerfile.cuda): torch's CUDA build at the same release, about 2.8 GB of
# wheels through pip's index and 3 minutes, once. The suite trains on it with gloo where there is no
# GPU, so every run exercises it.
#
# CUDA_BUILD_FLAGS: on CI (CI set), which builds each image once, `--lean` removes what each CUDA
# build keeps as cache: its wheels-and-venv stage (8 to 9 GB apiece; the engine holds about 30 GB
# after `make test` without it, 13 GB with it) and, even where the image is up to date, the wheels
# (2.8 and 3.0 GB in .lab/). A trainer change is built on each image's tagged runtime either way
# (seconds); only a new torch or other wheels then install torch again (281 s here). Elsewhere the
# cache stays; `make test CUDA_BUILD_FLAGS=--lean` saves the space there too.
CUDA_BUILD_FLAGS ?= $(if $(CI),--lean)
image-cuda: image
	$(LABCTL) build --cuda $(CUDA_BUILD_FLAGS)

# The node image with a second torch release, for the version-mismatch scenario: the CUDA image at
# torch 2.14.1, built once (a few minutes, several GB from pip's index) and cached like any image.
# (With --cuda the command's first image is the CUDA one, up to date by then, so --lean leaves the
# CPU image's cache alone: the suite builds that image again under other tags.)
image-mismatch: image-cuda
	$(LABCTL) build --cuda --mismatch-image $(CUDA_BUILD_FLAGS)

down: venv
	$(LABCTL) down

clean: venv
	-$(LABCTL) down --volumes
	rm -rf $(VENV) .lab
