package podsapi

import (
	"errors"
	"fmt"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
	v1 "k8s.io/api/core/v1"

	"github.com/podres-proxy/podres-proxy/model"
	"github.com/podres-proxy/podres-proxy/model/annotationbound"
)

// Defaults for the bounds in Options.
const (
	// DefaultMaxPodBytes bounds the protobuf encoding of one pod. A pod
	// from the API server is stored in etcd, whose default request limit
	// is 1.5 MiB, and the kubelet adds little to it (its own status), so
	// 4 MiB passes every pod a default cluster can hold with room to
	// spare, while keeping what one decode allocates (v1.Pod with all its
	// strings, a few times the encoding) to a bounded, transient amount.
	DefaultMaxPodBytes = 4 << 20
)

// ErrPodTooLarge is the error of a pod refused for its size: its encoding
// is larger than Options.MaxPodBytes. An annotation over its bound does not
// refuse the pod: it is kept as model.OversizedAnnotation, as /pods keeps
// it.
var ErrPodTooLarge = errors.New("pod is larger than the limit")

// decoder turns the kubelet's pod bytes into model.KubeletPods.
type decoder struct {
	maxPod int
	// annotations says which annotations to keep, each within its bound
	// (the zero value keeps every one whole).
	annotations annotationbound.Bounds
}

// decoded is one pod as Source keeps it: the model value, and when the pod
// was created, which orders pods of one name (see view.lookup).
type decoded struct {
	pod     model.KubeletPod
	created time.Time
}

// decode decodes one pod. On error the pod still carries what identity
// could be read (see scanIdentity), so that the caller can tell which pod
// was refused. It never panics: the bytes come from another process, and a
// strange pod must cost that pod, not the daemon.
func (d *decoder) decode(data []byte) (out decoded, err error) {
	defer func() {
		if p := recover(); p != nil {
			out = decoded{pod: scanIdentity(data)}
			err = fmt.Errorf("decode pod: decoder panicked: %v", p)
		}
	}()
	return d.decodeUnsafe(data)
}

// decodeUnsafe is decode without the recover, so that fuzzing finds panics
// instead of hiding them.
func (d *decoder) decodeUnsafe(data []byte) (decoded, error) {
	if len(data) > d.maxPod {
		// Not unmarshalled: that is what the bound is for. The identity
		// is read without decoding the rest.
		return decoded{pod: scanIdentity(data)}, fmt.Errorf("%w: %d bytes of protobuf, more than %d", ErrPodTooLarge, len(data), d.maxPod)
	}
	var p v1.Pod
	if err := p.Unmarshal(data); err != nil {
		return decoded{pod: scanIdentity(data)}, fmt.Errorf("unmarshal v1.Pod: %w", err)
	}
	return d.convert(&p)
}

// convert keeps what allocators and trust need of p, exactly as package
// podsjson does from /pods, so that both sources give equal values for the
// same pod: identity and phase; of a live pod, the annotations d keeps,
// each within its bound and the pod's (annotationbound: a value over them
// is kept as model.OversizedAnnotation, and the pod is answered without
// that allocation, as from /pods), nil when the pod has none, as a JSON
// pod without "annotations" decodes; and each container's kind and
// extended resources, and the scheduler's name. A finished (Succeeded or
// Failed) pod keeps no annotations and no spec, as /pods' decoder
// (podsjson) keeps none: the kubelet lists finished pods until they are
// deleted, and PodResources never reports them.
func (d *decoder) convert(p *v1.Pod) (decoded, error) {
	pod := model.KubeletPod{
		UID:       string(p.UID),
		Namespace: p.Namespace,
		Name:      p.Name,
		Phase:     string(p.Status.Phase),
	}
	out := decoded{pod: pod, created: p.CreationTimestamp.Time}
	if pod.UID == "" || pod.Namespace == "" || pod.Name == "" {
		return out, fmt.Errorf("pod has no uid, namespace or name (uid %q, %s/%s)", pod.UID, pod.Namespace, pod.Name)
	}
	if pod.Terminal() {
		return out, nil
	}
	out.pod.Annotations = d.annotations.Apply(p.Annotations)
	specs := make([]model.ContainerSpec, 0, len(p.Spec.InitContainers)+len(p.Spec.Containers))
	for i := range p.Spec.InitContainers {
		c := &p.Spec.InitContainers[i]
		kind := model.KindInit
		if c.RestartPolicy != nil && *c.RestartPolicy == v1.ContainerRestartPolicyAlways {
			kind = model.KindSidecar
		}
		specs = append(specs, containerSpec(c, kind))
	}
	for i := range p.Spec.Containers {
		specs = append(specs, containerSpec(&p.Spec.Containers[i], model.KindApp))
	}
	out.pod.Spec = model.PodSpec{SchedulerName: p.Spec.SchedulerName, Containers: specs}
	if e := p.Status.ExtendedResourceClaimStatus; e != nil && e.ResourceClaimName != "" {
		out.pod.ExtendedResourceClaim = &model.ExtendedResourceClaim{ClaimName: e.ResourceClaimName}
		for _, m := range e.RequestMappings {
			out.pod.ExtendedResourceClaim.Requests = append(out.pod.ExtendedResourceClaim.Requests,
				model.ExtendedResourceRequest{Container: m.ContainerName, Resource: m.ResourceName, Request: m.RequestName})
		}
	}
	return out, nil
}

// containerSpec keeps c's extended resources, limits where set, else
// requests, each as its quantity's canonical string: what the kubelet's
// JSON encoder writes, and so what podsjson keeps.
func containerSpec(c *v1.Container, kind model.ContainerKind) model.ContainerSpec {
	var reqs map[string]string
	add := func(from v1.ResourceList) {
		for name, q := range from {
			if !model.ExtendedResource(string(name)) {
				continue
			}
			if reqs == nil {
				reqs = make(map[string]string, len(from))
			}
			reqs[string(name)] = q.String()
		}
	}
	add(c.Resources.Requests)
	add(c.Resources.Limits) // after requests, so that limits win
	return model.ContainerSpec{Name: c.Name, Kind: kind, Requests: reqs}
}

// Field numbers of the v1.Pod protobuf encoding (k8s.io/api/core/v1 and
// k8s.io/apimachinery/pkg/apis/meta/v1 generated.proto) that scanIdentity
// reads.
const (
	podMetadataField    = 1 // Pod.metadata
	objectMetaNameField = 1 // ObjectMeta.name
	objectMetaNSField   = 3 // ObjectMeta.namespace
	objectMetaUIDField  = 5 // ObjectMeta.uid
)

// maxIdentityBytes is more than any valid name, namespace or uid (at most
// 253 bytes); scanIdentity ignores longer strings.
const maxIdentityBytes = 1024

// scanIdentity reads a pod's namespace, name and uid from its protobuf
// encoding without decoding the rest: for a pod that is refused (too large,
// or not decodable) so that the refusal can name the pod and Lookup can
// stop answering its name, and for DELETED events, which guarantee nothing
// else. It reads as Unmarshal does (every metadata field in turn, the last
// value of a string winning). Whatever cannot be read is left empty;
// strings longer than any valid name are ignored.
func scanIdentity(data []byte) model.KubeletPod {
	var pod model.KubeletPod
	eachBytesField(data, func(num protowire.Number, meta []byte) {
		if num != podMetadataField {
			return
		}
		eachBytesField(meta, func(num protowire.Number, v []byte) {
			if len(v) > maxIdentityBytes {
				return
			}
			switch num {
			case objectMetaNameField:
				pod.Name = string(v)
			case objectMetaNSField:
				pod.Namespace = string(v)
			case objectMetaUIDField:
				pod.UID = string(v)
			}
		})
	})
	return pod
}

// eachBytesField calls f with each length-delimited field of a protobuf
// message, in order, and stops at the first malformed field.
func eachBytesField(data []byte, f func(num protowire.Number, v []byte)) {
	for len(data) > 0 {
		num, typ, n := protowire.ConsumeTag(data)
		if n < 0 {
			return
		}
		data = data[n:]
		if typ == protowire.BytesType {
			v, m := protowire.ConsumeBytes(data)
			if m < 0 {
				return
			}
			f(num, v)
			data = data[m:]
			continue
		}
		m := protowire.ConsumeFieldValue(num, typ, data)
		if m < 0 {
			return
		}
		data = data[m:]
	}
}

// podRef names a pod for errors and logs, with what is known of it.
func podRef(p *model.KubeletPod) model.PodRef {
	return model.PodRef{UID: p.UID, Namespace: p.Namespace, Name: p.Name}
}
