// Package conn makes, shares and shuts down the cluster connections of
// package rbd: one librados handle per monitor set and cephx identity,
// however many diffs use it.
//
// # What is cached, by what key
//
// A Cache holds connected librados handles (Conn), keyed by the monitors as
// the cluster config lists them (Params.MonHost, one mon_host string), the
// cephx user, and the SHA-256 of the cephx key. The key itself is never a
// map key, never in an error and never logged: the only copy a Cache keeps
// is the one inside librados. Two requests with the same monitors and user
// but different keys (a key that was just rotated) get different
// connections, and neither can ride on the other's login.
//
// Conns are reference-counted: Get takes a reference and Release drops it;
// rbd holds one per open Diff and one per Open that waits for a
// connection. Concurrent Gets of the same key share one connect attempt,
// which runs in a goroutine of its own: a Get whose context ends returns at
// once, and the attempt finishes for nobody and stays cached, idle. A
// failed attempt is not cached; the next Get tries again. At most eight
// attempts run at once (each is a librados handle with its threads for up
// to client_mount_timeout), so that a burst of requests with distinct bad
// keys cannot pile handles up; a Get waits for its turn as long as its
// context lets it.
//
// # When a connection goes
//
//   - Idle: a janitor goroutine shuts down a Conn that nobody has used for
//     the idle time (rbd's Options.IdleTimeout, 5 minutes by default).
//   - Old: no Get hands out a Conn older than maxAge (Options.MaxConnAge, 5
//     minutes), however busy it is. A live cephx session outlives the
//     revocation or replacement of its key, so this bounds how long an old
//     key keeps working. Streams that hold the old Conn keep it; it is shut
//     down at its last Release.
//   - Discarded: when an Open or an Iterate fails with a timeout or another
//     error that goes away by itself (cepherr.Temporary), rbd calls Discard
//     (rbd's discardOnTimeout): the Conn leaves the cache at once, the next
//     Get connects anew, and the old one is shut down at its last Release.
//     After an OSD or monitor outage a connection can keep timing out long
//     after a new one would work, and a resumed stream must not re-open on
//     it.
//   - Closed: Close shuts down the idle Conns at once and the others at
//     their last Release, and waits for the janitor and for connect attempts
//     in flight (at most about client_mount_timeout). Get fails after Close.
//
// # How a connection is made
//
// librados is configured without files: no ceph.conf is read, and the
// options are set one by one (rados_conf_set): mon_host, key,
// keyring=/dev/null (no keyring is searched for), client_mount_timeout
// (Timeouts.Mount: how long a connect may wait for a monitor session; rbd's
// default 10 s, librados' own 300 s), rados_mon_op_timeout and
// rados_osd_op_timeout (Timeouts.Op, 30 s), given in whole seconds, and
// log_to_stderr and err_to_stderr off. Before a connection's options apply,
// librados writes to C++'s std::cerr, and quotes there a key it cannot
// decode: the package silences std::cerr for the whole process when it
// loads (cerr.go). A handle whose connect failed is freed at once, with its
// threads (shutdownUnconnected), rather than at some later garbage
// collection.
//
// Monitors are probed before each connect (monitors.go): an address on a
// port that is neither 6789 nor 3300 is ambiguous to librados, which then
// tries the wrong messenger half of the time and reports a refused login as
// a timeout. A monitor greets every connection with its messenger's banner,
// so the probe types such an address as v1 or v2, and leaves out the
// monitors that do not greet, as long as one does.
//
// A failed connect is classified (connectError) with internal/cepherr's
// classes: a refused login (wrong key, unknown user) is cepherr.Refused; a
// key this librados cannot read is fs.ErrInvalid, with its type named (an
// aes256k key given to reef's librados); a timeout is
// os.ErrDeadlineExceeded, saying whether the monitors were unreachable or
// greeted but gave no session (no quorum, a hung monitor). Errors name the
// monitors, never the user or the key.
//
// The package imports neither rbd nor precise mode, and does not log
// (layout_test.go checks the imports).
package conn
