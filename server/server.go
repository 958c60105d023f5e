// Package server runs the driver's gRPC services on a socket: CSI Identity,
// CSI SnapshotMetadata and the gRPC health service, behind interceptors
// that give every request a contextual logger (with its secrets stripped)
// and turn a handler's panic into INTERNAL.
//
// Run serves until its context ends, then stops gracefully: it reports
// NOT_SERVING, lets running streams finish for a grace period, cancels
// the rest, and removes the socket.
package server

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"k8s.io/klog/v2"

	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/metrics"
)

// Services is what the server serves; driver.Driver is one.
type Services interface {
	csi.IdentityServer
	csi.SnapshotMetadataServer
}

// Config configures Run.
type Config struct {
	// Endpoint is unix:///path/to.sock or tcp://host:port.
	Endpoint string
	// Services answer the RPCs.
	Services Services
	// GracePeriod is how long running streams may go on after the stop
	// begins, before they are cancelled.
	GracePeriod time.Duration
	// Ready is called once the socket listens.
	Ready func()
	// Metrics, when set, records the RPCs.
	Metrics *metrics.Metrics
	// MetricsAddress, when set, is the host:port where /metrics is served
	// over HTTP.
	MetricsAddress string
}

// Run serves cfg.Services on cfg.Endpoint until ctx ends.
func Run(ctx context.Context, cfg Config) error {
	logger := klog.FromContext(ctx)
	lis, cleanup, err := listen(cfg.Endpoint)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	defer cleanup()

	if cfg.MetricsAddress != "" {
		stop, err := serveMetrics(logger, cfg.MetricsAddress, cfg.Metrics)
		if err != nil {
			return err
		}
		defer stop()
	}

	srv := grpc.NewServer(
		grpc.ChainUnaryInterceptor(unaryInterceptor(logger, cfg.Metrics)),
		grpc.ChainStreamInterceptor(streamInterceptor(logger, cfg.Metrics)),
	)
	csi.RegisterIdentityServer(srv, cfg.Services)
	csi.RegisterSnapshotMetadataServer(srv, cfg.Services)
	hs := health.NewServer()
	healthpb.RegisterHealthServer(srv, hs)

	served := make(chan error, 1)
	go func() { served <- srv.Serve(lis) }()
	logger.Info("Serving", "endpoint", cfg.Endpoint)
	if cfg.Ready != nil {
		cfg.Ready()
	}

	select {
	case err := <-served:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	logger.Info("Stopping", "gracePeriod", cfg.GracePeriod)
	hs.Shutdown()
	stopped := make(chan struct{})
	go func() { srv.GracefulStop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(cfg.GracePeriod):
		logger.Info("Grace period over, cancelling the streams left")
		srv.Stop()
		<-stopped
	}
	if err := <-served; err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return fmt.Errorf("serve: %w", err)
	}
	logger.Info("Stopped")
	return nil
}
