// Command snapmeta lists the allocated or changed blocks of RBD snapshots
// from a CSI SnapshotMetadata server, for operators and scripts. Broken
// streams are resumed (see package client).
//
//	snapmeta [flags] allocated SNAPSHOT_ID
//	snapmeta [flags] delta BASE_SNAPSHOT_ID TARGET_SNAPSHOT_ID
//	snapmeta [flags] check [BASE_SNAPSHOT_ID] SNAPSHOT_ID
//
// check points the conformance checker (package client/conformance) at any
// SnapshotMetadata server and reports every violation of the spec's rules.
//
// The Ceph credentials come from --user and --keyfile, or from the
// environment: SNAPMETA_USER and SNAPMETA_KEY.
package main

import "os"

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }
