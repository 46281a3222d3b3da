# gatekeeper: the per-node sidecar (`gatekeeper serve`) and the admission webhook
# (`gatekeeper webhook`) and the cluster node agent with its DRA kubelet plugin
# (`gatekeeper agent`, the `cluster` extra) in one small image that runs as a non-root user.
#
#   docker build -t gatekeeper:0.1.0 .
#   docker build -t gatekeeper:0.1.0-vllm --build-arg VLLM_VERSION=0.34.0 .
#
# Without VLLM_VERSION the image has no vLLM: the webhook, the node agent, and a sidecar
# that watches the GPUs or plans for declared nodes. Its gatekeeper environment
# (/opt/gatekeeper), installed as below (`pip install --no-cache-dir '.[cluster]'`) into a
# fresh Python 3.11 venv, measured 374 MiB by `du -sh` (361,045,416 bytes by `du -sb`;
# 345 MiB without the extra); the image adds the python:3.11-slim-bookworm base to that. The whole image's size is not stated: it was not built (no Docker daemon
# on the machine that measured this). With VLLM_VERSION, vLLM goes into its own virtual
# environment (/opt/vllm; its pins differ from the sidecar's), on the PATH, so the
# sidecar's default worker command `vllm serve` launches it. NVML and CUDA come from the
# node's driver through the NVIDIA container toolkit.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY gatekeeper ./gatekeeper
RUN python -m venv /opt/gatekeeper \
 && /opt/gatekeeper/bin/pip install --no-cache-dir '.[cluster]'
ARG VLLM_VERSION=""
RUN if [ -n "${VLLM_VERSION}" ]; then \
      python -m venv /opt/vllm \
      && /opt/vllm/bin/pip install --no-cache-dir "vllm==${VLLM_VERSION}"; \
    else \
      mkdir -p /opt/vllm/bin; \
    fi

FROM ${PYTHON_IMAGE}
ARG VLLM_VERSION=""
LABEL org.opencontainers.image.title="gatekeeper" \
      org.opencontainers.image.description="Admission control for vLLM: sidecar and Kubernetes webhook" \
      org.opencontainers.image.licenses="Apache-2.0" \
      io.gatekeeper.vllm-version="${VLLM_VERSION}"
RUN groupadd --system --gid 10001 gatekeeper \
 && useradd --system --uid 10001 --gid 10001 --home-dir /var/lib/gatekeeper --create-home \
      --shell /usr/sbin/nologin gatekeeper
COPY --from=build /opt/gatekeeper /opt/gatekeeper
COPY --from=build /opt/vllm /opt/vllm
ENV PATH=/opt/gatekeeper/bin:/opt/vllm/bin:${PATH} \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/var/lib/gatekeeper \
    GATEKEEPER_STATE_DIR=/var/lib/gatekeeper \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility
USER 10001:10001
WORKDIR /var/lib/gatekeeper
EXPOSE 8080 8443
ENTRYPOINT ["gatekeeper"]
CMD ["serve", "--host", "0.0.0.0"]
