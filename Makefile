# ddplab: `make demo` runs the main job, `make test` the whole suite. Both set everything up first:
# the virtual environment, a Docker engine with Compose v2 (installed and started where we are root
# on Debian and none runs), the OpenSSH client and rsync, and the node image.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
LABCTL := $(BIN)/labctl
TORCH_VERSION ?= 2.13.0
TORCH_INDEX_URL ?= https://download.pytorch.org/whl/cpu
NODES ?= 3
PYTEST_ARGS ?=

.PHONY: demo test unit integration venv tools engine image image-mismatch down clean

demo: image
	$(LABCTL) up --nodes $(NODES)
	$(LABCTL) run -- -m trainer --epochs 3
	@echo "The lab is still up: '$(LABCTL) status' shows it, '$(LABCTL) down' removes it."

test: image image-mismatch
	$(BIN)/python -m pytest tests $(PYTEST_ARGS)

unit: venv tools
	$(BIN)/python -m pytest tests/unit $(PYTEST_ARGS)

integration: image image-mismatch
	$(BIN)/python -m pytest tests/integration $(PYTEST_ARGS)

venv: $(VENV)/.installed

# torch's CPU build alone (--no-deps) first: from pip's local find-links if it has the wheel, else
# from the CPU index (plain PyPI would install the CUDA build, several GB). Its dependencies then
# come from the ordinary index with the project's own.
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q --no-deps --no-index "torch==$(TORCH_VERSION)" 2>/dev/null \
	  || $(BIN)/pip install -q --no-deps --index-url $(TORCH_INDEX_URL) "torch==$(TORCH_VERSION)"
	$(BIN)/pip install -q -e ".[trainer,test]"
	touch $@

engine:
	PYTHON=$(PYTHON) bash labctl/scripts/ensure-docker.sh

# ssh, ssh-keygen and rsync: `labctl hosts` and its tests (installed as root on Debian where missing).
tools:
	bash labctl/scripts/ensure-tools.sh

image: venv engine tools
	$(LABCTL) build

# The node image with a second torch release, for the version-mismatch scenario: built once (a few
# minutes, several GB from pip's index) and cached like any image.
image-mismatch: image
	$(LABCTL) build --mismatch-image

down: venv
	$(LABCTL) down

clean: venv
	-$(LABCTL) down --volumes
	rm -rf $(VENV) .lab
