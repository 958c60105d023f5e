package server

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"runtime/debug"
	"strings"
	"time"

	"github.com/kubernetes-csi/csi-lib-utils/protosanitizer"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"

	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/internal/clip"
	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/metrics"
)

// snapshotIDs is what the requests of both SnapshotMetadata RPCs have, so
// that every log line of a request can name its snapshots.
type snapshotIDs interface {
	GetSnapshotId() string
}

type deltaIDs interface {
	GetBaseSnapshotId() string
	GetTargetSnapshotId() string
}

// withLogger returns ctx with a logger that names the method, a fresh
// request ID and, once the request is known, its snapshots.
func withLogger(ctx context.Context, base klog.Logger, method string) (context.Context, klog.Logger) {
	var b [6]byte
	_, _ = rand.Read(b[:])
	l := klog.LoggerWithValues(base, "method", method, "requestID", hex.EncodeToString(b[:]))
	return klog.NewContext(ctx, l), l
}

func withRequest(ctx context.Context, l klog.Logger, req any) (context.Context, klog.Logger) {
	// IDs beyond the CSI spec's limit (the driver refuses them) are
	// logged clipped, never whole.
	oversized := false
	clipped := func(id string) string {
		c := clip.ID(id)
		oversized = oversized || c != id
		return c
	}
	switch r := req.(type) {
	case snapshotIDs:
		l = klog.LoggerWithValues(l, "snapshotID", clipped(r.GetSnapshotId()))
	case deltaIDs:
		l = klog.LoggerWithValues(l, "baseSnapshotID", clipped(r.GetBaseSnapshotId()), "targetSnapshotID", clipped(r.GetTargetSnapshotId()))
	}
	if oversized {
		l.V(4).Info("Request with an ID beyond the CSI limit, not logged whole")
	} else {
		// protosanitizer drops every field that CSI marks as secret.
		l.V(4).Info("Request", "request", protosanitizer.StripSecrets(req))
	}
	return klog.NewContext(ctx, l), l
}

// recovered turns a panic of a handler into INTERNAL, so that one bad
// request does not take the server and every other stream down.
func recovered(l klog.Logger, err *error) {
	if r := recover(); r != nil {
		l.Error(nil, "Handler panicked", "panic", r, "stack", string(debug.Stack()))
		*err = status.Error(codes.Internal, "internal error: the server hit a bug serving this request")
	}
}

// methodName is the last part of a full gRPC method name, as metrics
// label it: /csi.v1.SnapshotMetadata/GetMetadataDelta → GetMetadataDelta.
func methodName(full string) string {
	return full[strings.LastIndexByte(full, '/')+1:]
}

// observe records a finished RPC; deferred first, it sees the status that
// recovered set.
func observe(m *metrics.Metrics, method string, began time.Time, err *error) {
	m.RPCDone(method, status.Code(*err), time.Since(began))
}

func unaryInterceptor(base klog.Logger, m *metrics.Metrics) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (resp any, err error) {
		defer observe(m, methodName(info.FullMethod), time.Now(), &err)
		ctx, l := withLogger(ctx, base, info.FullMethod)
		ctx, l = withRequest(ctx, l, req)
		defer recovered(l, &err)
		resp, err = h(ctx, req)
		if err != nil {
			l.V(2).Info("RPC failed", "code", status.Code(err), "err", err)
		}
		return resp, err
	}
}

func streamInterceptor(base klog.Logger, m *metrics.Metrics, lim *streamLimit) grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) (err error) {
		method := methodName(info.FullMethod)
		defer observe(m, method, time.Now(), &err)
		ctx, l := withLogger(ss.Context(), base, info.FullMethod)
		if limited(info.FullMethod) {
			// Before the request is even read: a refused stream costs
			// no cluster work.
			if err = lim.acquire(); err != nil {
				l.V(2).Info("RPC refused", "code", status.Code(err), "err", err)
				return err
			}
			defer lim.release()
		}
		m.StreamStarted(method)
		defer m.StreamDone(method)
		w := &loggedStream{ServerStream: ss, ctx: ctx, l: l}
		defer recovered(l, &err)
		if err = h(srv, w); err != nil {
			// With the request's snapshot IDs: a stream refused before
			// its diff began (NOT_FOUND, PERMISSION_DENIED, ...) logs
			// nothing else.
			w.l.V(2).Info("RPC failed", "code", status.Code(err), "err", err)
		}
		return err
	}
}

// loggedStream gives the handler a context with the request's logger. The
// generated handler receives the request before it asks for the context,
// so the logger can name the request's snapshots.
type loggedStream struct {
	grpc.ServerStream
	ctx context.Context
	l   klog.Logger
}

func (s *loggedStream) Context() context.Context { return s.ctx }

func (s *loggedStream) RecvMsg(m any) error {
	if err := s.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	s.ctx, s.l = withRequest(s.ctx, s.l, m)
	return nil
}
