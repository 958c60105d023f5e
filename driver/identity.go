package driver

import (
	"context"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/protobuf/types/known/wrapperspb"
	"k8s.io/klog/v2"
)

// GetPluginInfo reports the driver's name and version.
func (d *Driver) GetPluginInfo(context.Context, *csi.GetPluginInfoRequest) (*csi.GetPluginInfoResponse, error) {
	return &csi.GetPluginInfoResponse{Name: d.opts.Name, VendorVersion: d.opts.Version}, nil
}

// GetPluginCapabilities advertises the SnapshotMetadata service, and only it.
func (d *Driver) GetPluginCapabilities(context.Context, *csi.GetPluginCapabilitiesRequest) (*csi.GetPluginCapabilitiesResponse, error) {
	return &csi.GetPluginCapabilitiesResponse{Capabilities: []*csi.PluginCapability{{
		Type: &csi.PluginCapability_Service_{Service: &csi.PluginCapability_Service{
			Type: csi.PluginCapability_Service_SNAPSHOT_METADATA_SERVICE,
		}},
	}}}, nil
}

// Probe reports whether the driver can serve. When it cannot, it answers
// ready=false and logs why, rather than an error: the spec allows both, but
// the sidecar (csi-lib-utils' ProbeForever) waits only on ready=false and
// exits on an error, which would restart the pod instead of waiting.
func (d *Driver) Probe(ctx context.Context, _ *csi.ProbeRequest) (*csi.ProbeResponse, error) {
	if d.opts.Ready != nil {
		if err := d.opts.Ready(); err != nil {
			klog.FromContext(ctx).Info("Not ready", "reason", err)
			return &csi.ProbeResponse{Ready: wrapperspb.Bool(false)}, nil
		}
	}
	return &csi.ProbeResponse{Ready: wrapperspb.Bool(true)}, nil
}
