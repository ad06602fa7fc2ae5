# The interference lab's LS and BE workloads as pods (`sloguard lab --kube`, docs/lab.md), and
# the test node's (tests/test_kube_node.py): Debian's redis-server (the LS service) and
# stress-ng (the BE antagonists). The pods never pull it (imagePullPolicy: Never): build it on
# the node, or import it into the node's runtime. From the repository root:
#
#   docker build -f deploy/lab/workload.Dockerfile -t sloguard-lab/workload:1 deploy/lab
FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends redis-server stress-ng procps \
 && rm -rf /var/lib/apt/lists/*
