//go:build e2e

package e2e

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/e2e/harness"
)

// TestRevokedKey: a cephx user removed with `ceph auth rm` while the server
// holds a cached connection for it. Ceph does not end the sessions that the
// user already has, so the cached connection would go on serving requests
// that carry the removed key; --ceph-conn-max-age bounds that. The test
// measures how long the old key keeps working and fails unless requests
// carrying it are UNAUTHENTICATED within the maximum age (plus a connect).
func TestRevokedKey(t *testing.T) {
	conn := harness.ConnectAdmin(t)
	v, img := harness.CreateVolume(t, conn, "", "revoke", 8*harness.MiB, harness.ImageFeatures)
	harness.FillAt(t, img, 0, 4*harness.KiB)
	harness.Snapshot(t, img, "s1")

	user := "rsm-revoke-" + harness.CSIUUID(t)[:8]
	key := harness.CephAuth(t, "auth", "get-or-create-key", "client."+user, "mon", "profile rbd", "osd", "profile rbd")
	removed := false
	t.Cleanup(func() {
		if !removed {
			harness.CephAuth(t, "auth", "rm", "client."+user)
		}
	})

	const maxAge = 8 * time.Second
	const connectTimeout = 5 * time.Second
	srv := harness.StartServer(t, "--ceph-conn-max-age="+maxAge.String(), "--ceph-conn-idle=1h",
		"--ceph-connect-timeout="+connectTimeout.String())
	srv.Hide = append(srv.Hide, key)
	r := harness.MetaReq{Target: v.ID("s1"), Secrets: map[string]string{"userID": user, "userKey": key}}
	call := func() harness.MetaStream {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		return srv.Call(ctx, r)
	}
	if m := call(); m.Err != nil || len(m.Tuples()) == 0 {
		t.Fatalf("before the revocation: %d tuples, %v", len(m.Tuples()), m.Err)
	}
	born := time.Now() // the cached connection is at most this old

	harness.CephAuth(t, "auth", "rm", "client."+user)
	removed = true
	revoked := time.Now()

	var lastOK time.Duration = -1
	for {
		m := call()
		since := time.Since(revoked)
		if m.Err == nil {
			lastOK = since
		} else {
			if got := status.Code(m.Err); got != codes.Unauthenticated {
				t.Errorf("after the revocation: %v; want Unauthenticated", m.Err)
			}
			t.Logf("the removed key worked on the cached connection for %v after `ceph auth rm` "+
				"(last OK at %v); refused %v after it, %v after the connection was made (max age %v)",
				since.Round(time.Millisecond), lastOK.Round(time.Millisecond), since.Round(time.Millisecond),
				time.Since(born).Round(time.Millisecond), maxAge)
			break
		}
		if bound := maxAge + 2*connectTimeout; time.Since(born) > bound {
			t.Fatalf("the removed key still works %v after `ceph auth rm`, %v after the connection "+
				"was made: want it refused within the max age of %v (plus a connect)",
				since.Round(time.Millisecond), time.Since(born).Round(time.Millisecond), maxAge)
		}
		time.Sleep(250 * time.Millisecond)
	}
}
