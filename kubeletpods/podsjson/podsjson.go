// Package podsjson decodes the kubelet's /pods answer (a v1 PodList in
// JSON) into model.KubeletPods: identity, phase, the annotations asked for
// and the extended resources each container requests, skipping everything
// else unread, one pod at a time and within bounds on what it keeps (each
// annotation, each pod's annotations, the whole answer: see Bounds). It is
// apart from package kubeletpods, the HTTP client and coalescing reader,
// because decoding is its own concern with its own speed and memory goals
// (the decoder comparison below) and its own fuzzing.
package podsjson

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"slices"

	// The /pods answer is decoded with github.com/goccy/go-json, a drop-in
	// for encoding/json: the same struct tags and the same Unmarshal, so
	// the code below is what it would be with the standard library, and
	// it is the fastest candidate by far, clear of the 200 MB/s target. An
	// answer is 5-7 KB per pod, of which podres-proxy needs a few hundred
	// bytes (managedFields alone are a third), so speed is the speed of
	// skipping. Measured side by side on podstest's pods, 10 to 250 per
	// answer, in MB of JSON per CPU-second on a busy 2-core machine:
	//   go-json                                  450-670
	//   valyala/fastjson                         130-420 (builds a tree of the whole
	//                                                     answer; code walks it by hand)
	//   json-iterator                            100-180
	//   buger/jsonparser                         120-160 (path callbacks, twice the code)
	//   encoding/json/v2, go-json-experiment     105-160 (v2 needs GOEXPERIMENT=jsonv2
	//                                                     in Go 1.26)
	//   encoding/json                             55-95
	//   encoding/json into k8s.io/api PodList     27-45  (koordlet's way)
	// BenchmarkDecodePods repeats the comparison with the standard library.
	// go-json copies its input and the strings it returns, so nothing
	// decoded keeps the answer's buffer alive.
	json "github.com/goccy/go-json"

	"github.com/podres-proxy/podres-proxy/model"
)

// podList is the part of a kubelet /pods answer (a v1 PodList) that
// podres-proxy needs. Everything else in the answer is skipped unread.
type podList struct {
	Kind string `json:"kind"`
	// Items is null, not [], when the node has no pods: the kubelet's
	// encodePods appends to a nil slice.
	Items []Pod `json:"items"`
}

// Pod is the part of a pod that podres-proxy keeps, in the shape of its
// JSON encoding. Package podsapi fills one from the Pods API's protobuf,
// so that both sources keep the same of the same pod (Model).
type Pod struct {
	Metadata struct {
		UID       string `json:"uid"`
		Namespace string `json:"namespace"`
		Name      string `json:"name"`
		// CreationTimestamp is RFC 3339 in UTC with a Z (metav1.Time's
		// encoding), so the strings sort as the times do.
		CreationTimestamp string `json:"creationTimestamp"`
		// Annotations are read by Bounds.annotations, which copies only
		// the values kept: the raw object lives only while its pod is
		// decoded.
		Annotations json.RawMessage `json:"annotations"`
	} `json:"metadata"`
	Spec struct {
		// SchedulerName says which scheduler placed the pod: the
		// allocation annotations of a scheduler are believed only on its
		// own pods.
		SchedulerName  string      `json:"schedulerName"`
		InitContainers []Container `json:"initContainers"`
		Containers     []Container `json:"containers"`
	} `json:"spec"`
	Status struct {
		Phase string `json:"phase"`
		// ExtendedResourceClaimStatus says which container's extended
		// resource a DRA driver's device satisfied (package dra).
		ExtendedResourceClaimStatus *ClaimStatus `json:"extendedResourceClaimStatus"`
	} `json:"status"`
}

// ClaimStatus is a pod's status.extendedResourceClaimStatus.
type ClaimStatus struct {
	ResourceClaimName string           `json:"resourceClaimName"`
	RequestMappings   []RequestMapping `json:"requestMappings"`
}

// RequestMapping is one of ClaimStatus's request mappings.
type RequestMapping struct {
	ContainerName string `json:"containerName"`
	ResourceName  string `json:"resourceName"`
	RequestName   string `json:"requestName"`
}

// Container is the part of a container that podres-proxy keeps.
type Container struct {
	Name string `json:"name"`
	// RestartPolicy "Always" on an init container makes it a sidecar.
	RestartPolicy string `json:"restartPolicy"`
	Resources     struct {
		// Quantities are kept as the strings the API server wrote.
		Limits   map[string]string `json:"limits"`
		Requests map[string]string `json:"requests"`
	} `json:"resources"`
}

// DecodeFrom decodes a /pods answer from a stream into KubeletPods, oldest
// first (see kubeletpods.Client.Pods), as decodePodStream does; b says what
// it keeps of each live pod's annotations and bounds what it keeps in all.
// It never panics: the decoder is third-party code with unsafe fast paths,
// and a strange answer from the kubelet must cost one failed read, not the
// node daemon.
func DecodeFrom(r io.Reader, b Bounds) (pods []model.KubeletPod, err error) {
	defer func() {
		if p := recover(); p != nil {
			pods, err = nil, fmt.Errorf("decode kubelet pods: decoder panicked: %v", p)
		}
	}()
	return decodePodStream(r, b)
}

// errTooMuchKept is the error of an answer whose live pods keep more than
// the decoder may hold.
var errTooMuchKept = errors.New("the pods' annotations and container resources are larger than the limit")

// decodePodStream decodes a /pods answer one pod at a time, so that memory
// holds one pod's JSON (in the decoder's buffer) and what is kept of the
// pods before it, never the whole answer: a /pods of tens of MiB (finished
// pods with large environments stay listed until deleted, and each pod
// may carry 256 KiB of annotations) must not take the daemon's memory.
// Finished pods (Succeeded, Failed) keep only their identity and phase,
// which PodList.Lookup needs to prefer a live pod of the same name; their
// annotations and containers are dropped as soon as the pod is decoded.
// Of the other pods' annotations only those b keeps are kept, each within
// its bound and each pod's within b.Pod; b.Kept bounds the bytes of
// annotations and container resources kept in all.
func decodePodStream(r io.Reader, b Bounds) ([]model.KubeletPod, error) {
	dec := json.NewDecoder(r)
	if err := expectDelim(dec, '{'); err != nil {
		return nil, err
	}
	var kind string
	var pods []kept
	var keptBytes int64
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, fmt.Errorf("decode kubelet pods: %w", err)
		}
		key, ok := tok.(string)
		if !ok {
			return nil, fmt.Errorf("decode kubelet pods: unexpected %v for a key", tok)
		}
		switch key {
		case "kind":
			err = dec.Decode(&kind)
		case "items":
			err = decodeItems(dec, &pods, b, &keptBytes)
		default:
			var skip json.RawMessage // apiVersion and metadata: a few bytes
			err = dec.Decode(&skip)
		}
		if err != nil {
			if errors.Is(err, errTooMuchKept) {
				return nil, fmt.Errorf("decode kubelet pods: %w (%d bytes)", err, b.Kept)
			}
			return nil, fmt.Errorf("decode kubelet pods: %s: %w", key, err)
		}
	}
	if err := expectDelim(dec, '}'); err != nil {
		return nil, err
	}
	if tok, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("decode kubelet pods: data after the answer (%v, %v)", tok, err)
	}
	return finish(kind, pods)
}

// kept is what is kept of one pod, and when it was created, to sort by.
type kept struct {
	created string
	pod     model.KubeletPod
}

// decodeItems decodes the items array (or null) one pod at a time into
// pods; keptBytes counts what they keep.
func decodeItems(dec *json.Decoder, pods *[]kept, b Bounds, keptBytes *int64) error {
	tok, err := dec.Token()
	if err != nil {
		return err
	}
	if tok == nil {
		return nil // null: no pods
	}
	if d, ok := tok.(json.Delim); !ok || d != '[' {
		return fmt.Errorf("want an array, got %v", tok)
	}
	for dec.More() {
		var p Pod
		if err := dec.Decode(&p); err != nil {
			return fmt.Errorf("item %d: %w", len(*pods), err)
		}
		kp, err := p.kubeletPod(&b)
		if err != nil {
			return fmt.Errorf("item %d: %w", len(*pods), err)
		}
		if b.Kept > 0 {
			if *keptBytes += size(&kp); *keptBytes > b.Kept {
				return errTooMuchKept
			}
		}
		*pods = append(*pods, kept{p.Metadata.CreationTimestamp, kp})
	}
	_, err = dec.Token() // ]
	return err
}

// size is about the bytes p keeps, to bound what an answer keeps.
func size(p *model.KubeletPod) int64 {
	n := int64(len(p.UID) + len(p.Namespace) + len(p.Name) + len(p.Phase))
	for k, v := range p.Annotations {
		n += int64(len(k) + len(v))
	}
	for _, c := range p.Spec.Containers {
		n += int64(len(c.Name))
		for k, v := range c.Requests {
			n += int64(len(k) + len(v))
		}
	}
	if e := p.ExtendedResourceClaim; e != nil {
		n += int64(len(e.ClaimName))
		for _, r := range e.Requests {
			n += int64(len(r.Container) + len(r.Resource) + len(r.Request))
		}
	}
	return n
}

func expectDelim(dec *json.Decoder, want json.Delim) error {
	tok, err := dec.Token()
	if err != nil {
		return fmt.Errorf("decode kubelet pods: %w", err)
	}
	if d, ok := tok.(json.Delim); !ok || d != want {
		return fmt.Errorf("decode kubelet pods: want %q, got %v", want, tok)
	}
	return nil
}

// kubeletPod keeps what podres-proxy needs of p (Model) and, of a live
// pod, the annotations b keeps.
func (p *Pod) kubeletPod(b *Bounds) (model.KubeletPod, error) {
	kp := p.Model()
	if kp.Terminal() {
		return kp, nil
	}
	ann, err := b.annotations(p.Metadata.Annotations)
	if err != nil {
		return model.KubeletPod{}, err
	}
	kp.Annotations = ann
	return kp, nil
}

// Model keeps what podres-proxy needs of p but its annotations, which each
// source bounds as it reads them: of a finished (Succeeded or Failed) pod
// only its identity and phase (the kubelet lists finished pods until they
// are deleted, and PodResources never reports them), of a live one also
// its scheduler's name, each container's kind and extended resources, and
// which container's extended resource a DRA claim satisfies.
func (p *Pod) Model() model.KubeletPod {
	kp := model.KubeletPod{
		UID:       p.Metadata.UID,
		Namespace: p.Metadata.Namespace,
		Name:      p.Metadata.Name,
		Phase:     p.Status.Phase,
	}
	if kp.Terminal() {
		return kp
	}
	specs := make([]model.ContainerSpec, 0, len(p.Spec.InitContainers)+len(p.Spec.Containers))
	for j := range p.Spec.InitContainers {
		c := &p.Spec.InitContainers[j]
		kind := model.KindInit
		if c.RestartPolicy == "Always" {
			kind = model.KindSidecar
		}
		specs = append(specs, containerSpec(c, kind))
	}
	for j := range p.Spec.Containers {
		specs = append(specs, containerSpec(&p.Spec.Containers[j], model.KindApp))
	}
	kp.Spec = model.PodSpec{SchedulerName: p.Spec.SchedulerName, Containers: specs}
	if e := p.Status.ExtendedResourceClaimStatus; e != nil && e.ResourceClaimName != "" {
		kp.ExtendedResourceClaim = &model.ExtendedResourceClaim{ClaimName: e.ResourceClaimName}
		for _, m := range e.RequestMappings {
			kp.ExtendedResourceClaim.Requests = append(kp.ExtendedResourceClaim.Requests,
				model.ExtendedResourceRequest{Container: m.ContainerName, Resource: m.ResourceName, Request: m.RequestName})
		}
	}
	return kp
}

// finish checks the decoded pods and sorts them.
func finish(kind string, items []kept) ([]model.KubeletPod, error) {
	if kind != "PodList" {
		return nil, fmt.Errorf("decode kubelet pods: answer is not a PodList (kind %q)", kind)
	}
	for i := range items {
		p := &items[i].pod
		if p.UID == "" || p.Namespace == "" || p.Name == "" {
			return nil, fmt.Errorf("decode kubelet pods: item %d has no uid, namespace or name (uid %q, %s/%s)",
				i, p.UID, p.Namespace, p.Name)
		}
	}
	// The kubelet lists pods from a map, in no order. Sorting by creation
	// makes "the last of several pods with one name" mean "the newest",
	// which PodList.Lookup relies on.
	slices.SortStableFunc(items, func(a, b kept) int {
		return cmp.Compare(a.created, b.created)
	})
	pods := make([]model.KubeletPod, len(items))
	for i := range items {
		pods[i] = items[i].pod
	}
	return pods, nil
}

// containerSpec keeps the extended resources of c: limits where set, else
// requests (for extended resources the API server makes them equal, or
// copies limits into requests when only limits were given).
func containerSpec(c *Container, kind model.ContainerKind) model.ContainerSpec {
	var reqs map[string]string
	add := func(from map[string]string) {
		for name, q := range from {
			if !model.ExtendedResource(name) {
				continue
			}
			if reqs == nil {
				reqs = make(map[string]string, len(from))
			}
			reqs[name] = q
		}
	}
	add(c.Resources.Requests)
	add(c.Resources.Limits) // after requests, so that limits win
	return model.ContainerSpec{Name: c.Name, Kind: kind, Requests: reqs}
}
