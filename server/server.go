// Package server runs the driver's gRPC services on a socket: CSI Identity,
// CSI SnapshotMetadata and the gRPC health service, behind interceptors
// that give every request a contextual logger (with its secrets stripped)
// and turn a handler's panic into INTERNAL.
//
// Streams beyond Config.MaxStreams are refused with ABORTED before any
// work; server keepalive pings close connections whose peer is gone.
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
	"google.golang.org/grpc/keepalive"
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
	// MaxStreams bounds the SnapshotMetadata streams served at once; one
	// more is refused with ABORTED. 0 is no limit.
	MaxStreams int
	// KeepaliveTime is how long a connection may be silent before the
	// server pings its peer; KeepaliveTimeout how long it then waits for
	// the answer before it closes the connection and cancels its streams.
	// Zero values select DefaultKeepaliveTime and DefaultKeepaliveTimeout.
	KeepaliveTime, KeepaliveTimeout time.Duration
}

// Keepalive defaults. A peer that vanished without closing its connection
// (a half-open TCP connection: a node lost, a network cut) holds its
// streams, their images and threads until TCP gives up, which takes
// hours; the server's pings find it within a minute and a half.
const (
	DefaultKeepaliveTime    = time.Minute
	DefaultKeepaliveTimeout = 20 * time.Second
	// keepaliveMinTime is the shortest ping interval a client may use;
	// one that pings more often is sent GOAWAY. It is lenient, so that
	// clients with keepalive settings of their own (gRPC's floor is 10 s)
	// are not cut off, while a ping flood is.
	keepaliveMinTime = 10 * time.Second
)

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

	kaTime, kaTimeout := cfg.KeepaliveTime, cfg.KeepaliveTimeout
	if kaTime <= 0 {
		kaTime = DefaultKeepaliveTime
	}
	if kaTimeout <= 0 {
		kaTimeout = DefaultKeepaliveTimeout
	}
	srv := grpc.NewServer(
		grpc.ChainUnaryInterceptor(unaryInterceptor(logger, cfg.Metrics)),
		grpc.ChainStreamInterceptor(streamInterceptor(logger, cfg.Metrics, newStreamLimit(cfg.MaxStreams))),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: kaTime, Timeout: kaTimeout}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: min(keepaliveMinTime, kaTime), PermitWithoutStream: true}),
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
