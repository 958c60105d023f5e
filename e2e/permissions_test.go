//go:build e2e

package e2e

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestUserWithoutPoolRights: a cephx user that exists and authenticates,
// but whose OSD caps name another pool, is PERMISSION_DENIED, with a
// message that says so and no key in it.
func TestUserWithoutPoolRights(t *testing.T) {
	conn := connectAdmin(t)
	v, img := createVolume(t, conn, "", "rights", 8*mib, imageFeatures)
	fillAt(t, img, 0, 4*kib)
	snapshot(t, img, "s1")

	user := "rsm-nopool-" + csiUUID(t)[:8]
	key := cephAuth(t, "auth", "get-or-create-key", "client."+user, "mon", "profile rbd", "osd", "profile rbd pool=some-other-pool")
	t.Cleanup(func() { cephAuth(t, "auth", "del", "client."+user) })

	srv := startServer(t)
	srv.hide = append(srv.hide, key)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	secrets := map[string]string{"userID": user, "userKey": key}
	for _, r := range []metaReq{
		{target: v.id("s1"), secrets: secrets},
		{base: v.id("s1"), target: v.id("s1"), secrets: secrets},
	} {
		m := srv.call(ctx, r)
		if status.Code(m.err) != codes.PermissionDenied {
			t.Errorf("%v as a user without rights to the pool: %v, want PermissionDenied", r, m.err)
			continue
		}
		if msg := status.Convert(m.err).Message(); strings.Contains(msg, key) || !strings.Contains(msg, "caps do not cover pool") {
			t.Errorf("%v: message %q", r, msg)
		}
		t.Logf("%v: %v", r, m.err)
	}
}

// cephAuth runs the ceph CLI as admin and returns its output, trimmed.
func cephAuth(t testing.TB, args ...string) string {
	t.Helper()
	conf := clusterEnv(t, "CEPH_CONF")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, "ceph", append([]string{"--conf", conf}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("ceph %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(string(out))
}
