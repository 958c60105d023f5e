# syntax=docker/dockerfile:1
# rbd-snapshot-metadata: the CSI SnapshotMetadata server for Ceph RBD, to run
# next to Kubernetes' external-snapshot-metadata sidecar (see deploy/).
#
#   docker build --build-arg VERSION=$(git describe --tags --always) -t rbd-snapshot-metadata .
#
# Built on Debian forky (testing), whose Ceph is tentacle 20.2.4: its
# librados reads both cephx key types that clusters hand out, aes256k (the
# default of new squid 19.2.6+ / tentacle 20.2.4+ clusters, and of Rook
# v1.20.5+) and aes (reef's, and every cluster made before). Debian 13's
# reef 18.2.7 reads only aes. build/build.sh refuses a librados that cannot
# read aes256k keys, so DEBIAN may name another suite with a new enough Ceph
# (sid, should forky lose Ceph) but not trixie.
#
# The build stage compiles against that suite's librbd headers (with
# rbd_diff_iterate3), without build tags, by running build/build.sh.
ARG GO_VERSION=1.26.8
ARG DEBIAN=forky

# Only Go's toolchain (/usr/local/go, statically linked) comes from the
# official golang image: it has no forky variant, and its trixie variant
# cannot install forky's librbd-dev.
FROM golang:${GO_VERSION}-trixie AS go

FROM debian:${DEBIAN}-slim AS build
# The build packages (Ceph's -dev packages, gcc, g++, ca-certificates) are
# listed in build/build.sh.
COPY build/ /src/build/
RUN /src/build/build.sh --install-deps
COPY --from=go /usr/local/go /usr/local/go
ENV PATH=/go/bin:/usr/local/go/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    GOPATH=/go GOTOOLCHAIN=local
WORKDIR /src
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
ARG VERSION=dev
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    VERSION=${VERSION} build/build.sh /out

FROM debian:${DEBIAN}-slim
# What build/build.sh checked the binary needs: librbd1, librados2 (and libc6).
RUN apt-get update && \
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends librbd1 librados2 && \
    rm -rf /var/lib/apt/lists/*
COPY --from=build /out/rbd-snapshot-metadata /out/snapmeta /usr/local/bin/
# Fails the build if a shared library is missing.
RUN ["/usr/local/bin/rbd-snapshot-metadata", "--version"]
# Non-root. The server needs no privilege: it reads the cluster config, talks
# to Ceph over the network and makes its socket (0660) in an emptyDir. The
# sidecar must run with the same group (deploy/ sets runAsGroup 65532 on both).
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/rbd-snapshot-metadata"]
