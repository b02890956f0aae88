package main

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"maps"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// The rules by which TestEveryReferenceInCommentsAndDocsResolves reads a
// reference (Go comments everywhere; in Markdown, inline code spans and link
// targets outside fenced blocks; testdata, hidden and _ folders are skipped):
//
//   - pkg.Name, pkg.Type.Member, pkg/sub.Name, bracketed or not: checked
//     when pkg is the last element or the module-relative path of one of
//     the module's packages, and a Go file does not import an outside
//     package by that name. Name is any top-level name (or its plural, Names),
//     Type.Member a method or field (promoted ones included). pkg.json and
//     the like are file names; one followed by a slash, or ending in .io,
//     .com, .org, .net, .dev or .ai, is a domain.
//   - a bracketed Name or Name.Member in a Go comment: a doc link into the
//     comment's own package.
//   - recv.member in a method's doc or body comments: a field or method of
//     the receiver's type.
//   - a path: with a slash, when its first element is a folder at the
//     module root (or beside the file); a bare Go file name in a Go comment,
//     in the comment's folder; a Markdown link target, beside the file. A
//     ":line" suffix, "./", a trailing "/..." and a ".Symbol" are dropped.

// modulePath is this module's import path.
const modulePath = "github.com/podres-proxy/podres-proxy"

var (
	// pkgRef: pkg.Name, pkg.Type.Member, pkg/sub.Name (group 2: the
	// package, 3: the name, 4: the member), not inside a longer path.
	pkgRef = regexp.MustCompile(`(^|[^\w./\-])((?:[a-z][a-z0-9]*/)*[a-z][a-z0-9]*)\.([A-Za-z_]\w*)(?:\.([A-Za-z_]\w*))?`)
	// docLink: a doc link to the comment's own package, Name or Name.Member in brackets.
	docLink = regexp.MustCompile(`\[([A-Z]\w*)(?:\.([A-Za-z_]\w*))?\]`)
	// pathRef: a relative path with at least one slash.
	pathRef = regexp.MustCompile(`(^|[^\w./\-~$:@])((?:\./)?[A-Za-z0-9_][\w.\-]*(?:/[\w.\-]+)+/?)`)
	// goFileRef: a bare Go file name.
	goFileRef = regexp.MustCompile(`(^|[^\w./\-])([a-z][\w\-]*\.go)\b`)
	// codeSpan and linkTarget: Markdown's inline code and link targets.
	codeSpan   = regexp.MustCompile("`([^`\n]+)`")
	linkTarget = regexp.MustCompile(`\]\(([^)\s]+)\)`)
)

// fileExt are the suffixes that make pkg.x a file or a domain name, not a symbol.
var fileExt = map[string]bool{"go": true, "md": true, "json": true, "yaml": true, "yml": true, "sh": true,
	"sock": true, "proto": true, "txt": true, "log": true, "mod": true, "sum": true, "toml": true, "test": true,
	"io": true, "com": true, "org": true, "net": true, "dev": true, "ai": true}

// pkgSyms is one package (one folder) of the module: its top-level names,
// "Type.Member" for methods and fields, and each type's embedded types.
type pkgSyms struct {
	dir    string
	syms   map[string]bool
	embeds map[string][]string
}

func (p *pkgSyms) has(name, member string) bool {
	if member == "" {
		return p.syms[name]
	}
	return p.hasMember(name, member, 0)
}

func (p *pkgSyms) hasMember(typ, member string, depth int) bool {
	if p.syms[typ+"."+member] {
		return true
	}
	for _, e := range p.embeds[typ] {
		if depth < 4 && p.hasMember(e, member, depth+1) {
			return true
		}
	}
	return false
}

// typeName returns the name of a receiver's or an embedded field's type.
func typeName(e ast.Expr) string {
	switch t := e.(type) {
	case *ast.StarExpr:
		return typeName(t.X)
	case *ast.IndexExpr:
		return typeName(t.X)
	case *ast.IndexListExpr:
		return typeName(t.X)
	case *ast.Ident:
		return t.Name
	}
	return ""
}

func (p *pkgSyms) add(f *ast.File) {
	for _, d := range f.Decls {
		switch d := d.(type) {
		case *ast.FuncDecl:
			if d.Recv == nil || len(d.Recv.List) == 0 {
				p.syms[d.Name.Name] = true
			} else {
				p.syms[typeName(d.Recv.List[0].Type)+"."+d.Name.Name] = true
			}
		case *ast.GenDecl:
			for _, s := range d.Specs {
				switch s := s.(type) {
				case *ast.ValueSpec:
					for _, n := range s.Names {
						p.syms[n.Name] = true
					}
				case *ast.TypeSpec:
					p.addType(s)
				}
			}
		}
	}
}

func (p *pkgSyms) addType(s *ast.TypeSpec) {
	name := s.Name.Name
	p.syms[name] = true
	var fields *ast.FieldList
	switch t := s.Type.(type) {
	case *ast.StructType:
		fields = t.Fields
	case *ast.InterfaceType:
		fields = t.Methods
	default:
		if e := typeName(s.Type); e != "" { // type T U: U's fields
			p.embeds[name] = append(p.embeds[name], e)
		}
		return
	}
	for _, f := range fields.List {
		for _, n := range f.Names {
			p.syms[name+"."+n.Name] = true
		}
		if len(f.Names) == 0 {
			if e := typeName(f.Type); e != "" {
				p.syms[name+"."+e] = true
				p.embeds[name] = append(p.embeds[name], e)
			} else if sel, ok := f.Type.(*ast.SelectorExpr); ok {
				p.syms[name+"."+sel.Sel.Name] = true
			} else if st, ok := f.Type.(*ast.StarExpr); ok {
				if sel, ok := st.X.(*ast.SelectorExpr); ok {
					p.syms[name+"."+sel.Sel.Name] = true
				}
			}
		}
	}
}

// repo is the module as the test reads it.
type repo struct {
	root  string
	fset  *token.FileSet
	pkgs  map[string][]*pkgSyms // by last element, package name and relative folder
	byDir map[string]*pkgSyms
	gos   map[string]*ast.File // by relative path
	mds   []string             // relative paths
	// checked counts the references checked, for the log.
	checked int
}

func readRepo(t *testing.T) *repo {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	r := &repo{root: root, fset: token.NewFileSet(), pkgs: map[string][]*pkgSyms{},
		byDir: map[string]*pkgSyms{}, gos: map[string]*ast.File{}}
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			if n := d.Name(); rel != "." && (n == "testdata" || strings.HasPrefix(n, ".") || strings.HasPrefix(n, "_")) {
				return filepath.SkipDir
			}
			return nil
		}
		switch {
		case strings.HasSuffix(rel, ".md"):
			r.mds = append(r.mds, rel)
		case strings.HasSuffix(rel, ".go"):
			f, err := parser.ParseFile(r.fset, p, nil, parser.ParseComments|parser.SkipObjectResolution)
			if err != nil {
				return err
			}
			r.gos[rel] = f
			dir := path.Dir(rel)
			ps := r.byDir[dir]
			if ps == nil {
				ps = &pkgSyms{dir: dir, syms: map[string]bool{}, embeds: map[string][]string{}}
				r.byDir[dir] = ps
				keys := map[string]bool{dir: true, path.Base(dir): true}
				for k := range keys {
					r.pkgs[k] = append(r.pkgs[k], ps)
				}
			}
			if n := strings.TrimSuffix(f.Name.Name, "_test"); n != path.Base(dir) && n != "main" && !slices.Contains(r.pkgs[n], ps) {
				r.pkgs[n] = append(r.pkgs[n], ps)
			}
			ps.add(f)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// checkText reports the references in one line of text of file (relative
// to the root) that do not resolve. outside are the package names the
// file imports from other modules.
func (r *repo) checkText(file, text string, outside map[string]bool, report func(string)) {
	for _, ix := range pkgRef.FindAllStringSubmatchIndex(text, -1) {
		pkg, name := text[ix[4]:ix[5]], text[ix[6]:ix[7]]
		member := ""
		if ix[8] >= 0 {
			member = text[ix[8]:ix[9]]
		}
		cands := r.pkgs[pkg]
		if len(cands) == 0 || outside[pkg] || fileExt[name] || fileExt[member] || strings.HasPrefix(text[ix[1]:], "/") {
			continue
		}
		r.checked++
		ok := false
		for _, p := range cands {
			// pkg.Name.x where Name is not a type (a variable, a function) is not checked further.
			if p.has(name, member) || (member != "" && p.syms[name] && !p.isType(name)) ||
				(member == "" && strings.HasSuffix(name, "s") && p.syms[strings.TrimSuffix(name, "s")]) {
				ok = true
			}
		}
		if !ok {
			report("no " + strings.TrimSuffix(pkg+"."+name+"."+member, ".") + " in the module")
		}
	}
	for _, m := range pathRef.FindAllStringSubmatch(text, -1) {
		p, ok := r.checkPath(path.Dir(file), m[2])
		if p != "" {
			r.checked++
		}
		if !ok {
			report("no file or folder " + p)
		}
	}
}

// isType reports whether name is a type of the package (it has members or
// embeds), so that Type.Member must resolve.
func (p *pkgSyms) isType(name string) bool {
	if len(p.embeds[name]) > 0 {
		return true
	}
	for k := range p.syms {
		if strings.HasPrefix(k, name+".") {
			return true
		}
	}
	return false
}

// checkPath resolves a path found in text in folder dir: relative to the
// root when its first element is a folder there, to dir when it is one
// there; anything else is not a path of this repository.
func (r *repo) checkPath(dir, p string) (string, bool) {
	p = strings.TrimPrefix(p, "./")
	p = strings.TrimSuffix(p, "/...")
	p = strings.TrimRight(p, ".")
	if i := strings.LastIndex(p, "/"); i >= 0 { // dir/pkg.Symbol: pkgRef checks the symbol
		if j := strings.Index(p[i:], "."); j > 0 && j+1 < len(p[i:]) && p[i+j+1] >= 'A' && p[i+j+1] <= 'Z' {
			p = p[:i+j]
		}
	}
	first, _, _ := strings.Cut(p, "/")
	if strings.HasPrefix(first, "_") || strings.HasPrefix(first, ".") {
		return "", true // build output (_output) and hidden folders: made by builds, not kept
	}
	for _, base := range []string{".", dir} {
		if fi, err := os.Stat(filepath.Join(r.root, base, first)); err != nil || !fi.IsDir() {
			continue
		}
		if _, err := os.Stat(filepath.Join(r.root, base, p)); err != nil {
			return path.Join(base, p), false
		}
		return p, true
	}
	return "", true
}

// The repository's comments and docs name only packages, symbols and files
// that exist (the rules above): a reference left behind by a move or a
// rename fails here.
func TestEveryReferenceInCommentsAndDocsResolves(t *testing.T) {
	r := readRepo(t)
	for _, rel := range slices.Sorted(maps.Keys(r.gos)) {
		f := r.gos[rel]
		outside := map[string]bool{}
		for _, imp := range f.Imports {
			ip := strings.Trim(imp.Path.Value, `"`)
			name := path.Base(ip)
			if imp.Name != nil {
				name = imp.Name.Name
			}
			if ip != modulePath && !strings.HasPrefix(ip, modulePath+"/") {
				outside[name] = true
			}
		}
		dir := path.Dir(rel)
		for _, cg := range f.Comments {
			for _, c := range cg.List {
				line := r.fset.Position(c.Slash).Line
				for i, text := range strings.Split(c.Text, "\n") {
					report := func(msg string) { t.Errorf("%s:%d: %s", rel, line+i, msg) }
					r.checkText(rel, text, outside, report)
					for _, m := range docLink.FindAllStringSubmatch(text, -1) {
						r.checked++
						if !r.byDir[dir].has(m[1], m[2]) {
							report("doc link to " + strings.Trim(m[0], "[]") + ": not in the package")
						}
					}
					for _, m := range goFileRef.FindAllStringSubmatch(text, -1) {
						r.checked++
						if _, err := os.Stat(filepath.Join(r.root, dir, m[2])); err != nil {
							report("no " + m[2] + " in " + dir)
						}
					}
				}
			}
		}
		r.checkReceivers(rel, f, t)
	}
	for _, rel := range r.mds {
		b, err := os.ReadFile(filepath.Join(r.root, rel))
		if err != nil {
			t.Fatal(err)
		}
		fenced := false
		for i, line := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(strings.TrimSpace(line), "```") {
				fenced = !fenced
				continue
			}
			if fenced {
				continue
			}
			report := func(msg string) { t.Errorf("%s:%d: %s", rel, i+1, msg) }
			for _, m := range codeSpan.FindAllStringSubmatch(line, -1) {
				if !strings.Contains(m[1], "://") {
					r.checkText(rel, m[1], nil, report)
				}
			}
			for _, m := range linkTarget.FindAllStringSubmatch(line, -1) {
				target, _, _ := strings.Cut(m[1], "#")
				if target == "" || strings.Contains(target, ":") {
					continue
				}
				r.checked++
				if _, err := os.Stat(filepath.Join(r.root, path.Dir(rel), target)); err != nil {
					report("link to " + target + ": no such file")
				}
			}
		}
	}
	t.Logf("%d references checked in %d Go files and %d Markdown files", r.checked, len(r.gos), len(r.mds))
}

// checkReceivers checks recv.member in the comments of each method of f
// (its doc and its body) against the receiver's type.
func (r *repo) checkReceivers(rel string, f *ast.File, t *testing.T) {
	p := r.byDir[path.Dir(rel)]
	for _, d := range f.Decls {
		fd, ok := d.(*ast.FuncDecl)
		if !ok || fd.Recv == nil || len(fd.Recv.List[0].Names) == 0 {
			continue
		}
		recv, typ := fd.Recv.List[0].Names[0].Name, typeName(fd.Recv.List[0].Type)
		if recv == "_" || len(r.pkgs[recv]) > 0 {
			continue
		}
		ref := regexp.MustCompile(`(^|[^\w.])` + regexp.QuoteMeta(recv) + `\.([A-Za-z_]\w*)`)
		start := fd.Pos()
		if fd.Doc != nil {
			start = fd.Doc.Pos()
		}
		for _, cg := range f.Comments {
			if cg.Pos() < start || cg.End() > fd.End() {
				continue
			}
			for _, c := range cg.List {
				for i, text := range strings.Split(c.Text, "\n") {
					for _, m := range ref.FindAllStringSubmatch(text, -1) {
						r.checked++
						if !p.hasMember(typ, m[2], 0) {
							t.Errorf("%s:%d: %s.%s: %s has no field or method %s", rel, r.fset.Position(c.Slash).Line+i, recv, m[2], typ, m[2])
						}
					}
				}
			}
		}
	}
}
