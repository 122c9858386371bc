# The node image: every simulated node runs this, so every node has the identical torch.
#
# labctl build passes BASE_IMAGE: the official Python image where a registry answers, otherwise
# a local Debian base built with debootstrap (see labctl/image.py). Python packages come from a
# wheelhouse that the host fills with pip (.lab/wheelhouse), because pip inside a container may
# not reach PyPI (no network, or a proxy whose CA the container does not trust).
ARG BASE_IMAGE=python:3.11-slim-bookworm

FROM ${BASE_IMAGE} AS base
# iproute2 (tc, ss) shapes and inspects links, iperf3 measures the raw wire, procps and
# util-linux (pkill, setsid) let labctl stop a run; openssh-server, rsync and libnss-wrapper make
# a node an SSH host for `labctl up --ssh` (nss_wrapper gives sshd a user entry for whatever uid
# the node runs as); slurmd, slurmctld, slurm-client and munge make the nodes a Slurm cluster for
# `labctl up --scheduler slurm` (idle otherwise: nothing starts them); g++ and the headers of the
# Python the venv is made from let torch.compile's CPU backend (inductor) build its C++ kernels,
# as on any machine that develops with torch (python3-dev only where they are missing: the
# official Python image has its own). The debootstrapped base already has them all.
# No host key stays in the image: each node makes its own when it starts, as a machine does.
RUN set -eu; missing=""; \
    for package in iproute2 iperf3 procps util-linux openssh-server rsync libnss-wrapper slurmd slurmctld slurm-client munge g++; do \
      dpkg -s "$package" >/dev/null 2>&1 || missing="$missing $package"; \
    done; \
    python3 -c 'import os, sys, sysconfig; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))' \
      || missing="$missing python3-dev"; \
    if [ -n "$missing" ]; then \
      apt-get update && apt-get install -y --no-install-recommends $missing && rm -rf /var/lib/apt/lists/*; \
    fi; \
    rm -f /etc/ssh/ssh_host_*; \
    mkdir -p /run/sshd && chmod 0755 /run/sshd

# Install into a virtual environment in a throwaway stage, so the final image carries the
# installed packages but not the wheel files.
FROM base AS packages
ARG TORCH_VERSION=2.13.0
COPY .lab/wheelhouse /wheelhouse
RUN python3 -m venv /opt/venv \
 && /opt/venv/bin/pip install --no-cache-dir --no-index --find-links /wheelhouse \
      "torch==${TORCH_VERSION}" numpy

FROM base AS runtime
ARG TORCH_VERSION=2.13.0
COPY --from=packages /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONPATH=/opt/ddplab \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    LANG=C.UTF-8
# The shared volume's mount point: world-writable and sticky, so nodes running as the invoking
# user can write to it (Docker copies this mode into a fresh named volume).
RUN mkdir -p /shared && chmod 1777 /shared
# The one full `import torch` (about 2 CPU-seconds) happens here, once per image, with a check that
# gloo is built in: every node runs this same image, so each node only checks that it finds torch.
RUN python -c "import torch, torch.distributed as dist; \
assert torch.__version__.split('+')[0] == '${TORCH_VERSION}', torch.__version__; \
assert dist.is_available() and dist.is_gloo_available(), 'torch without gloo'; \
print('torch', torch.__version__, 'gloo ok')"
# torch.compile's precompiled C++ header, made here once per image: inductor's CPU backend
# precompiles ATen's vectorised kernel header (about 150 MB) before its first kernel, which was about
# half of a fresh node's first compile. Every node finds this one (node-entrypoint.sh links it where
# inductor looks, /tmp/torchinductor_<user>/precompiled_headers); its name is a hash of the compiler,
# its flags (the CPU's vector instructions among them) and the preprocessed header. Two are made:
# one for AVX2 (ATEN_CPU_CAPABILITY=avx2, the lab's default DDPLAB_CPU_KERNELS, which inductor
# follows: the same on every x86-64 CPU) and one for the build machine's own best (`native`); a node
# on another CPU with `native` misses it and makes its own, as before. The folder stays writable for that.
RUN cd /tmp && for isa in avx2 native; do \
      env $([ "$isa" = native ] || echo ATEN_CPU_CAPABILITY=$isa) TORCHINDUCTOR_CACHE_DIR=/tmp/inductor-$isa \
        python -c "import torch; torch.compile(lambda x: x.sin() + 1)(torch.ones(64))" || exit 1; \
    done \
 && mv /tmp/torchinductor_*/precompiled_headers /opt/inductor-headers \
 && ls /opt/inductor-headers/*.gch >/dev/null \
 && chmod -R a+rX /opt/inductor-headers && chmod 1777 /opt/inductor-headers /opt/inductor-headers/locks \
 && rm -rf /tmp/inductor-avx2 /tmp/inductor-native /tmp/torchinductor_*
# The node's own files, which change more often than torch: a stage of their own. `labctl build`
# builds the stages above once (tagged ddplab-runtime:HASH) and puts a change to what follows on
# that image in seconds, without the wheels, even after `build --lean` removed the packages stage.
FROM runtime
ARG TORCH_VERSION=2.13.0
COPY compose/node-entrypoint.sh compose/slurm-node.sh /opt/ddplab/
# The trainer, for `python -m trainer` from any workspace. Run from a checkout of this repository,
# the workspace's trainer/ comes first on sys.path, so edits there need no rebuild.
COPY trainer /opt/ddplab/trainer
LABEL io.ddplab.torch-version="${TORCH_VERSION}"
CMD ["sleep", "infinity"]
