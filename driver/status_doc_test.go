package driver_test

import (
	"encoding/json"
	"go/ast"
	"go/parser"
	"go/token"
	"go/types"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
)

// TestErrorTable keeps docs/errors.md's table of gRPC codes true to the
// code. It reads, as source:
//
//   - toStatus in status.go: each case of its switch maps classes (a
//     sentinel tested with errors.Is, a type with errors.As, a helper such
//     as aborted(err), named by its method "Aborted()", or "default") to
//     a code;
//   - every status.Error and status.Errorf of the driver's other
//     functions: a code and a message constant of status.go;
//   - the codes the server package uses (the stream limit, panics).
//
// Every class and message constant must appear in the row of its code,
// every code the driver or the server returns must have a row, and every
// row and name in the table must be one the code has.
func TestErrorTable(t *testing.T) {
	table := readErrorTable(t, "../docs/errors.md")
	classes := statusClasses(t, "status.go")
	direct := directStatuses(t, ".")
	if len(classes) == 0 || len(direct) == 0 {
		t.Fatalf("found %d classes in toStatus and %d statuses built elsewhere: the parse is broken", len(classes), len(direct))
	}

	returned := map[codes.Code]bool{}
	for name, c := range classes {
		returned[c] = true
		if !slices.Contains(table[c], name) {
			t.Errorf("toStatus maps %s to %s, but docs/errors.md's row for %s does not name it", name, docCode(c), docCode(c))
		}
	}
	for name, c := range direct {
		returned[c] = true
		if !slices.Contains(table[c], name) {
			t.Errorf("the driver returns %s with %s, but docs/errors.md's row for %s does not name it", docCode(c), name, docCode(c))
		}
	}
	for c, names := range table {
		if !returned[c] {
			t.Errorf("docs/errors.md has a row for %s, which the driver never returns", docCode(c))
		}
		for _, name := range names {
			got, isClass := classes[name]
			if !isClass {
				var ok bool
				if got, ok = direct[name]; !ok {
					t.Errorf("docs/errors.md names %s under %s: neither a class of toStatus nor a message of a status the driver builds", name, docCode(c))
					continue
				}
			}
			if got != c {
				t.Errorf("docs/errors.md names %s under %s, but the driver returns %s for it", name, docCode(c), docCode(got))
			}
		}
	}
	for c, where := range serverCodes(t, "../server") {
		if _, ok := table[c]; !ok {
			t.Errorf("the server returns %s (%s), which docs/errors.md's table lacks", docCode(c), where)
		}
	}
}

// codeNames maps the Go names of the codes (codes.NotFound) to them.
var codeNames = func() map[string]codes.Code {
	m := map[string]codes.Code{}
	for c := codes.OK; c <= codes.Unauthenticated; c++ {
		m[c.String()] = c
	}
	return m
}()

// docCode names a code as the table and the gRPC spec do: NotFound is
// NOT_FOUND, Canceled CANCELLED.
func docCode(c codes.Code) string {
	if c == codes.Canceled {
		return "CANCELLED"
	}
	var b strings.Builder
	name := c.String()
	for i, r := range name {
		if i > 0 && r >= 'A' && r <= 'Z' && name[i-1] >= 'a' && name[i-1] <= 'z' {
			b.WriteByte('_')
		}
		b.WriteRune(r)
	}
	return strings.ToUpper(b.String())
}

// readErrorTable returns the classes and message names of each row of the
// first Markdown table in path whose header starts with "code | class".
func readErrorTable(t *testing.T, path string) map[codes.Code][]string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	cells := func(line string) []string {
		parts := strings.Split(strings.Trim(strings.TrimSpace(line), "|"), "|")
		for i, p := range parts {
			parts[i] = strings.TrimSpace(p)
		}
		return parts
	}
	ticked := regexp.MustCompile("`([^`]+)`")
	table := map[codes.Code][]string{}
	in := false
	for _, line := range strings.Split(string(b), "\n") {
		if !strings.HasPrefix(strings.TrimSpace(line), "|") {
			if in {
				break
			}
			continue
		}
		row := cells(line)
		if !in {
			if len(row) >= 2 && row[0] == "code" && row[1] == "class" {
				in = true
			}
			continue
		}
		if strings.Trim(row[0], "-: ") == "" {
			continue // the separator
		}
		if len(row) < 2 {
			t.Fatalf("%s: a row without a class: %s", path, line)
		}
		var c codes.Code
		if err := json.Unmarshal([]byte(`"`+strings.Trim(row[0], "`")+`"`), &c); err != nil {
			t.Fatalf("%s: %q is not a gRPC code: %v", path, row[0], err)
		}
		if _, dup := table[c]; dup {
			t.Errorf("%s: two rows for %s", path, row[0])
		}
		names := []string{}
		for _, m := range ticked.FindAllStringSubmatch(row[1], -1) {
			names = append(names, m[1])
		}
		if len(names) == 0 {
			t.Errorf("%s: the row for %s names no class", path, row[0])
		}
		table[c] = names
	}
	if len(table) == 0 {
		t.Fatalf("%s has no table whose header starts with | code | class |", path)
	}
	return table
}

// statusClasses reads the switch of toStatus in file and returns the code
// of each class it tests.
func statusClasses(t *testing.T, file string) map[string]codes.Code {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), file, nil, parser.SkipObjectResolution)
	if err != nil {
		t.Fatal(err)
	}
	var fn *ast.FuncDecl
	for _, d := range f.Decls {
		if d, ok := d.(*ast.FuncDecl); ok && d.Name.Name == "toStatus" {
			fn = d
		}
	}
	if fn == nil {
		t.Fatalf("%s has no toStatus", file)
	}
	varTypes := map[string]string{} // the variables errors.As fills
	var sw *ast.SwitchStmt
	ast.Inspect(fn.Body, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.ValueSpec:
			for _, name := range n.Names {
				if n.Type != nil {
					varTypes[name.Name] = types.ExprString(n.Type)
				}
			}
		case *ast.SwitchStmt:
			if sw == nil && n.Tag == nil {
				sw = n
			}
		}
		return true
	})
	if sw == nil {
		t.Fatalf("toStatus in %s has no switch", file)
	}

	out := map[string]codes.Code{}
	for _, s := range sw.Body.List {
		cc := s.(*ast.CaseClause)
		names := []string{"default"}
		if cc.List != nil {
			names = nil
			for _, e := range cc.List {
				names = append(names, className(t, e, varTypes))
			}
		}
		var found []codes.Code
		fromContext := false
		for _, st := range cc.Body {
			ast.Inspect(st, func(n ast.Node) bool {
				if sel, ok := n.(*ast.SelectorExpr); ok {
					if x, ok := sel.X.(*ast.Ident); ok {
						if c, ok := codeNames[sel.Sel.Name]; ok && x.Name == "codes" {
							found = append(found, c)
						}
						if x.Name == "status" && sel.Sel.Name == "FromContextError" {
							fromContext = true
						}
					}
				}
				return true
			})
		}
		for _, name := range names {
			switch {
			case len(found) == 1:
				out[name] = found[0]
			case len(found) == 0 && fromContext && name == "context.Canceled":
				out[name] = codes.Canceled
			case len(found) == 0 && fromContext && name == "context.DeadlineExceeded":
				out[name] = codes.DeadlineExceeded
			default:
				t.Errorf("toStatus: cannot tell the code of %s (codes in its case: %v)", name, found)
			}
		}
	}
	return out
}

// className names one case expression of toStatus as the table does.
func className(t *testing.T, e ast.Expr, varTypes map[string]string) string {
	t.Helper()
	call, ok := e.(*ast.CallExpr)
	if ok {
		switch fun := types.ExprString(call.Fun); {
		case fun == "errors.Is" && len(call.Args) == 2:
			return types.ExprString(call.Args[1])
		case fun == "errors.As" && len(call.Args) == 2:
			if u, ok := call.Args[1].(*ast.UnaryExpr); ok {
				if id, ok := u.X.(*ast.Ident); ok && varTypes[id.Name] != "" {
					return varTypes[id.Name]
				}
			}
		case len(call.Args) == 1 && !strings.Contains(fun, ".") && fun != "":
			// A helper named after the method it looks for:
			// aborted(err) tests Aborted() bool.
			return strings.ToUpper(fun[:1]) + fun[1:] + "()"
		}
	}
	t.Errorf("toStatus: a case the table cannot name: %s", types.ExprString(e))
	return types.ExprString(e)
}

// directStatuses returns the message constant and code of every
// status.Error(f) that the driver's non-test files build outside
// toStatus.
func directStatuses(t *testing.T, dir string) map[string]codes.Code {
	t.Helper()
	out := map[string]codes.Code{}
	for _, file := range goFiles(t, dir) {
		f, err := parser.ParseFile(token.NewFileSet(), file, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			if fn, ok := d.(*ast.FuncDecl); ok && fn.Name.Name == "toStatus" {
				continue
			}
			ast.Inspect(d, func(n ast.Node) bool {
				call, ok := n.(*ast.CallExpr)
				if !ok {
					return true
				}
				if fun := types.ExprString(call.Fun); fun != "status.Error" && fun != "status.Errorf" || len(call.Args) < 2 {
					return true
				}
				sel, ok := call.Args[0].(*ast.SelectorExpr)
				if !ok || types.ExprString(sel.X) != "codes" {
					t.Errorf("%s: %s with a code that is not a codes constant: the table cannot check it", file, types.ExprString(call))
					return true
				}
				c, ok := codeNames[sel.Sel.Name]
				msg, isIdent := call.Args[1].(*ast.Ident)
				switch {
				case !ok:
					t.Errorf("%s: unknown code %s", file, types.ExprString(sel))
				case !isIdent:
					t.Errorf("%s: status %s with a message that is not a constant of status.go", file, docCode(c))
				case out[msg.Name] != codes.OK && out[msg.Name] != c:
					t.Errorf("%s: %s is returned as %s and as %s", file, msg.Name, docCode(out[msg.Name]), docCode(c))
				default:
					out[msg.Name] = c
				}
				return true
			})
		}
	}
	return out
}

// serverCodes returns the codes named in the non-test files of dir, with
// the file that names each.
func serverCodes(t *testing.T, dir string) map[codes.Code]string {
	t.Helper()
	out := map[codes.Code]string{}
	for _, file := range goFiles(t, dir) {
		f, err := parser.ParseFile(token.NewFileSet(), file, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			if sel, ok := n.(*ast.SelectorExpr); ok && types.ExprString(sel.X) == "codes" {
				if c, ok := codeNames[sel.Sel.Name]; ok && c != codes.OK {
					out[c] = file
				}
			}
			return true
		})
	}
	if len(out) == 0 {
		t.Fatalf("no codes found in %s: the parse is broken", dir)
	}
	return out
}

func goFiles(t *testing.T, dir string) []string {
	t.Helper()
	all, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, f := range all {
		if !strings.HasSuffix(f, "_test.go") {
			out = append(out, f)
		}
	}
	return out
}

func TestDocCode(t *testing.T) {
	for c := codes.OK; c <= codes.Unauthenticated; c++ {
		var back codes.Code
		if err := json.Unmarshal([]byte(`"`+docCode(c)+`"`), &back); err != nil || back != c {
			t.Errorf("docCode(%v) = %s, which reads back as %v (%v)", c, docCode(c), back, err)
		}
	}
}
