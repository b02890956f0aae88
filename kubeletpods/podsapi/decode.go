package podsapi

import (
	"errors"
	"fmt"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
	v1 "k8s.io/api/core/v1"

	"github.com/podres-proxy/podres-proxy/kubeletpods/podsjson"
	"github.com/podres-proxy/podres-proxy/model"
	"github.com/podres-proxy/podres-proxy/model/annotationbound"
)

// DefaultMaxPodBytes bounds the protobuf encoding of one pod. A pod from
// the API server is stored in etcd, whose default request limit is
// 1.5 MiB, and the kubelet adds little to it (its own status), so 4 MiB
// passes every pod a default cluster can hold with room to spare, while
// keeping what one decode allocates (v1.Pod with all its strings, a few
// times the encoding) to a bounded, transient amount.
const DefaultMaxPodBytes = 4 << 20

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

// convert keeps what allocators and trust need of p, as package podsjson
// keeps it from /pods (podsjson.Pod.Model), so that both sources give
// equal values for the same pod: the JSON shape holds what is kept, each
// quantity as its canonical string (what the kubelet's JSON encoder
// writes). A live pod's annotations are those d keeps, each within its
// bound and the pod's (annotationbound: a value over them is kept as
// model.OversizedAnnotation), nil when the pod has none, as a JSON pod
// without "annotations" decodes.
func (d *decoder) convert(p *v1.Pod) (decoded, error) {
	var j podsjson.Pod
	j.Metadata.UID, j.Metadata.Namespace, j.Metadata.Name = string(p.UID), p.Namespace, p.Name
	j.Status.Phase = string(p.Status.Phase)
	j.Spec.SchedulerName = p.Spec.SchedulerName
	j.Spec.InitContainers = containers(p.Spec.InitContainers)
	j.Spec.Containers = containers(p.Spec.Containers)
	if e := p.Status.ExtendedResourceClaimStatus; e != nil {
		j.Status.ExtendedResourceClaimStatus = &podsjson.ClaimStatus{ResourceClaimName: e.ResourceClaimName}
		for _, m := range e.RequestMappings {
			j.Status.ExtendedResourceClaimStatus.RequestMappings = append(j.Status.ExtendedResourceClaimStatus.RequestMappings,
				podsjson.RequestMapping{ContainerName: m.ContainerName, ResourceName: m.ResourceName, RequestName: m.RequestName})
		}
	}
	out := decoded{pod: j.Model(), created: p.CreationTimestamp.Time}
	if out.pod.UID == "" || out.pod.Namespace == "" || out.pod.Name == "" {
		return out, fmt.Errorf("pod has no uid, namespace or name (uid %q, %s/%s)", out.pod.UID, out.pod.Namespace, out.pod.Name)
	}
	if !out.pod.Terminal() {
		out.pod.Annotations = d.annotations.Apply(p.Annotations)
	}
	return out, nil
}

// containers puts cs in podsjson's shape.
func containers(cs []v1.Container) []podsjson.Container {
	out := make([]podsjson.Container, len(cs))
	for i := range cs {
		c, o := &cs[i], &out[i]
		o.Name = c.Name
		if c.RestartPolicy != nil {
			o.RestartPolicy = string(*c.RestartPolicy)
		}
		o.Resources.Requests, o.Resources.Limits = quantities(c.Resources.Requests), quantities(c.Resources.Limits)
	}
	return out
}

func quantities(l v1.ResourceList) map[string]string {
	out := make(map[string]string, len(l))
	for name, q := range l {
		out[string(name)] = q.String()
	}
	return out
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
		num, typ, n := protowire.ConsumeField(data)
		if n < 0 {
			return
		}
		if typ == protowire.BytesType {
			_, _, tag := protowire.ConsumeTag(data)
			v, _ := protowire.ConsumeBytes(data[tag:])
			f(num, v)
		}
		data = data[n:]
	}
}

// podRef names a pod for errors and logs, with what is known of it.
func podRef(p *model.KubeletPod) model.PodRef {
	return model.PodRef{UID: p.UID, Namespace: p.Namespace, Name: p.Name}
}
