package layout

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// The layout's rules (README, "Layout"): rbd/ knows no gRPC, CSI or
// driver; the driver no Ceph (and so no cgo); the server no Ceph and no
// driver. Each rule is an import edge that must not come back; the test
// asks the go command, as a reader would with go list -deps.

const module = "github.com/rbd-snapshot-metadata/rbd-snapshot-metadata"

type rule struct {
	pkgs   string   // a go list pattern
	direct bool     // check the packages' own imports, not all their deps
	banned []string // import path prefixes
	why    string
}

var rules = []rule{
	{"./rbd/...", false, []string{
		module + "/driver", module + "/server", module + "/internal/rbddriver",
		"google.golang.org/grpc", "github.com/container-storage-interface/",
	}, "rbd knows no gRPC, CSI or driver (internal/rbddriver adapts it)"},
	{"./driver/...", false, []string{
		module + "/rbd", module + "/server", module + "/internal/rbddriver", "github.com/ceph/go-ceph",
	}, "the driver knows no Ceph and builds without cgo"},
	{"./server/...", false, []string{
		module + "/rbd", module + "/internal/rbddriver", "github.com/ceph/go-ceph",
	}, "the server knows no Ceph"},
	// Its own imports only: server imports metrics, whose observer
	// methods take the driver's Refinement.
	{"./server/...", true, []string{module + "/driver"},
		"the server knows no driver (internal/clip quotes IDs for both)"},
}

type listed struct {
	ImportPath string
	Imports    []string
	Deps       []string
	Error      *struct{ Err string }
}

func TestLayout(t *testing.T) {
	for _, r := range rules {
		for _, p := range list(t, r.pkgs) {
			if p.Error != nil {
				t.Fatalf("go list %s: %s: %s", r.pkgs, p.ImportPath, p.Error.Err)
			}
			edges := p.Deps
			if r.direct {
				edges = p.Imports
			}
			for _, b := range r.banned {
				b = strings.TrimSuffix(b, "/")
				for _, dep := range edges {
					if dep == b || strings.HasPrefix(dep, b+"/") {
						t.Errorf("%s depends on %s: %s", p.ImportPath, dep, r.why)
						break // one edge per rule is enough to say
					}
				}
			}
		}
	}
}

// list runs go list -json on pattern, with cgo on so that rbd's cgo
// files (and their imports) are seen as a build of the server sees them.
func list(t *testing.T, pattern string) []listed {
	t.Helper()
	cmd := exec.Command("go", "list", "-e", "-json", "-tags", "pacific", pattern)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=1")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list %s: %v: %s", pattern, err, stderr.String())
	}
	var pkgs []listed
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p listed
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("go list %s: %v", pattern, err)
		}
		pkgs = append(pkgs, p)
	}
	if len(pkgs) == 0 {
		t.Fatalf("go list %s: no packages", pattern)
	}
	return pkgs
}
