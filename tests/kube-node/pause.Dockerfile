# The pod sandbox image: the pause program that scripts/kube-testenv.sh compiles (static) from
# the Kubernetes source tree's build/pause/linux/pause.c, alone in the image, as upstream's is.
FROM scratch
COPY pause /pause
USER 65535:65535
ENTRYPOINT ["/pause"]
