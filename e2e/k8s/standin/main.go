// Command standin stands in, on the e2e node (e2e/k8s/node.sh), for a
// container image that cannot be had here: Ceph-CSI's own
// (quay.io/cephcsi/cephcsi, whose module the Go module proxy refuses) and
// the sig-storage sidecars of Ceph-CSI's provisioner pod (csi-provisioner,
// csi-snapshotter, csi-attacher, csi-resizer). e2e/k8s/k8s.sh images builds
// one image of it under each of those names, so that Ceph-CSI's real
// csi-rbdplugin-provisioner manifest runs unchanged with its containers'
// names, arguments, sockets and mounts. It does none of their work: no
// check may pass because of it (the tests check our container and the real
// external-snapshot-metadata sidecar).
//
// What it does, read from the arguments the manifest gives:
//   - cephcsi --type=rbd: listens on --endpoint and --csi-addons-endpoint
//     (unix sockets), as the plugin serves CSI there, and closes every
//     connection it accepts;
//   - cephcsi --type=liveness, and the sidecars' --csi-address: waits for
//     that socket and dials it once, as those dial the plugin;
//   - anything else (cephcsi --type=controller): nothing;
//
// then it waits for SIGTERM or SIGINT, removes its sockets and exits 0.
// Every line it logs starts with "stand-in".
package main

import (
	"fmt"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"
)

func main() {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	name := os.Getenv("STANDIN_FOR")
	logf := func(format string, a ...any) {
		fmt.Printf("stand-in for %s (not the real image): %s\n", name, fmt.Sprintf(format, a...))
	}
	logf("args %q", os.Args[1:])
	args := flags(os.Args[1:])
	var serve, dial []string
	switch {
	case args["--type"] == "rbd":
		serve = []string{args["--endpoint"], args["--csi-addons-endpoint"]}
	case args["--type"] == "liveness":
		dial = []string{args["--endpoint"]}
	default:
		dial = []string{args["--csi-address"]}
	}
	var ls []net.Listener
	for _, a := range serve {
		if a == "" {
			continue
		}
		l, err := listen(socketPath(a))
		if err != nil {
			logf("%v", err)
			os.Exit(1)
		}
		logf("listening on %s", l.Addr())
		ls = append(ls, l)
	}
	for _, a := range dial {
		if a != "" {
			go dialOnce(socketPath(a), logf)
		}
	}
	s := <-sig
	for _, l := range ls {
		l.Close() // removes the socket
	}
	logf("%v: exiting", s)
}

// flags reads --name=value and --name value arguments; a flag without a
// value is "true".
func flags(args []string) map[string]string {
	m := map[string]string{}
	for i := 0; i < len(args); i++ {
		a := args[i]
		if !strings.HasPrefix(a, "-") {
			continue
		}
		a = "--" + strings.TrimLeft(a, "-")
		if k, v, ok := strings.Cut(a, "="); ok {
			m[k] = v
		} else if i+1 < len(args) && !strings.HasPrefix(args[i+1], "-") {
			m[a] = args[i+1]
			i++
		} else {
			m[a] = "true"
		}
	}
	return m
}

// socketPath is the path of unix:///path, unix:/path or /path.
func socketPath(a string) string {
	a = strings.TrimPrefix(a, "unix://")
	return strings.TrimPrefix(a, "unix:")
}

// listen replaces a stale socket and accepts, closing each connection.
func listen(path string) (net.Listener, error) {
	_ = os.Remove(path)
	l, err := net.Listen("unix", path)
	if err != nil {
		return nil, err
	}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	return l, nil
}

func dialOnce(path string, logf func(string, ...any)) {
	for i := 0; ; i++ {
		c, err := net.Dial("unix", path)
		if err == nil {
			c.Close()
			logf("dialled %s", path)
			return
		}
		if i%60 == 0 {
			logf("waiting for %s: %v", path, err)
		}
		time.Sleep(time.Second)
	}
}
