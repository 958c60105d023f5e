//go:build e2e

package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/e2e/harness"
)

// TestUserWithoutPoolRights: a cephx user that exists and authenticates,
// but whose OSD caps name another pool, is PERMISSION_DENIED, with a
// message that says so and no key in it.
func TestUserWithoutPoolRights(t *testing.T) {
	conn := harness.ConnectAdmin(t)
	v, img := harness.CreateVolume(t, conn, "", "rights", 8*harness.MiB, harness.ImageFeatures)
	harness.FillAt(t, img, 0, 4*harness.KiB)
	harness.Snapshot(t, img, "s1")

	user := "rsm-nopool-" + harness.CSIUUID(t)[:8]
	key := harness.CephAuth(t, "auth", "get-or-create-key", "client."+user, "mon", "profile rbd", "osd", "profile rbd pool=some-other-pool")
	t.Cleanup(func() { harness.CephAuth(t, "auth", "del", "client."+user) })

	srv := harness.StartServer(t)
	srv.Hide = append(srv.Hide, key)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	secrets := map[string]string{"userID": user, "userKey": key}
	for _, r := range []harness.MetaReq{
		{Target: v.ID("s1"), Secrets: secrets},
		{Base: v.ID("s1"), Target: v.ID("s1"), Secrets: secrets},
	} {
		m := srv.Call(ctx, r)
		if status.Code(m.Err) != codes.PermissionDenied {
			t.Errorf("%v as a user without rights to the pool: %v, want PermissionDenied", r, m.Err)
			continue
		}
		if msg := status.Convert(m.Err).Message(); strings.Contains(msg, key) || !strings.Contains(msg, "caps do not cover pool") {
			t.Errorf("%v: message %q", r, msg)
		}
		t.Logf("%v: %v", r, m.Err)
	}
}
