// Package binder is a test scheduler that places pods the way Koordinator's
// koord-scheduler does for devices: for each pending pod whose
// spec.schedulerName is its name, it picks devices for what the pod's
// containers request, writes them into the pod's
// scheduling.koordinator.sh/device-allocated annotation (Koordinator's
// PreBind patches the pod), and only then binds the pod to the node
// (pods/binding). So the allocation is on the pod before the kubelet ever
// sees it, as in a Koordinator cluster; nothing else of Koordinator runs.
//
// Devices are made up, never reused: every RDMA request gets new VFs of one
// PF (PCI addresses 0000:3b:00.2, .3, ... then 0000:3b:01.0, ...), every GPU
// request a new UUID, so a pod recreated under the same name (a StatefulSet's)
// gets a different allocation than its predecessor.
package binder

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
)

// Annotation is Koordinator's allocation annotation.
const Annotation = "scheduling.koordinator.sh/device-allocated"

// Resources the binder allocates devices for.
const (
	RDMAResource    = "koordinator.sh/rdma"
	GPUCoreResource = "koordinator.sh/gpu-core"
	NvidiaGPU       = "nvidia.com/gpu"
)

// PF is the PCI address of the made-up RDMA NIC whose VFs are handed out.
const PF = "0000:3b:00.0"

// Binder binds pods of one scheduler name to one node.
type Binder struct {
	Client        kubernetes.Interface
	SchedulerName string
	NodeName      string

	mu      sync.Mutex
	nextVF  int
	nextGPU int
	// Allocations maps a pod's UID to the annotation it was given.
	allocations map[types.UID]string
}

// Allocation returns the annotation the binder wrote on the pod with uid.
func (b *Binder) Allocation(uid types.UID) (string, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	a, ok := b.allocations[uid]
	return a, ok
}

// Run binds pending pods until ctx ends, re-watching after errors. It
// returns ctx's error.
func (b *Binder) Run(ctx context.Context) error {
	for ctx.Err() == nil {
		if err := b.watchOnce(ctx); err != nil && ctx.Err() == nil {
			// A closed watch or an unreachable API server: start over.
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
		}
	}
	return ctx.Err()
}

// watchOnce lists the pending pods, binds them, then watches for more.
func (b *Binder) watchOnce(ctx context.Context) error {
	sel := fields.AndSelectors(
		fields.OneTermEqualSelector("spec.schedulerName", b.SchedulerName),
		fields.OneTermEqualSelector("spec.nodeName", ""),
	).String()
	list, err := b.Client.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: sel})
	if err != nil {
		return fmt.Errorf("listing pending pods: %w", err)
	}
	for i := range list.Items {
		b.bindLogged(ctx, &list.Items[i])
	}
	w, err := b.Client.CoreV1().Pods("").Watch(ctx, metav1.ListOptions{FieldSelector: sel, ResourceVersion: list.ResourceVersion})
	if err != nil {
		return fmt.Errorf("watching pending pods: %w", err)
	}
	defer w.Stop()
	for ev := range w.ResultChan() {
		if ev.Type != watch.Added && ev.Type != watch.Modified {
			continue
		}
		if pod, ok := ev.Object.(*corev1.Pod); ok && pod.DeletionTimestamp == nil {
			b.bindLogged(ctx, pod)
		}
	}
	return fmt.Errorf("watch closed")
}

func (b *Binder) bindLogged(ctx context.Context, pod *corev1.Pod) {
	if err := b.Bind(ctx, pod); err != nil && ctx.Err() == nil {
		fmt.Printf("binder: %s/%s: %v\n", pod.Namespace, pod.Name, err)
	}
}

// Bind allocates devices for pod, patches the allocation annotation onto it
// (when it requests devices), then binds it to the node.
func (b *Binder) Bind(ctx context.Context, pod *corev1.Pod) error {
	if pod.Spec.NodeName != "" {
		return nil
	}
	ann, err := b.allocate(pod)
	if err != nil {
		return err
	}
	if ann != "" {
		patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{Annotation: ann}}})
		if err != nil {
			return err
		}
		if _, err := b.Client.CoreV1().Pods(pod.Namespace).Patch(ctx, pod.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			return fmt.Errorf("patching the allocation (PreBind): %w", err)
		}
	}
	binding := &corev1.Binding{
		ObjectMeta: metav1.ObjectMeta{Name: pod.Name, Namespace: pod.Namespace, UID: pod.UID},
		Target:     corev1.ObjectReference{Kind: "Node", Name: b.NodeName},
	}
	if err := b.Client.CoreV1().Pods(pod.Namespace).Bind(ctx, binding, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("binding to %s: %w", b.NodeName, err)
	}
	return nil
}

// allocate returns the annotation for pod ("" when it requests no devices),
// the same one on every call for the same pod UID.
func (b *Binder) allocate(pod *corev1.Pod) (string, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if a, ok := b.allocations[pod.UID]; ok {
		return a, nil
	}
	var vfs, gpus int64
	count := func(c corev1.Container) {
		for name, q := range c.Resources.Limits {
			switch name {
			case RDMAResource:
				vfs += q.Value()
			case NvidiaGPU:
				gpus += q.Value()
			case GPUCoreResource:
				gpus += (q.Value() + 99) / 100
			}
		}
	}
	for _, c := range pod.Spec.InitContainers {
		count(c)
	}
	for _, c := range pod.Spec.Containers {
		count(c)
	}
	type vf struct {
		Minor int    `json:"minor"`
		BusID string `json:"busID"`
	}
	alloc := map[string][]map[string]any{}
	if vfs > 0 {
		var list []vf
		for range vfs {
			list = append(list, vf{Minor: b.nextVF, BusID: vfAddress(b.nextVF)})
			b.nextVF++
		}
		alloc["rdma"] = []map[string]any{{
			"minor": 0, "id": PF, "resources": map[string]string{RDMAResource: "1"},
			"extension": map[string]any{"vfs": list},
		}}
	}
	for range gpus {
		alloc["gpu"] = append(alloc["gpu"], map[string]any{
			"minor": b.nextGPU, "id": GPUUUID(b.nextGPU),
			"resources": map[string]string{GPUCoreResource: "100", "koordinator.sh/gpu-memory-ratio": "100"},
		})
		b.nextGPU++
	}
	ann := ""
	if len(alloc) > 0 {
		data, err := json.Marshal(alloc)
		if err != nil {
			return "", err
		}
		ann = string(data)
	}
	if b.allocations == nil {
		b.allocations = map[types.UID]string{}
	}
	b.allocations[pod.UID] = ann
	return ann, nil
}

// vfAddress is the PCI address of the n-th VF: functions 2..7 of device 0,
// then 0..7 of devices 1, 2, ...
func vfAddress(n int) string {
	slot := n + 2
	return fmt.Sprintf("0000:3b:%02x.%d", slot/8, slot%8)
}

// GPUUUID is the n-th made-up GPU's UUID.
func GPUUUID(n int) string {
	return fmt.Sprintf("GPU-00000000-0000-4000-8000-%012x", n)
}
