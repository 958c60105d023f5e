// Package metrics holds the server's Prometheus metrics. Labels are method
// names and status codes only: never a snapshot ID, a user or a secret.
package metrics

import (
	"time"

	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/internal/report"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"google.golang.org/grpc/codes"
)

const namespace = "rbd_snapshot_metadata"

// Metrics records what the server does. Its methods are safe for
// concurrent use; a nil *Metrics records nothing.
type Metrics struct {
	// Registry holds the collectors, for the /metrics handler.
	Registry *prometheus.Registry

	rpcs        *prometheus.CounterVec
	duration    *prometheus.HistogramVec
	inFlight    *prometheus.GaugeVec
	tuples      *prometheus.CounterVec
	bytes       *prometheus.CounterVec
	diff        *prometheus.HistogramVec
	refined     *prometheus.CounterVec
	checksummed *prometheus.CounterVec
	fallback    *prometheus.CounterVec
	resumes     *prometheus.CounterVec
	resuming    *prometheus.HistogramVec
	seams       *prometheus.CounterVec
}

// New makes the metrics. conns, when not nil, reports the number of cached
// cluster connections at each scrape.
func New(conns func() float64) *Metrics {
	m := &Metrics{
		Registry: prometheus.NewRegistry(),
		rpcs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "rpcs_total",
			Help: "RPCs finished, by method and gRPC status code.",
		}, []string{"method", "code"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: namespace, Name: "rpc_duration_seconds",
			Help:    "Time from the start of an RPC to its end; for the SnapshotMetadata RPCs, the whole stream.",
			Buckets: prometheus.ExponentialBuckets(0.001, 4, 10), // 1 ms .. 4.4 min
		}, []string{"method"}),
		inFlight: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: namespace, Name: "streams_in_flight",
			Help: "Streams being served now.",
		}, []string{"method"}),
		tuples: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "streamed_tuples_total",
			Help: "BlockMetadata tuples sent.",
		}, []string{"method"}),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "streamed_bytes_total",
			Help: "Bytes of volume covered by the tuples sent.",
		}, []string{"method"}),
		diff: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: namespace, Name: "diff_iterate_seconds",
			Help:    "Time of the librbd diff-iterate of a stream, sends included (they hold it back).",
			Buckets: prometheus.ExponentialBuckets(0.001, 4, 10),
		}, []string{"method"}),
		refined: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "precise_objects_total",
			Help: "Objects that precise mode refined.",
		}, []string{"method"}),
		checksummed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "precise_checksum_queries_total",
			Help: "Object queries precise mode answered from per-4 KiB checksums, which make the OSDs read the data, because the pool refused mapext (an erasure-coded data pool).",
		}, []string{"method"}),
		fallback: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "precise_fallbacks_total",
			Help: "Precise mode's fallbacks to librbd's coarser answer, by scope (image: a whole stream got the exact diff; object: one object was reported whole) and reason.",
		}, []string{"method", "scope", "reason"}),
		resumes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "stream_resumes_total",
			Help: "Streams resumed inside the server after their diff failed with an error that goes away by itself (--resume-budget), by the error's short reason (timeout, connection_reset, class_unavailable, ...).",
		}, []string{"reason"}),
		resuming: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: namespace, Name: "stream_resume_seconds",
			Help:    "Time from a diff's failure to its re-opened diff (outcome resumed), or to the end of the stream that could not resume (outcome failed: budget spent, an error that lasts, a cancel).",
			Buckets: prometheus.ExponentialBuckets(0.25, 2, 11), // 0.25 s .. 4.3 min
		}, []string{"outcome"}),
		seams: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "stream_seam_mismatches_total",
			Help: "Resumed streams ended ABORTED because the resumed diff disagreed with what they had sent before the resume point: a Source that lost extents before a failure. Should stay 0.",
		}, []string{"method"}),
	}
	m.Registry.MustRegister(m.rpcs, m.duration, m.inFlight, m.tuples, m.bytes, m.diff, m.refined, m.checksummed, m.fallback,
		m.resumes, m.resuming, m.seams,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if conns != nil {
		m.Registry.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Namespace: namespace, Name: "cached_connections",
			Help: "Cluster connections in the cache, in use or idle.",
		}, conns))
	}
	return m
}

// StreamStarted counts a stream in flight until StreamDone.
func (m *Metrics) StreamStarted(method string) {
	if m != nil {
		m.inFlight.WithLabelValues(method).Inc()
	}
}

// StreamDone ends what StreamStarted began.
func (m *Metrics) StreamDone(method string) {
	if m != nil {
		m.inFlight.WithLabelValues(method).Dec()
	}
}

// RPCDone records a finished RPC.
func (m *Metrics) RPCDone(method string, code codes.Code, d time.Duration) {
	if m != nil {
		m.rpcs.WithLabelValues(method, code.String()).Inc()
		m.duration.WithLabelValues(method).Observe(d.Seconds())
	}
}

// Streamed records what one stream sent and how long its diff ran. It
// implements driver.Observer.
func (m *Metrics) Streamed(method string, tuples int, bytes int64, diff time.Duration) {
	if m != nil {
		m.tuples.WithLabelValues(method).Add(float64(tuples))
		m.bytes.WithLabelValues(method).Add(float64(bytes))
		m.diff.WithLabelValues(method).Observe(diff.Seconds())
	}
}

// Refined records what precise mode did in one stream. It implements
// driver.RefinementObserver (driver.Refinement is report.Refinement);
// cmd/rbd-snapshot-metadata asserts it, so that metrics, and the server
// that imports it, need no driver.
func (m *Metrics) Refined(method string, r report.Refinement) {
	if m == nil {
		return
	}
	m.refined.WithLabelValues(method).Add(float64(r.Objects))
	if r.Checksummed > 0 {
		m.checksummed.WithLabelValues(method).Add(float64(r.Checksummed))
	}
	if r.ImageFallback != "" {
		m.fallback.WithLabelValues(method, "image", r.ImageFallback).Inc()
	}
	for reason, n := range r.ObjectFallbacks {
		m.fallback.WithLabelValues(method, "object", reason).Add(float64(n))
	}
}

// Resumed records one resume of a stream. It implements
// driver.ResumeObserver.
func (m *Metrics) Resumed(_, reason string, took time.Duration, ok bool) {
	if m == nil {
		return
	}
	outcome := "failed"
	if ok {
		outcome = "resumed"
		m.resumes.WithLabelValues(reason).Inc()
	}
	m.resuming.WithLabelValues(outcome).Observe(took.Seconds())
}

// SeamMismatch counts one stream ended ABORTED by its seam check. It
// implements driver.SeamObserver.
func (m *Metrics) SeamMismatch(method string) {
	if m == nil {
		return
	}
	m.seams.WithLabelValues(method).Inc()
}
