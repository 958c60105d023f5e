# syntax=docker/dockerfile:1
# rbd-snapshot-metadata: the CSI SnapshotMetadata server for Ceph RBD, to run
# next to Kubernetes' external-snapshot-metadata sidecar (see deploy/).
#
#   docker build --build-arg VERSION=$(git describe --tags --always) -t rbd-snapshot-metadata .
#
# The build stage compiles against Debian 13's Ceph reef headers (librbd with
# rbd_diff_iterate3), without build tags, by running build/build.sh, the same
# script that CI runs in the e2e Debian 13 rootfs (e2e/image-build-test.sh).
ARG GO_VERSION=1.26.8
ARG DEBIAN=trixie

FROM golang:${GO_VERSION}-${DEBIAN} AS build
ENV GOTOOLCHAIN=local
WORKDIR /src
# The build packages (librbd-dev, librados-dev) are listed in build/build.sh.
COPY build/ build/
RUN build/build.sh --install-deps
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
