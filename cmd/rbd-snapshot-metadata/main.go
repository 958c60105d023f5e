// Command rbd-snapshot-metadata serves the CSI SnapshotMetadata service for
// Ceph RBD volumes on a unix socket, for Kubernetes' external-snapshot-metadata
// sidecar. See the README for flags and deployment.
package main

import "os"

func main() { os.Exit(run(os.Args[1:])) }
