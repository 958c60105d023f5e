package rbd

import (
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"sync"
	"syscall"
	"time"
)

// Cluster is one entry of Ceph-CSI's cluster configuration: the clusterID
// that snapshot IDs name, the cluster's monitors, and the RADOS namespace
// that Ceph-CSI's RBD volumes of this cluster ID live in.
type Cluster struct {
	ID             string
	Monitors       []string
	RadosNamespace string
}

// clusterEntry is the JSON shape of one entry of Ceph-CSI's config.json
// (the ceph-csi-config ConfigMap). Fields this package does not use
// (cephFS, readAffinity, ...) are ignored.
type clusterEntry struct {
	ClusterID string   `json:"clusterID"`
	Monitors  []string `json:"monitors"`
	RBD       struct {
		RadosNamespace string `json:"radosNamespace"`
	} `json:"rbd"`
}

// ParseConfig decodes Ceph-CSI's cluster configuration:
//
//	[{"clusterID": "c1", "monitors": ["10.0.0.1:6789"], "rbd": {"radosNamespace": "ns"}}]
//
// Entries without a clusterID are an error. When a cluster ID appears twice,
// the first entry wins, as in Ceph-CSI.
func ParseConfig(data []byte) (map[string]Cluster, error) {
	var entries []clusterEntry
	if err := json.Unmarshal(data, &entries); err != nil {
		return nil, fmt.Errorf("decode cluster config: %v", err)
	}
	clusters := make(map[string]Cluster, len(entries))
	for i, e := range entries {
		if e.ClusterID == "" {
			return nil, fmt.Errorf("decode cluster config: entry %d has no clusterID", i)
		}
		if _, dup := clusters[e.ClusterID]; dup {
			continue
		}
		clusters[e.ClusterID] = Cluster{
			ID:             e.ClusterID,
			Monitors:       e.Monitors,
			RadosNamespace: e.RBD.RadosNamespace,
		}
	}
	return clusters, nil
}

// config is Ceph-CSI's cluster configuration file, re-read whenever it
// changes. In Kubernetes it is a mounted ConfigMap, which the kubelet
// replaces by swapping a symlink; a stat of the path (following links) sees
// a new inode, size or modification time, and the next lookup re-reads it.
// A file that cannot be read or decoded fails the lookup, and the next
// lookup tries again. Safe for concurrent use.
type config struct {
	path string

	mu       sync.Mutex
	stamp    fileStamp // of the file that clusters was read from
	clusters map[string]Cluster
}

// fileStamp identifies one version of a file.
type fileStamp struct {
	ino     uint64
	size    int64
	modTime time.Time
}

func stampOf(fi fs.FileInfo) fileStamp {
	s := fileStamp{size: fi.Size(), modTime: fi.ModTime()}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		s.ino = st.Ino
	}
	return s
}

// lookup returns the cluster with this ID; an unknown ID is fs.ErrNotExist.
// A missing or broken configuration file is an unclassified error: it is the
// server's fault, not the caller's.
func (c *config) lookup(id string) (Cluster, error) {
	clusters, err := c.load()
	if err != nil {
		return Cluster{}, err
	}
	cl, ok := clusters[id]
	if !ok {
		return Cluster{}, fmt.Errorf("cluster %q is not in the cluster config: %w", id, fs.ErrNotExist)
	}
	return cl, nil
}

// load returns the clusters of the file's current version, reading it when
// it changed since the last load.
func (c *config) load() (map[string]Cluster, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.path == "" {
		return nil, fmt.Errorf("no cluster config file configured")
	}
	// Errors are formatted with %v: a missing config file must not read as
	// a missing snapshot (fs.ErrNotExist) to the driver.
	fi, err := os.Stat(c.path)
	if err != nil {
		return nil, fmt.Errorf("read cluster config: %v", err)
	}
	stamp := stampOf(fi)
	if c.clusters != nil && stamp == c.stamp {
		return c.clusters, nil
	}
	data, err := os.ReadFile(c.path)
	if err != nil {
		return nil, fmt.Errorf("read cluster config: %v", err)
	}
	clusters, err := ParseConfig(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %v", c.path, err)
	}
	c.stamp, c.clusters = stamp, clusters
	return clusters, nil
}
