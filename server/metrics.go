package server

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"k8s.io/klog/v2"

	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/metrics"
)

// serveMetrics serves m's registry at /metrics on addr until stop.
func serveMetrics(logger klog.Logger, addr string, m *metrics.Metrics) (stop func(), err error) {
	if m == nil {
		return nil, fmt.Errorf("a metrics address without metrics")
	}
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(m.Registry, promhttp.HandlerOpts{}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(lis); !errors.Is(err, http.ErrServerClosed) {
			logger.Error(err, "Metrics server failed")
		}
	}()
	logger.Info("Serving metrics", "address", lis.Addr().String())
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		<-done
	}, nil
}
