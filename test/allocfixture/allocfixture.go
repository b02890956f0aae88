// Package allocfixture loads the allocation fixtures that the schedulers' own
// encoding code wrote (testdata/allocators: see its README), so that the
// decoder tests and the end-to-end tests read the same cases and a fixture
// dropped into that folder is tested without a code change. It is test support only: nothing in the daemon imports it.
package allocfixture

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/podres-proxy/podres-proxy/inventory"
	"github.com/podres-proxy/podres-proxy/model"
)

// Dir, relative to the module root, holds the fixtures the schedulers' own
// code wrote, one folder per scheduler (testdata/allocators/README.md).
const Dir = "test/allocfixture/testdata/allocators"

// RepoDir, relative to the module root, holds more fixtures in the same
// format (testdata/README.md): annotations derived from the writers' own
// code paths where Dir has none (Volcano's vNPU, HAMi's AWS Neuron,
// TensorFusion's partitions). Load reads both.
const RepoDir = "test/allocfixture/testdata"

// Case is one fixture: one pod, its annotations, and what v1 List must show.
type Case struct {
	// File is the fixture's path, for failure messages.
	File        string            `json:"-"`
	Name        string            `json:"name"`
	Scheduler   string            `json:"scheduler"`
	Commit      string            `json:"commit"`
	Description string            `json:"description"`
	Annotations map[string]string `json:"annotations"`
	Containers  []Container       `json:"pod containers"`
	Inventory   []InventoryDevice `json:"inventory"`
	Allocated   []Entry           `json:"allocated"`
	Expect      []Entry           `json:"expect"`
	// Attribution is "exact" (the annotation says which container gets
	// what, compared position by position) or "policy" (docs/design.md's policy
	// chooses, compared as a set per container).
	Attribution string `json:"expectAttribution"`
	Notes       string `json:"notes"`
}

// Container is one container of the fixture's pod.
type Container struct {
	Name     string            `json:"name"`
	Kind     string            `json:"kind"` // init, sidecar, app
	Requests map[string]string `json:"requests"`
	// Annotations are those the runtime creates the container with where
	// an allocator's device plugin writes some (testdata/README.md).
	Annotations map[string]string `json:"annotations"`
}

// ContainerAnnotations returns the containers' annotations by container
// name, as the store gives them to the decoders; nil when none has any.
func (c Case) ContainerAnnotations() map[string]map[string]string {
	var out map[string]map[string]string
	for _, ctr := range c.Containers {
		if len(ctr.Annotations) > 0 {
			if out == nil {
				out = map[string]map[string]string{}
			}
			out[ctr.Name] = ctr.Annotations
		}
	}
	return out
}

// InventoryDevice is one of the node's devices, for decoders that name
// devices by minor or index.
type InventoryDevice struct {
	Type  string `json:"type"`
	ID    string `json:"id"`
	Minor *int64 `json:"minor"`
	Index *int64 `json:"index"`
}

// Entry is one (container, resource, device id) the pod must show.
type Entry struct {
	Container string `json:"container"`
	Resource  string `json:"resource"`
	ID        string `json:"id"`
}

// Exact reports whether the fixture's attribution is exact.
func (c Case) Exact() bool { return c.Attribution == "exact" }

// Spec returns the pod spec as the state store keeps it.
func (c Case) Spec() *model.PodSpec {
	spec := &model.PodSpec{}
	for _, ctr := range c.Containers {
		spec.Containers = append(spec.Containers, model.ContainerSpec{
			Name:     ctr.Name,
			Kind:     model.ContainerKind(ctr.Kind),
			Requests: ctr.Requests,
		})
	}
	return spec
}

// SchedulerName is the spec.schedulerName the fixture's scheduler uses.
func (c Case) SchedulerName() string {
	switch c.Scheduler {
	case "koordinator":
		return "koord-scheduler"
	case "hami":
		return "hami-scheduler"
	case "tensorfusion":
		return "tensor-fusion-scheduler"
	default:
		return c.Scheduler
	}
}

// BaseID is what consumers must match: an id without the replica suffix
// ("<uuid>::<n>") some products give the sharers of one GPU.
func BaseID(id string) string {
	base, _, _ := strings.Cut(id, "::")
	return base
}

// Load reads every fixture under the module root's Dir. A missing folder
// is an error, never an empty list: a test that silently checked nothing
// would look green.
func Load() ([]Case, error) {
	root, err := moduleRoot()
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(root, filepath.FromSlash(Dir))
	if _, err := os.Stat(dir); err != nil {
		return nil, fmt.Errorf("allocation fixtures: %w (the fixtures are part of the repository: is the checkout complete?)", err)
	}
	files, err := filepath.Glob(filepath.Join(dir, "*", "*.json"))
	if err != nil {
		return nil, fmt.Errorf("allocation fixtures: %w", err)
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("allocation fixtures: no */*.json under %s", dir)
	}
	more, err := filepath.Glob(filepath.Join(root, filepath.FromSlash(RepoDir), "*", "*.json"))
	if err != nil {
		return nil, fmt.Errorf("allocation fixtures: %w", err)
	}
	files = append(files, more...)
	slices.Sort(files)
	cases := make([]Case, 0, len(files))
	for _, f := range files {
		c, err := read(f)
		if err != nil {
			return nil, err
		}
		cases = append(cases, c)
	}
	return cases, nil
}

func read(file string) (Case, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return Case{}, fmt.Errorf("read fixture: %w", err)
	}
	var c Case
	if err := json.Unmarshal(b, &c); err != nil {
		return Case{}, fmt.Errorf("decode fixture %s: %w", file, err)
	}
	c.File = file
	if c.Name == "" || len(c.Containers) == 0 {
		return Case{}, fmt.Errorf("fixture %s: no name or no containers", file)
	}
	if c.Attribution != "exact" && c.Attribution != "policy" {
		return Case{}, fmt.Errorf("fixture %s: expectAttribution %q, want exact or policy", file, c.Attribution)
	}
	return c, nil
}

// moduleRoot walks up from the working directory (a test's package folder)
// to the folder holding go.mod.
func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("find module root: %w", err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		} else if !errors.Is(err, os.ErrNotExist) {
			return "", fmt.Errorf("find module root: %w", err)
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("find module root: no go.mod above the working directory")
		}
		dir = parent
	}
}

// Snapshot is the node's devices the fixture names, for devices its
// annotation gives by minor or index only.
func (c Case) Snapshot() *inventory.Snapshot {
	var devs []inventory.Device
	for _, d := range c.Inventory {
		devs = append(devs, inventory.Device{Type: d.Type, ID: d.ID, Minor: d.Minor, Index: d.Index, Healthy: true})
	}
	return inventory.NewSnapshot(devs)
}

// AddSeeds seeds a fuzz target with the values of every annotation the
// schedulers' own code wrote whose key the target reads, so that mutations
// start from what is really written.
func AddSeeds(f *testing.F, reads func(key string) bool) {
	cases, err := Load()
	if err != nil {
		f.Fatal(err)
	}
	n := 0
	for _, c := range cases {
		for key, value := range c.Annotations {
			if reads(key) {
				f.Add(value)
				n++
			}
		}
	}
	if n == 0 {
		f.Fatal("no fixture carries an annotation this target reads")
	}
}
