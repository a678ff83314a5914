# The agent image: the agent and the engine it supervises, with their runtime
# dependencies and nothing else (no test extras, no editable install, no Prometheus;
# the developer set-up is scripts/setup.sh, which this file does not run).
#
#   docker build --target cpu -t inferd:cpu .   # CPU build of torch (the default target)
#   docker build --target gpu -t inferd:gpu .   # CUDA build of torch, for the NVIDIA Container Toolkit
#
# Build arguments:
#   BASE_IMAGE     any Debian-based image with python3 (3.11+) and its venv module
#   TORCH_VERSION  the torch release both variants pin
#   EBPF=0         leaves out bcc (python3-bpfcc and LLVM, about 170 MB); the eBPF
#                  collector then reports inferd_collector_up 0 and everything else runs
#   WHEELS=DIR     a folder of wheels in the build context to install from instead of any
#                  index, for hosts whose builds reach none (scripts/compose_podman.sh
#                  fills .whl/ on the host and passes WHEELS=.whl)
ARG BASE_IMAGE=python:3.11-slim

# ---- what runs: the OS packages and the environment both variants share -----------------
FROM ${BASE_IMAGE} AS runtime
ARG EBPF=1
# numactl: the supervisor binds the engine to its GPU's NUMA node with it.
# python3-bpfcc: the eBPF probes; bcc compiles them against the host's kernel headers,
# which compose.yaml mounts (/lib/modules, /usr/src).
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends numactl \
    $([ "$EBPF" = 1 ] && echo python3-bpfcc) \
 && apt-get clean && rm -rf /var/lib/apt/lists/*
ENV PATH=/opt/inferd/bin:$PATH \
    PYTHONUNBUFFERED=1
EXPOSE 8000 10400
CMD ["inferd", "agent"]

# ---- the virtual environment with the dependencies, built here and copied whole into the
# final stage; the project's own wheel goes in last, so a change to the code leaves the
# large layer (torch and the rest) as it was --------------------------------------------
FROM runtime AS build
ARG WHEELS=
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
# With WHEELS the build uses those wheels and no index (this pip.conf stays in this stage).
# scripts/install_deps.py installs pyproject.toml's dependencies as `make run` gets them
# (xgrammar without triton: [tool.inferd.install.without]).
COPY pyproject.toml scripts/install_deps.py ${WHEELS} /wheels/
RUN if ls /wheels/*.whl >/dev/null 2>&1; then \
        printf '[global]\nno-index = true\nfind-links = /wheels\n' > /etc/pip.conf; fi \
 && python3 -m venv /opt/inferd \
 && if [ -d /usr/lib/python3/dist-packages/bcc ]; then \
        mkdir -p /opt/inferd/distbcc \
     && ln -s /usr/lib/python3/dist-packages/bcc /opt/inferd/distbcc/bcc \
     && echo /opt/inferd/distbcc > "$(/opt/inferd/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/inferd-distbcc.pth"; fi

# ---- the project as a wheel (not an editable install) ----------------------------------
FROM build AS project
# the wheel's one namespace: inferd/ holds the design's folders (links to them in the checkout)
COPY inferd/*.py /src/inferd/
COPY agent /src/inferd/agent
COPY engine /src/inferd/engine
COPY exporters /src/inferd/exporters
COPY ebpf /src/inferd/ebpf
COPY dashboards /src/inferd/dashboards
RUN cp /wheels/pyproject.toml /src/ && pip wheel --no-deps --wheel-dir /dist /src

# ---- the GPU variant ---------------------------------------------------------------------
FROM build AS build-gpu
ARG TORCH_VERSION=2.13.0
# PyPI's torch for Linux x86_64 is the CUDA build (with its nvidia-* wheels and Triton).
RUN pip install "torch==${TORCH_VERSION}"
RUN python /wheels/install_deps.py run --pyproject /wheels/pyproject.toml \
 && python -c 'import sys, torch; sys.exit(None if torch.version.cuda else "the gpu target needs the CUDA build of torch, got " + torch.__version__)'

FROM runtime AS gpu
# Triton compiles a small launcher with the C compiler when it first loads a kernel.
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends gcc libc6-dev \
    $(python3 -c 'import os, sysconfig; print("" if os.path.exists(sysconfig.get_paths()["include"] + "/Python.h") else "python3-dev")') \
 && apt-get clean && rm -rf /var/lib/apt/lists/*
COPY --from=build-gpu /opt/inferd /opt/inferd
COPY --from=project /dist /tmp/dist
RUN pip install --no-cache-dir --no-index --no-deps --disable-pip-version-check --root-user-action=ignore /tmp/dist/*.whl && rm -rf /tmp/dist

# ---- the CPU variant ---------------------------------------------------------------------
FROM build AS build-cpu
ARG TORCH_VERSION=2.13.0
# torch's own index serves its CPU build (2.13.0+cpu); PyPI's would be the CUDA one.
RUN pip install --index-url https://download.pytorch.org/whl/cpu "torch==${TORCH_VERSION}"
RUN python /wheels/install_deps.py run --pyproject /wheels/pyproject.toml \
 && python -c 'import sys, torch; sys.exit("the cpu target got the CUDA build of torch " + torch.__version__ if torch.version.cuda else None)'

# ---- the default target: the CPU variant -----------------------------------------------
FROM runtime AS cpu
COPY --from=build-cpu /opt/inferd /opt/inferd
COPY --from=project /dist /tmp/dist
RUN pip install --no-cache-dir --no-index --no-deps --disable-pip-version-check --root-user-action=ignore /tmp/dist/*.whl && rm -rf /tmp/dist
