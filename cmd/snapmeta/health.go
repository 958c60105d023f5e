package main

import (
	"context"
	"fmt"
	"io"

	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// health asks the server's gRPC health service (grpc.health.v1) whether it
// serves, for the pod's exec liveness probe: the kubelet's own gRPC probe
// dials TCP, and the server listens on a unix socket. It says nothing of
// Ceph: a cluster outage must not restart the server.
func health(ctx context.Context, conn grpc.ClientConnInterface, stdout, stderr io.Writer) int {
	r, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		fmt.Fprintf(stderr, "snapmeta: health: %v\n", err)
		return 1
	}
	fmt.Fprintln(stdout, r.GetStatus())
	if r.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		return 1
	}
	return 0
}
