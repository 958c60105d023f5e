module github.com/rbd-snapshot-metadata/rbd-snapshot-metadata

go 1.26.8

require (
	github.com/cenkalti/backoff/v5 v5.0.3
	github.com/ceph/go-ceph v0.37.0
	github.com/cespare/xxhash/v2 v2.3.0
	github.com/container-storage-interface/spec v1.12.0
	github.com/google/go-cmp v0.7.0
	github.com/kubernetes-csi/csi-lib-utils v0.23.0
	github.com/prometheus/client_golang v1.25.0
	go.uber.org/goleak v1.3.0
	google.golang.org/grpc v1.85.0
	google.golang.org/protobuf v1.36.12
	k8s.io/klog/v2 v2.130.1
)

require (
	github.com/beorn7/perks v1.0.1 // indirect
	github.com/go-logr/logr v1.4.4 // indirect
	github.com/munnerz/goautoneg v0.0.0-20191010083416-a7dc8b61c822 // indirect
	github.com/prometheus/client_model v0.6.3 // indirect
	github.com/prometheus/common v0.72.0 // indirect
	github.com/prometheus/procfs v0.22.0 // indirect
	golang.org/x/net v0.60.0 // indirect
	golang.org/x/sys v0.48.0 // indirect
	golang.org/x/text v0.42.0 // indirect
	google.golang.org/genproto/googleapis/rpc v0.0.0-20260817212433-ac3dfec99bb1 // indirect
)
