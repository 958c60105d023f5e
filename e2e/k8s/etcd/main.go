// etcd, built from its Go module at the version pinned in go.mod: the same
// entry point as go.etcd.io/etcd/server/v3's main.go.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
