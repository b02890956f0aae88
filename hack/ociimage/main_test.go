package main

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// untar unpacks the tarball at file into a new directory.
func untar(t *testing.T, file string) string {
	t.Helper()
	dir := t.TempDir()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return dir
		}
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, filepath.FromSlash(h.Name))
		if h.Typeflag == tar.TypeDir {
			if err := os.MkdirAll(p, 0o755); err != nil {
				t.Fatal(err)
			}
			continue
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func writeImage(t *testing.T, args ...string) string {
	t.Helper()
	dir := t.TempDir()
	bin := filepath.Join(dir, "pause")
	if err := os.WriteFile(bin, []byte("#!/bin/true\nnot really a binary\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "image.tar")
	if err := run(append([]string{"--binary", bin, "-o", out}, args...)); err != nil {
		t.Fatal(err)
	}
	return out
}

func TestImageHoldsTheBinaryUnderItsNameWithItsConfig(t *testing.T) {
	out := writeImage(t, "--name", "registry.k8s.io/pause:3.10.1", "--path", "/pause", "--entrypoint", "/pause", "--cmd", "", "--arch", "arm64")
	dir := untar(t, out)
	p, err := layout.FromPath(dir)
	if err != nil {
		t.Fatalf("not an OCI layout: %v", err)
	}
	idx, err := p.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(im.Manifests) != 1 {
		t.Fatalf("%d manifests, want 1", len(im.Manifests))
	}
	d := im.Manifests[0]
	// ctr images import names the image after this annotation.
	if got := d.Annotations["io.containerd.image.name"]; got != "registry.k8s.io/pause:3.10.1" {
		t.Errorf("io.containerd.image.name = %q", got)
	}
	if got := d.Annotations["org.opencontainers.image.ref.name"]; got != "3.10.1" {
		t.Errorf("org.opencontainers.image.ref.name = %q", got)
	}
	if d.Platform == nil || d.Platform.Architecture != "arm64" || d.Platform.OS != "linux" {
		t.Errorf("platform = %+v", d.Platform)
	}
	img, err := p.Image(d.Digest)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(cf.Config.Entrypoint, []string{"/pause"}) || len(cf.Config.Cmd) != 0 || cf.Config.User != "0" || cf.Architecture != "arm64" {
		t.Errorf("config = entrypoint %q cmd %q user %q arch %q", cf.Config.Entrypoint, cf.Config.Cmd, cf.Config.User, cf.Architecture)
	}
	layers, err := img.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("layers: %v, %v", len(layers), err)
	}
	// Read the blob as containerd does: the bytes stored under the layer's
	// digest, as its declared media type says (an uncompressed tar).
	mt, _ := layers[0].MediaType()
	if mt != types.OCIUncompressedLayer {
		t.Fatalf("layer media type %s, want %s", mt, types.OCIUncompressedLayer)
	}
	digest, _ := layers[0].Digest()
	blob, err := os.Open(filepath.Join(dir, "blobs", digest.Algorithm, digest.Hex))
	if err != nil {
		t.Fatal(err)
	}
	defer blob.Close()
	tr := tar.NewReader(blob)
	h, err := tr.Next()
	if err != nil {
		t.Fatal(err)
	}
	content, _ := io.ReadAll(tr)
	if h.Name != "pause" || h.Mode&0o111 == 0 || h.Uid != 0 || !bytes.HasPrefix(content, []byte("#!/bin/true")) {
		t.Errorf("layer entry %q mode %o uid %d, content %q", h.Name, h.Mode, h.Uid, content)
	}
	// The config's diff_ids must name the layer, or containerd refuses it.
	diffID, _ := layers[0].DiffID()
	if len(cf.RootFS.DiffIDs) != 1 || cf.RootFS.DiffIDs[0] != diffID {
		t.Errorf("rootfs diff_ids %v, layer %v", cf.RootFS.DiffIDs, diffID)
	}
}

func TestSameBinarySameImage(t *testing.T) {
	a, err := os.ReadFile(writeImage(t, "--name", "podres-proxy:dev"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(writeImage(t, "--name", "podres-proxy:dev"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a, b) {
		t.Error("two images of the same binary differ: the tarball is not reproducible")
	}
}

func TestALabelMakesAnotherImageOfTheSameBinary(t *testing.T) {
	// The cluster suite's rollout tag must be a new image to containerd, not
	// the old one under another name.
	configOf := func(args ...string) (v1.Hash, map[string]string) {
		t.Helper()
		dir := untar(t, writeImage(t, append([]string{"--name", "podres-proxy:v2"}, args...)...))
		p, err := layout.FromPath(dir)
		if err != nil {
			t.Fatal(err)
		}
		idx, err := p.ImageIndex()
		if err != nil {
			t.Fatal(err)
		}
		m, err := idx.IndexManifest()
		if err != nil || len(m.Manifests) != 1 {
			t.Fatalf("index: %v, %d manifests", err, len(m.Manifests))
		}
		img, err := p.Image(m.Manifests[0].Digest)
		if err != nil {
			t.Fatal(err)
		}
		cf, err := img.ConfigFile()
		if err != nil {
			t.Fatal(err)
		}
		return m.Manifests[0].Digest, cf.Config.Labels
	}
	plain, none := configOf()
	labelled, labels := configOf("--label", "org.opencontainers.image.version=v2")
	if len(none) != 0 || labels["org.opencontainers.image.version"] != "v2" {
		t.Errorf("labels %v without --label, %v with it", none, labels)
	}
	if plain == labelled {
		t.Errorf("the labelled image has the plain one's digest %s", plain)
	}
	if err := run([]string{"--binary", "x", "--name", "n", "-o", "o", "--label", "novalue"}); err == nil {
		t.Error("--label without = was accepted")
	}
}

func TestProxyImageMatchesTheDockerfile(t *testing.T) {
	// The Dockerfile's final stage and ProxyImage must start the same
	// process as the same user: users with an engine and the test cluster
	// without one run the same thing.
	data, err := os.ReadFile("../../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	stages := strings.Split(string(data), "\nFROM ")
	final := stages[len(stages)-1]
	var entrypoint, cmd []string
	for _, line := range strings.Split(final, "\n") {
		kw, rest, _ := strings.Cut(strings.TrimSpace(line), " ")
		var dst *[]string
		switch strings.ToUpper(kw) {
		case "ENTRYPOINT":
			dst = &entrypoint
		case "CMD":
			dst = &cmd
		case "USER":
			t.Fatalf("the Dockerfile sets USER %s: make ProxyImage.User agree", rest)
		case "COPY":
			if f := strings.Fields(rest); f[len(f)-1] != ProxyImage.Path {
				t.Errorf("the Dockerfile copies the binary to %s, ProxyImage to %s", f[len(f)-1], ProxyImage.Path)
			}
		}
		if dst != nil {
			if err := json.Unmarshal([]byte(rest), dst); err != nil {
				t.Fatalf("%s is not in exec form: %v", kw, err)
			}
		}
	}
	if !slices.Equal(entrypoint, ProxyImage.Entrypoint) || !slices.Equal(cmd, ProxyImage.Cmd) {
		t.Errorf("Dockerfile ENTRYPOINT %q CMD %q, ProxyImage %q %q", entrypoint, cmd, ProxyImage.Entrypoint, ProxyImage.Cmd)
	}
	// distroless/static's default user is root.
	if ProxyImage.User != "0" {
		t.Errorf("ProxyImage.User = %q; the Dockerfile runs as distroless/static's default, root", ProxyImage.User)
	}
}

func TestRefusesARelativePathInTheImage(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "b")
	os.WriteFile(bin, []byte("x"), 0o755)
	err := run([]string{"--binary", bin, "--name", "x:1", "-o", filepath.Join(dir, "o.tar"), "--path", "pause"})
	if err == nil || !strings.Contains(err.Error(), "absolute") {
		t.Errorf("err = %v, want a refusal of the relative path", err)
	}
}
