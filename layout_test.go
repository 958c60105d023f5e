package layout

import (
	"bytes"
	"encoding/json"
	"errors"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// The layout's rules (docs/design.md, "Layout"): rbd/ knows no gRPC, CSI or
// driver; the driver no Ceph (and so no cgo); the server no Ceph and no
// driver, nor does metrics, which the server imports; internal/ holds
// leaves, which import nothing of the project. rbddriver, which adapts rbd
// to the driver, stands above both, and none of them imports it. Each rule
// is an import edge that must not come back; the test asks the go command,
// as a reader would with go list -deps.

const module = "github.com/rbd-snapshot-metadata/rbd-snapshot-metadata"

type rule struct {
	pkgs   string   // a go list pattern
	banned []string // import path prefixes, banned from all its deps ("p$": p only)
	why    string
	tags   string // build tags beyond pacific (e2e for the e2e packages)
}

var rules = []rule{
	{"./rbd/...", []string{
		module + "/driver", module + "/server", module + "/rbddriver",
		"google.golang.org/grpc", "github.com/container-storage-interface/",
	}, "rbd knows no gRPC, CSI or driver (rbddriver adapts it)", ""},
	{"./rbd/internal/conn/...", []string{
		module + "/rbd$", module + "/rbd/precise", "k8s.io/klog",
	}, "conn sits below rbd: it imports neither rbd nor precise mode, and does not log", ""},
	{"./driver/...", []string{
		module + "/rbd", module + "/server", module + "/rbddriver", "github.com/ceph/go-ceph",
	}, "the driver knows no Ceph and builds without cgo", ""},
	{"./server/...", []string{
		module + "/rbd", module + "/rbddriver", "github.com/ceph/go-ceph",
		module + "/driver",
	}, "the server knows no Ceph and no driver (internal/clip quotes IDs for both)", ""},
	{"./metrics/...", []string{module + "/driver", module + "/rbd", "github.com/ceph/go-ceph"},
		"metrics, which the server imports, knows no driver (internal/report holds what it counts)", ""},
	{"./internal/...", []string{
		module + "/driver", module + "/server", module + "/rbd", module + "/rbddriver",
		module + "/metrics", module + "/client", module + "/cmd", module + "/e2e",
	}, "internal/ holds the leaves that the driver, the server, metrics and rbd share: they import nothing of the project above them", ""},
	{"./e2e/harness/...", []string{
		"k8s.io/api", "k8s.io/apimachinery", "k8s.io/client-go", "sigs.k8s.io",
	}, "the e2e harness speaks to Kubernetes over its HTTP API and with the real kubectl, helm and sidecar, which e2e/k8s/ builds in modules of their own: no Kubernetes library enters the module", "e2e"},
}

type listed struct {
	ImportPath string
	Deps       []string
	Error      *struct{ Err string }
}

func TestLayout(t *testing.T) {
	for _, r := range rules {
		for _, p := range list(t, r.pkgs, r.tags) {
			if p.Error != nil {
				t.Fatalf("go list %s: %s: %s", r.pkgs, p.ImportPath, p.Error.Err)
			}
			for _, b := range r.banned {
				b, exact := strings.CutSuffix(strings.TrimSuffix(b, "/"), "$")
				for _, dep := range p.Deps {
					if dep == b || !exact && strings.HasPrefix(dep, b+"/") {
						t.Errorf("%s depends on %s: %s", p.ImportPath, dep, r.why)
						break // one edge per rule is enough to say
					}
				}
			}
		}
	}
}

// list runs go list -json on pattern, with cgo on so that rbd's cgo
// files (and their imports) are seen as a build of the server sees them,
// and the tags pacific and, if given, tags.
func list(t *testing.T, pattern, tags string) []listed {
	t.Helper()
	if tags != "" {
		tags = "," + tags
	}
	cmd := exec.Command("go", "list", "-e", "-json", "-tags", "pacific"+tags, pattern)
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

// TestE2EIndex checks e2e/doc.go's index against the e2e files: each
// file is listed once, with its Test functions in its order ("(helpers:
// ...)" for a file without one). The e2e package builds only with its
// tag, so the index is read as text.
func TestE2EIndex(t *testing.T) {
	doc, err := os.ReadFile("e2e/doc.go")
	if err != nil {
		t.Fatal(err)
	}
	entry := regexp.MustCompile(`^//   - (\S+_test\.go): (.*)$`)
	testName := regexp.MustCompile(`\bTest\w+`)
	indexed := map[string][]string{}
	var file, text string
	flush := func() {
		if file == "" {
			return
		}
		if _, dup := indexed[file]; dup {
			t.Errorf("e2e/doc.go lists %s twice", file)
		}
		tests := []string{}
		if !strings.HasPrefix(text, "(") {
			tests = testName.FindAllString(text, -1)
		}
		indexed[file], file, text = tests, "", ""
	}
	for _, line := range strings.Split(string(doc), "\n") {
		switch m := entry.FindStringSubmatch(line); {
		case m != nil:
			flush()
			file, text = m[1], m[2]
		case file != "" && strings.HasPrefix(line, "//     "):
			text += " " + strings.TrimPrefix(line, "//     ")
		default:
			flush()
		}
	}

	files, err := filepath.Glob("e2e/*_test.go")
	if err != nil || len(files) == 0 {
		t.Fatalf("no e2e test files: %v", err)
	}
	funcs := regexp.MustCompile(`(?m)^func (Test\w+)\(`)
	for _, f := range files {
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		want := []string{}
		for _, m := range funcs.FindAllStringSubmatch(string(src), -1) {
			want = append(want, m[1])
		}
		name := filepath.Base(f)
		got, ok := indexed[name]
		delete(indexed, name)
		switch {
		case !ok:
			t.Errorf("e2e/doc.go's index does not list %s (tests: %v)", name, want)
		case !slices.Equal(got, want):
			t.Errorf("e2e/doc.go's index lists %s with %v, the file has %v", name, got, want)
		}
	}
	for name := range indexed {
		t.Errorf("e2e/doc.go's index lists %s, which does not exist", name)
	}
}

// maxFuncLines is the longest a function of the product code may be
// (issue 21): past it, a function is split into named steps. maxFileLines
// is the longest a file may be: past it, a file holds more than one room.
const (
	maxFuncLines = 80
	maxFileLines = 600
)

// TestFunctionLength checks that no function or method of the product
// code (non-test .go files outside e2e/) runs over maxFuncLines lines,
// counted from its func line to its closing brace, doc comment aside, and
// that no such file runs over maxFileLines.
func TestFunctionLength(t *testing.T) {
	fset := token.NewFileSet()
	checked := 0
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch path {
			case ".git", "e2e":
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		checked++
		if n := fset.Position(f.FileEnd).Line; n > maxFileLines {
			t.Errorf("%s is %d lines, over %d", path, n, maxFileLines)
		}
		for _, decl := range f.Decls {
			fn, ok := decl.(*ast.FuncDecl)
			if !ok {
				continue
			}
			first, last := fset.Position(fn.Pos()).Line, fset.Position(fn.End()).Line
			if n := last - first + 1; n > maxFuncLines {
				t.Errorf("%s:%d: %s is %d lines, over %d: split it into named steps", path, first, funcName(fn), n, maxFuncLines)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if checked == 0 {
		t.Fatal("no product .go files found")
	}
}

// funcName names a function as a reader would: Type.Method or func.
func funcName(fn *ast.FuncDecl) string {
	if fn.Recv == nil || len(fn.Recv.List) == 0 {
		return fn.Name.Name
	}
	typ := fn.Recv.List[0].Type
	if s, ok := typ.(*ast.StarExpr); ok {
		typ = s.X
	}
	if g, ok := typ.(*ast.IndexExpr); ok {
		typ = g.X
	}
	if g, ok := typ.(*ast.IndexListExpr); ok {
		typ = g.X
	}
	if id, ok := typ.(*ast.Ident); ok {
		return id.Name + "." + fn.Name.Name
	}
	return fn.Name.Name
}
