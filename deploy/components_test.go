package deploy_test

import (
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"sigs.k8s.io/kustomize/kyaml/filesys"
)

// inMemoryDeploy copies deploy/'s YAML and JSON files (the dashboard) into
// an in-memory file system under /deploy, with edit applied to each file's
// content.
func inMemoryDeploy(t *testing.T, edit func(path, content string) string) filesys.FileSystem {
	t.Helper()
	mem := filesys.MakeFsInMemory()
	err := filepath.WalkDir(deployDir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !(strings.HasSuffix(path, ".yaml") || strings.HasSuffix(path, ".json")) {
			return err
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return mem.WriteFile(filepath.Join("/deploy", path), []byte(edit(path, string(data))))
	})
	if err != nil {
		t.Fatal(err)
	}
	return mem
}

func TestComponentsRefuseABaseWhoseArgumentsMoved(t *testing.T) {
	// The components replace arguments by position after a "test" op checks
	// the value there. If the base's order changes, the build must fail, not
	// patch the wrong argument.
	swap := func(path, content string) string {
		if path != filepath.Join("base", "daemonset.yaml") {
			return content
		}
		const a = "        - --kubelet-socket=/var/lib/kubelet/pod-resources/kubelet.sock\n"
		const b = "        - --kubelet-ca-file=/var/run/secrets/kubernetes.io/serviceaccount/ca.crt\n"
		const c = "        - --cri-socket=unix:///run/containerd/containerd.sock\n"
		if !strings.Contains(content, a+b) || !strings.Contains(content, c) {
			t.Fatal("base/daemonset.yaml no longer has the arguments this test moves")
		}
		content = strings.Replace(content, a+b, b+a, 1)
		// Without --cri-socket, index 6 holds another flag.
		return strings.Replace(content, c, "", 1)
	}
	mem := inMemoryDeploy(t, swap)

	// The unmodified copy still builds, so the failures below are the guards'.
	if _, err := build(inMemoryDeploy(t, func(_, c string) string { return c }), "/deploy/testdata/all-components"); err != nil {
		t.Fatalf("building the unmodified copy: %v", err)
	}
	for _, dir := range []string{"testdata/cri-o", "testdata/kubelet-insecure-tls"} {
		_, err := build(mem, filepath.Join("/deploy", dir))
		if err == nil || !strings.Contains(err.Error(), "test failed") {
			t.Errorf("%s against a base whose arguments moved: err = %v, want a failed test op", dir, err)
		}
	}
}
