// Command ociimage writes a one-binary container image as an OCI image layout
// tarball, without a container engine: the binary in one layer on an empty
// base, with an entrypoint, a command and a user, named so that
// `ctr -n k8s.io images import FILE` registers it under that name.
//
// The test node has no registry and CI has no container engine, so the
// node's pause image and podres-proxy's own image are made this way
// (hack/build-node.sh, `make image-oci`). The Dockerfile stays for users with
// an engine; deploy/image_test.go checks that both give the same entrypoint,
// command and user. go-containerregistry writes the layout (digests, sizes,
// media types), so nothing here hand-writes manifests.
//
// Usage:
//
//	ociimage --binary BIN --name NAME -o OUT.tar [--path /podres-proxy]
//	         [--entrypoint /podres-proxy] [--cmd serve] [--user 0] [--arch amd64]
//	         [--label KEY=VALUE ...]
package main

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/spf13/pflag"
)

// Spec is what goes into the image.
type Spec struct {
	Binary     string   // the file to put in the image
	Path       string   // where, inside the image (absolute)
	Name       string   // the image name, e.g. registry.k8s.io/pause:3.10
	Entrypoint []string // the config's Entrypoint
	Cmd        []string // the config's Cmd
	User       string   // the config's User ("0": root, as distroless/static's default)
	Arch       string   // GOARCH of the binary
	// Labels are the config's labels (none by default). A label makes
	// another image of the same binary: the cluster suite's rollout tag.
	Labels map[string]string
}

// ProxyImage is podres-proxy's image as the Dockerfile makes it: the
// binary at /podres-proxy, its entrypoint, `serve` as the command, root
// (distroless/static's default user; the DaemonSet drops every capability).
// These are the flags' defaults.
var ProxyImage = Spec{
	Path:       "/podres-proxy",
	Entrypoint: []string{"/podres-proxy"},
	Cmd:        []string{"serve"},
	User:       "0",
}

// epoch is every timestamp in the image, so the same binary gives the same
// digests.
var epoch = time.Unix(0, 0).UTC()

// Build returns the image Spec describes.
func Build(s Spec) (v1.Image, error) {
	if !path.IsAbs(s.Path) || path.Clean(s.Path) != s.Path {
		return nil, fmt.Errorf("path in image %q is not a clean absolute path", s.Path)
	}
	bin, err := os.ReadFile(s.Binary)
	if err != nil {
		return nil, fmt.Errorf("reading the binary: %w", err)
	}
	layerTar, err := oneFileTar(strings.TrimPrefix(s.Path, "/"), bin)
	if err != nil {
		return nil, err
	}
	// An uncompressed layer, stored as written: its blob is the tar itself.
	layer := static.NewLayer(layerTar, types.OCIUncompressedLayer)
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	img, err = mutate.Append(img, mutate.Addendum{Layer: layer, MediaType: types.OCIUncompressedLayer})
	if err != nil {
		return nil, fmt.Errorf("adding the layer: %w", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.Architecture, cf.OS = s.Arch, "linux"
	cf.Created = v1.Time{Time: epoch}
	cf.Config.Entrypoint = s.Entrypoint
	cf.Config.Cmd = s.Cmd
	cf.Config.User = s.User
	cf.Config.WorkingDir = "/"
	if len(s.Labels) > 0 {
		cf.Config.Labels = s.Labels
	}
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		return nil, fmt.Errorf("setting the config: %w", err)
	}
	return mutate.CreatedAt(img, v1.Time{Time: epoch})
}

// oneFileTar is a layer holding one executable file, owned by root, with
// its parent directories.
func oneFileTar(name string, content []byte) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	var dirs []string
	for d := path.Dir(name); d != "."; d = path.Dir(d) {
		dirs = append([]string{d}, dirs...)
	}
	for _, d := range dirs {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d + "/", Mode: 0o755, ModTime: epoch, Format: tar.FormatPAX}); err != nil {
			return nil, err
		}
	}
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o755, Size: int64(len(content)), ModTime: epoch, Format: tar.FormatPAX}); err != nil {
		return nil, err
	}
	if _, err := tw.Write(content); err != nil {
		return nil, err
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("writing the layer: %w", err)
	}
	return buf.Bytes(), nil
}

// WriteTarball writes img as an OCI image layout, packed as a tar file at
// out, with the name annotations containerd's importer reads.
func WriteTarball(img v1.Image, name, arch, out string) error {
	dir, err := os.MkdirTemp(filepath.Dir(out), ".ociimage-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return fmt.Errorf("writing the layout: %w", err)
	}
	ref := name
	if i := strings.LastIndex(name, ":"); i > strings.LastIndex(name, "/") {
		ref = name[i+1:]
	}
	err = p.AppendImage(img,
		layout.WithPlatform(v1.Platform{OS: "linux", Architecture: arch}),
		layout.WithAnnotations(map[string]string{
			"io.containerd.image.name":          name,
			"org.opencontainers.image.ref.name": ref,
		}))
	if err != nil {
		return fmt.Errorf("adding the image to the layout: %w", err)
	}
	tmp := out + ".tmp"
	if err := tarDir(dir, tmp); err != nil {
		os.Remove(tmp)
		return err
	}
	return os.Rename(tmp, out)
}

// tarDir packs dir's files, sorted, with fixed owners and times.
func tarDir(dir, out string) (err error) {
	var files []string
	err = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		files = append(files, p)
		return nil
	})
	if err != nil {
		return err
	}
	sort.Strings(files)
	f, err := os.Create(out)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}()
	tw := tar.NewWriter(f)
	for _, p := range files {
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		h := &tar.Header{Name: filepath.ToSlash(rel), Mode: 0o644, ModTime: epoch, Format: tar.FormatPAX}
		switch {
		case fi.IsDir():
			h.Typeflag, h.Name, h.Mode = tar.TypeDir, h.Name+"/", 0o755
		case fi.Mode().IsRegular():
			h.Typeflag, h.Size = tar.TypeReg, fi.Size()
		default:
			return fmt.Errorf("%s: not a file or directory", p)
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if h.Typeflag == tar.TypeReg {
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			if _, err := tw.Write(data); err != nil {
				return err
			}
		}
	}
	return tw.Close()
}

// words splits a flag value on spaces; "" is no words.
func words(s string) []string { return strings.Fields(s) }

func run(args []string) error {
	fs := pflag.NewFlagSet("ociimage", pflag.ContinueOnError)
	var s Spec
	var entrypoint, cmd, out string
	var labels []string
	fs.StringVar(&s.Binary, "binary", "", "the binary to put in the image (required)")
	fs.StringVar(&s.Name, "name", "", "the image name containerd registers it under (required)")
	fs.StringVarP(&out, "output", "o", "", "the OCI layout tarball to write (required)")
	fs.StringVar(&s.Path, "path", ProxyImage.Path, "where the binary goes in the image")
	fs.StringVar(&entrypoint, "entrypoint", strings.Join(ProxyImage.Entrypoint, " "), "the entrypoint, space-separated words")
	fs.StringVar(&cmd, "cmd", strings.Join(ProxyImage.Cmd, " "), "the command, space-separated words")
	fs.StringVar(&s.User, "user", ProxyImage.User, "the user the container runs as")
	fs.StringVar(&s.Arch, "arch", runtime.GOARCH, "the binary's architecture")
	fs.StringArrayVar(&labels, "label", nil, "a config label KEY=VALUE (repeatable)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if s.Binary == "" || s.Name == "" || out == "" {
		return errors.New("--binary, --name and -o are required")
	}
	s.Entrypoint, s.Cmd = words(entrypoint), words(cmd)
	for _, l := range labels {
		k, v, ok := strings.Cut(l, "=")
		if !ok || k == "" {
			return fmt.Errorf("--label %q is not KEY=VALUE", l)
		}
		if s.Labels == nil {
			s.Labels = map[string]string{}
		}
		s.Labels[k] = v
	}
	img, err := Build(s)
	if err != nil {
		return err
	}
	return WriteTarball(img, s.Name, s.Arch, out)
}

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "ociimage:", err)
		os.Exit(1)
	}
}
