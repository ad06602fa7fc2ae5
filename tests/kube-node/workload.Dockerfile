# The test node's LS and BE workloads, without a registry: the debootstrapped base of
# scripts/docker-testenv.sh with Debian's redis-server (the LS service) and stress-ng (the BE
# antagonists and the innocent BE job). tests/support/kubenode.py builds it and imports it into
# the node's containerd.
FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends redis-server stress-ng procps \
 && rm -rf /var/lib/apt/lists/*
