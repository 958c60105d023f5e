package layout

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// matrixLists are the lists of e2e/matrix.txt, each one go test -run
// regex that dev.sh builds: matrix and cross for ./dev.sh matrix, soak for
// ./dev.sh soak, k8s for ./dev.sh test's e2e-reef-k8s phase.
var matrixLists = []string{"matrix", "cross", "soak", "k8s"}

// TestMatrixNames checks e2e/matrix.txt, from which dev.sh builds the
// regexes of the tests it runs by name: each name is a func TestX(t
// *testing.T) of e2e/*_test.go, listed once, in known lists only, and no
// list is empty, so that a renamed or removed test fails here instead of
// dropping silently out of the matrix (a regex matches nothing without
// error). The soak list holds a test of each file that takes
// oracle.Seeds, and only tests of such files. The e2e package builds
// only with its tag, so its files are read as text.
func TestMatrixNames(t *testing.T) {
	tests, seeded := e2eTests(t)
	lists := map[string][]string{}
	seen := map[string]bool{}
	text, err := os.ReadFile("e2e/matrix.txt")
	if err != nil {
		t.Fatal(err)
	}
	for i, line := range strings.Split(string(text), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || strings.HasPrefix(f[0], "#") {
			continue
		}
		at := fmt.Sprintf("e2e/matrix.txt:%d", i+1)
		name := f[0]
		switch {
		case seen[name]:
			t.Errorf("%s: %s is listed twice", at, name)
		case tests[name] == "":
			t.Errorf("%s: %s is not a func %s(t *testing.T) of e2e/*_test.go", at, name, name)
		case len(f) == 1:
			t.Errorf("%s: %s is in no list (want one or more of %v)", at, name, matrixLists)
		}
		seen[name] = true
		for j, l := range f[1:] {
			switch {
			case !slices.Contains(matrixLists, l):
				t.Errorf("%s: %s: unknown list %q (want %v)", at, name, l, matrixLists)
			case slices.Contains(f[1:j+1], l):
				t.Errorf("%s: %s: list %s named twice", at, name, l)
			default:
				lists[l] = append(lists[l], name)
			}
		}
	}
	for _, l := range matrixLists {
		if len(lists[l]) == 0 {
			t.Errorf("e2e/matrix.txt: the list %s is empty", l)
		}
	}

	soakFiles := map[string]bool{}
	for _, name := range lists["soak"] {
		file := tests[name]
		if file != "" && !seeded[file] {
			t.Errorf("e2e/matrix.txt: %s is in soak, but %s takes no oracle.Seeds", name, file)
		}
		soakFiles[file] = true
	}
	for file := range seeded {
		if !soakFiles[file] {
			t.Errorf("e2e/matrix.txt: %s takes oracle.Seeds, but none of its tests is in soak", file)
		}
	}
}

// e2eTests returns the Test functions of e2e/*_test.go, each with its
// file's base name, and the files that call oracle.Seeds or SeedsOr.
func e2eTests(t *testing.T) (tests map[string]string, seeded map[string]bool) {
	t.Helper()
	files, err := filepath.Glob("e2e/*_test.go")
	if err != nil || len(files) == 0 {
		t.Fatalf("no e2e test files: %v", err)
	}
	funcs := regexp.MustCompile(`(?m)^func (Test\w+)\(t \*testing\.T\) \{`)
	seeds := regexp.MustCompile(`\boracle\.Seeds(Or)?\(`)
	tests, seeded = map[string]string{}, map[string]bool{}
	for _, f := range files {
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		name := filepath.Base(f)
		for _, m := range funcs.FindAllSubmatch(src, -1) {
			tests[string(m[1])] = name
		}
		if seeds.Match(src) {
			seeded[name] = true
		}
	}
	return tests, seeded
}
