// CoreDNS, built from github.com/coredns/coredns at the version pinned in
// go.mod (the one kubeadm 1.34 deploys), with only the plugins of the
// cluster add-on's Corefile (errors, health, ready, kubernetes, prometheus,
// forward, cache, loop, reload, loadbalance, log). Upstream's coredns.go is
// the same main with _ "github.com/coredns/coredns/core/plugin", which
// imports every plugin; each plugin package registers its directive in its
// init, and core/dnsserver's Directives (zdirectives.go, always linked)
// orders them, so a directive listed there but not imported here is only
// unknown to a Corefile that uses it (as is whoami, of CoreDNS's default
// Corefile: run it with -conf).
package main

import (
	"github.com/coredns/coredns/coremain"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/forward"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/loop"
	_ "github.com/coredns/coredns/plugin/metrics" // the prometheus directive
	_ "github.com/coredns/coredns/plugin/ready"
	_ "github.com/coredns/coredns/plugin/reload"
)

func main() { coremain.Run() }
