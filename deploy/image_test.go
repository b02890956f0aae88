package deploy_test

import (
	"bufio"
	"bytes"
	"context"
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spf13/pflag"
)

// repoRoot is the module root, where the Dockerfile and its context are.
const repoRoot = ".."

// testVersion is the VERSION build argument the tests build with.
const testVersion = "v0.0.0-deploytest"

// binDir holds the binary built once for the whole test run.
var binDir string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "podres-proxy-deploy-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binDir = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// instruction is one Dockerfile instruction, continuation lines joined.
type instruction struct {
	cmd, args string
}

// dockerfile reads the repository's Dockerfile.
func dockerfile(t *testing.T) []instruction {
	t.Helper()
	f, err := os.Open(filepath.Join(repoRoot, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []instruction
	var cur strings.Builder
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if rest, ok := strings.CutSuffix(line, `\`); ok {
			cur.WriteString(rest + " ")
			continue
		}
		cur.WriteString(line)
		cmd, args, _ := strings.Cut(cur.String(), " ")
		out = append(out, instruction{strings.ToUpper(cmd), strings.TrimSpace(args)})
		cur.Reset()
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// shellWords splits a command line the way sh does for the simple words a
// Dockerfile's build line uses: blanks separate, quotes group. Anything that
// would need a real shell (;, &, |, $(, backquotes) is refused.
func shellWords(s string) ([]string, error) {
	if strings.ContainsAny(s, ";&|`") || strings.Contains(s, "$(") {
		return nil, fmt.Errorf("%q needs a shell; keep the go build line a plain command", s)
	}
	var words []string
	var w strings.Builder
	inWord := false
	var quote rune
	for _, r := range s {
		switch {
		case quote != 0 && r == quote:
			quote = 0
		case quote != 0:
			w.WriteRune(r)
		case r == '"' || r == '\'':
			quote, inWord = r, true
		case r == ' ' || r == '\t':
			if inWord {
				words = append(words, w.String())
				w.Reset()
				inWord = false
			}
		default:
			w.WriteRune(r)
			inWord = true
		}
	}
	if quote != 0 {
		return nil, fmt.Errorf("unterminated quote in %q", s)
	}
	if inWord {
		words = append(words, w.String())
	}
	return words, nil
}

// goBuild is the Dockerfile's go build line, taken apart.
type goBuild struct {
	env    []string // KEY=VALUE before "go"
	args   []string // after "go build", with -o's value
	output string   // the -o value in the Dockerfile
}

var varRef = regexp.MustCompile(`\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?`)

// dockerfileGoBuild finds the RUN instruction with go build and expands its
// build arguments as docker would for a linux build of this machine's arch.
func dockerfileGoBuild(t *testing.T) goBuild {
	t.Helper()
	buildArgs := map[string]string{"TARGETOS": "linux", "TARGETARCH": runtime.GOARCH, "VERSION": testVersion}
	var found []string
	for _, in := range dockerfile(t) {
		if in.cmd == "RUN" && strings.Contains(in.args, "go build") {
			found = append(found, in.args)
		}
	}
	if len(found) != 1 {
		t.Fatalf("want one RUN with go build in the Dockerfile, found %d", len(found))
	}
	line := varRef.ReplaceAllStringFunc(found[0], func(ref string) string {
		name := varRef.FindStringSubmatch(ref)[1]
		v, ok := buildArgs[name]
		if !ok {
			t.Fatalf("the go build line uses ${%s}, which this test does not know", name)
		}
		return v
	})
	words, err := shellWords(line)
	if err != nil {
		t.Fatal(err)
	}
	var gb goBuild
	i := 0
	for ; i < len(words) && strings.Contains(words[i], "=") && !strings.HasPrefix(words[i], "-"); i++ {
		gb.env = append(gb.env, words[i])
	}
	if len(words) < i+2 || words[i] != "go" || words[i+1] != "build" {
		t.Fatalf("the build line %q is not [ENV=...] go build ...", line)
	}
	gb.args = words[i+2:]
	for j, a := range gb.args {
		if a == "-o" && j+1 < len(gb.args) {
			gb.output = gb.args[j+1]
		}
	}
	if gb.output == "" {
		t.Fatal("the go build line has no -o")
	}
	return gb
}

var (
	buildOnce sync.Once
	builtBin  string
	buildErr  error
)

// binary builds cmd/podres-proxy once, exactly as the Dockerfile does, and
// returns its path. The build takes long on a cold cache: -short skips it.
func binary(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("builds the binary as the Dockerfile does; skipped with -short")
	}
	gb := dockerfileGoBuild(t)
	buildOnce.Do(func() {
		out := filepath.Join(binDir, "podres-proxy")
		args := slices.Clone(gb.args)
		for j := range args {
			if j > 0 && args[j-1] == "-o" {
				args[j] = out
			}
		}
		// On a cold build cache this compiles every dependency again
		// (-trimpath changes the cache keys): give it what the test run has
		// left, and say so if that is not enough.
		ctx := context.Background()
		if d, ok := t.Deadline(); ok {
			var cancel context.CancelFunc
			ctx, cancel = context.WithDeadline(ctx, d.Add(-10*time.Second))
			defer cancel()
		}
		cmd := exec.CommandContext(ctx, "go", append([]string{"build"}, args...)...)
		cmd.Dir = repoRoot
		cmd.Env = append(os.Environ(), gb.env...)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		if err := cmd.Run(); err != nil {
			if ctx.Err() != nil {
				err = fmt.Errorf("%w: the test run's -timeout ran out; a cold build cache needs minutes", ctx.Err())
			}
			buildErr = fmt.Errorf("go build %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
			return
		}
		builtBin = out
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return builtBin
}

func TestDockerfileBuildLineMakesAStrippedStaticBinary(t *testing.T) {
	gb := dockerfileGoBuild(t)
	if !slices.Contains(gb.env, "CGO_ENABLED=0") {
		t.Errorf("build env %q lacks CGO_ENABLED=0: the binary would need libc, which distroless/static lacks", gb.env)
	}
	if !slices.Contains(gb.args, "-trimpath") {
		t.Error("go build without -trimpath")
	}
	ld := ""
	for j, a := range gb.args {
		if a == "-ldflags" && j+1 < len(gb.args) {
			ld = gb.args[j+1]
		}
	}
	for _, want := range []string{"-s", "-w", "-X main.version=" + testVersion} {
		if !strings.Contains(" "+ld+" ", " "+want+" ") {
			t.Errorf("-ldflags %q lacks %q", ld, want)
		}
	}
	if gb.args[len(gb.args)-1] != "./cmd/podres-proxy" {
		t.Errorf("builds %q, want ./cmd/podres-proxy", gb.args[len(gb.args)-1])
	}
}

func TestImageRunsTheBuiltBinaryAsEntrypoint(t *testing.T) {
	ins := dockerfile(t)
	gb := dockerfileGoBuild(t)
	var froms []string
	var copied, entrypoint, cmd string
	for _, in := range ins {
		switch in.cmd {
		case "FROM":
			froms = append(froms, in.args)
		case "COPY":
			if strings.HasPrefix(in.args, "--from=build ") {
				copied = in.args
			}
		case "ENTRYPOINT":
			entrypoint = in.args
		case "CMD":
			cmd = in.args
		}
	}
	if len(froms) != 2 || !strings.HasPrefix(froms[0], "--platform=$BUILDPLATFORM golang:") || !strings.HasSuffix(froms[0], " AS build") {
		t.Errorf("stages %q, want a golang builder named build and one final stage", froms)
	}
	if len(froms) > 0 && !strings.HasPrefix(froms[len(froms)-1], "gcr.io/distroless/static") {
		t.Errorf("final stage %q is not distroless/static", froms[len(froms)-1])
	}
	if want := "--from=build " + gb.output + " /podres-proxy"; copied != want {
		t.Errorf("COPY %q, want %q", copied, want)
	}
	if entrypoint != `["/podres-proxy"]` {
		t.Errorf(`ENTRYPOINT %s, want ["/podres-proxy"]: the DaemonSet passes "serve" and its flags as args`, entrypoint)
	}
	if cmd != `["serve"]` {
		t.Errorf(`CMD %s, want ["serve"]`, cmd)
	}
}

// dockerignored reports whether path (relative to the context, slash
// separated) is left out by one of the .dockerignore patterns this
// repository uses: a path or glob leaves out what it matches and everything
// under it; one starting with **/ does so at any depth.
func dockerignored(patterns []string, path string) bool {
	parts := strings.Split(path, "/")
	for _, p := range patterns {
		rest, anyDepth := strings.CutPrefix(p, "**/")
		n := len(strings.Split(rest, "/"))
		for start := 0; start+n <= len(parts); start++ {
			if start > 0 && !anyDepth {
				break
			}
			if ok, _ := filepath.Match(rest, strings.Join(parts[start:start+n], "/")); ok {
				return true
			}
		}
	}
	return false
}

func TestDockerignoreKeepsEverySourceTheBuildNeeds(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(repoRoot, ".dockerignore"))
	if err != nil {
		t.Fatal(err)
	}
	var patterns []string
	for _, line := range strings.Split(string(data), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if strings.HasPrefix(line, "!") {
			t.Fatalf(".dockerignore pattern %q: exceptions are not supported by this test", line)
		}
		patterns = append(patterns, strings.TrimPrefix(line, "/"))
	}
	// The matcher itself, on the patterns that matter.
	for path, want := range map[string]bool{
		".git/HEAD": true, "proxy/server_test.go": true, "proxy/inventory/testdata/a.json": true,
		"podres-proxy": true, "cmd/podres-proxy/main.go": false, "go.sum": false,
	} {
		if got := dockerignored(patterns, path); got != want {
			t.Errorf("dockerignored(%s) = %v, want %v", path, got, want)
		}
	}

	cmd := exec.Command("go", "list", "-deps", "-f", `{{if not .Standard}}{{$d := .Dir}}{{range .GoFiles}}{{$d}}/{{.}}
{{end}}{{range .EmbedFiles}}{{$d}}/{{.}}
{{end}}{{end}}`, "./cmd/podres-proxy")
	cmd.Dir = repoRoot
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	root, err := filepath.Abs(repoRoot)
	if err != nil {
		t.Fatal(err)
	}
	needed := []string{"go.mod", "go.sum"}
	for _, f := range strings.Fields(string(out)) {
		if rel, err := filepath.Rel(root, f); err == nil && !strings.HasPrefix(rel, "..") {
			needed = append(needed, filepath.ToSlash(rel))
		}
	}
	if len(needed) < 4 {
		t.Fatalf("go list found only %q in the module", needed)
	}
	for _, f := range needed {
		if dockerignored(patterns, f) {
			t.Errorf(".dockerignore leaves out %s, which the image's go build needs", f)
		}
	}
}

func TestBinaryBuiltAsTheDockerfileDoesIsStatic(t *testing.T) {
	bin := binary(t)
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Error("the binary has a PT_INTERP program header: it needs a dynamic loader")
		}
	}
	libs, err := f.ImportedLibraries()
	if err != nil {
		t.Fatal(err)
	}
	if len(libs) != 0 {
		t.Errorf("the binary needs shared libraries %q", libs)
	}
	for _, s := range []string{".symtab", ".debug_info"} {
		if f.Section(s) != nil {
			t.Errorf("the binary has a %s section: -s -w did not strip it", s)
		}
	}

	out, err := exec.Command(bin, "version").CombinedOutput()
	if err != nil {
		t.Fatalf("podres-proxy version: %v\n%s", err, out)
	}
	if !strings.HasPrefix(string(out), "podres-proxy "+testVersion+" ") {
		t.Errorf("podres-proxy version printed %q, want the -X main.version value %s", out, testVersion)
	}
}

// serveFlagSet rebuilds the flag set of "podres-proxy serve" from its -h
// output (pflag's): each flag's name and the type its usage line names
// (none: bool).
func serveFlagSet(t *testing.T, bin string) *pflag.FlagSet {
	t.Helper()
	out, err := exec.Command(bin, "serve", "-h").CombinedOutput()
	if err != nil {
		t.Fatalf("podres-proxy serve -h: %v\n%s", err, out)
	}
	fs := pflag.NewFlagSet("serve", pflag.ContinueOnError)
	fs.SetOutput(new(bytes.Buffer))
	line := regexp.MustCompile(`^ +--([a-z0-9-]+)(?: ([a-zA-Z0-9]+))?  `)
	for _, l := range strings.Split(string(out), "\n") {
		m := line.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		switch name, typ := m[1], m[2]; typ {
		case "":
			fs.Bool(name, false, "")
		case "string":
			fs.String(name, "", "")
		case "stringArray":
			fs.StringArray(name, nil, "")
		case "duration":
			fs.Duration(name, time.Second, "")
		case "int":
			fs.Int(name, 0, "")
		case "float":
			fs.Float64(name, 0, "")
		default:
			t.Fatalf("flag -%s has type %q, which this test does not know", name, typ)
		}
	}
	if fs.Lookup("socket") == nil || fs.Lookup("kubelet-socket") == nil {
		t.Fatalf("could not read the flags from serve -h:\n%s", out)
	}
	return fs
}

func TestDaemonSetArgsAreFlagsServeAccepts(t *testing.T) {
	bin := binary(t)
	for dir, ds := range proxyDaemonSets(t, renderAll(t)) {
		t.Run(dir, func(t *testing.T) {
			args := proxyContainer(t, ds).Args
			if len(args) == 0 || args[0] != "serve" {
				t.Fatalf("args %q do not start with serve", args)
			}
			fs := serveFlagSet(t, bin)
			if err := fs.Parse(args[1:]); err != nil {
				t.Errorf("podres-proxy serve refuses its arguments: %v (args %q)", err, args[1:])
			} else if fs.NArg() != 0 {
				t.Errorf("serve takes no positional arguments, got %q", fs.Args())
			}
		})
	}
}

func TestFlagCheckRefusesARenamedFlag(t *testing.T) {
	// The check above must notice a flag the binary does not have.
	fs := serveFlagSet(t, binary(t))
	if err := fs.Parse([]string{"--koordinator-gpu-resource=nvidia.com/gpu"}); err == nil {
		t.Error("a flag serve does not define was accepted")
	}
	fs = serveFlagSet(t, binary(t))
	if err := fs.Parse([]string{"--kubelet-pods-timeout=soon"}); err == nil {
		t.Error("a duration flag accepted a value that is no duration")
	}
}
