// Package resourceapi keeps what the DRA folding (package dra) needs of the
// API server's resource.k8s.io/v1 objects: this node's ResourceSlices (each
// device's id and NUMA node) and the DeviceClasses (which driver's devices
// are allocatable as which extended resource), each by a watch
// (internal/informer); and reads by name a pod's extended resource
// ResourceClaim (which request got which device).
//
// The watches keep only the fields the folding reads, and at most
// maxDevices devices; what they keep answers while the API server is away.
// docs/dra.md gives the bounds.
package resourceapi

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sirupsen/logrus"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"

	"github.com/podres-proxy/podres-proxy/dra"
	"github.com/podres-proxy/podres-proxy/internal/apiclient"
	"github.com/podres-proxy/podres-proxy/internal/informer"
)

// DefaultTimeout bounds Wait.
const DefaultTimeout = 10 * time.Second

// Bounds on what is read (docs/dra.md): a list's page and its pages, a
// watch's bytes (it is ended there and resumed), one claim, the devices of
// one slice (the API's own bound), the devices kept.
const (
	maxPage         = 4 << 20
	maxPages        = 4
	maxWatch        = 16 << 20
	maxClaim        = 1 << 20
	maxSliceDevices = 128
	maxDevices      = 1 << 16
)

// group is the DRA API's.
var group = schema.GroupVersion{Group: "resource.k8s.io", Version: "v1"}

// Options configure a Source.
type Options struct {
	// Config is the API server's (internal/apiclient).
	Config *rest.Config
	// NodeName is this node's name: only its slices are watched.
	NodeName string
	// Attributes name the id and NUMA attributes; zero means
	// DefaultAttributes.
	Attributes Attributes
	// Timeout bounds Wait; 0 means DefaultTimeout.
	Timeout time.Duration
	Log     logrus.FieldLogger
}

// Source keeps ResourceSlices and DeviceClasses, and reads ResourceClaims.
type Source struct {
	opts    Options
	log     logrus.FieldLogger
	slices  *informer.Informer
	classes *informer.Informer
	claims  dynamic.NamespaceableResourceInterface

	state atomic.Pointer[state]

	mu      sync.Mutex     // guards what follows; serializes rebuild
	kept    map[string]int // devices kept of each slice
	total   int            // their sum
	dropped int            // devices the transform dropped, in all
	logged  string         // the drops last logged
}

// state is what the watches say.
type state struct {
	devices map[dra.DeviceRef]dra.Device
	classes map[string]string // driver: extended resource
}

// New returns a source; nothing is read until Run.
func New(opts Options) (*Source, error) {
	if opts.NodeName == "" {
		return nil, errors.New("DRA source: the node name is required (set NODE_NAME from spec.nodeName)")
	}
	if opts.Config == nil {
		return nil, errors.New("DRA source: no API server configuration")
	}
	opts.Timeout = cmp.Or(opts.Timeout, DefaultTimeout)
	if len(opts.Attributes.ID) == 0 && len(opts.Attributes.NUMA) == 0 {
		opts.Attributes = DefaultAttributes
	}
	// The dynamic client, its objects converted to resource.k8s.io/v1's
	// types: a typed client links every API group's types into the binary
	// (client-go's scheme), 19 MB.
	lists, err := dynamic.NewForConfig(apiclient.Bounded(opts.Config, maxPage, maxWatch))
	if err != nil {
		return nil, fmt.Errorf("DRA source: %w", err)
	}
	gets, err := dynamic.NewForConfig(apiclient.Bounded(opts.Config, maxClaim, maxClaim))
	if err != nil {
		return nil, fmt.Errorf("DRA source: %w", err)
	}
	s := &Source{
		opts:   opts,
		log:    cmp.Or[logrus.FieldLogger](opts.Log, logrus.StandardLogger()),
		claims: gets.Resource(group.WithResource("resourceclaims")),
		kept:   map[string]int{},
	}
	s.state.Store(&state{})
	list, watch := informer.ListWatch(lists.Resource(group.WithResource("resourceslices")), "spec.nodeName="+opts.NodeName)
	s.slices = informer.New(informer.Options{
		List:      list,
		Watch:     watch,
		Object:    &unstructured.Unstructured{},
		Transform: s.trimSlice,
		MaxPages:  maxPages,
	})
	list, watch = informer.ListWatch(lists.Resource(group.WithResource("deviceclasses")), "")
	s.classes = informer.New(informer.Options{
		List:     list,
		Watch:    watch,
		Object:   &unstructured.Unstructured{},
		MaxPages: maxPages,
		Transform: func(obj any) (any, error) {
			u, ok := obj.(*unstructured.Unstructured)
			if !ok {
				return obj, nil
			}
			var c resourcev1.DeviceClass
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &c); err != nil {
				// Kept by name, so that its deletion is seen; it
				// names no extended resource.
				return &resourcev1.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: u.GetName(), ResourceVersion: u.GetResourceVersion()}}, nil
			}
			return trimClass(&c), nil
		},
	})
	return s, nil
}

// trimSlice is the slices' transform: trimSlice, and past maxDevices
// devices kept in all, none more (counted).
func (s *Source) trimSlice(obj any) (any, error) {
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return obj, nil
	}
	sl := &resourcev1.ResourceSlice{}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, sl); err != nil {
		// Kept by name, so that its deletion is seen; it is no node's.
		sl = &resourcev1.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: u.GetName(), ResourceVersion: u.GetResourceVersion()}}
	}
	kept, dropped := trimSlice(sl, s.opts.Attributes)
	s.mu.Lock()
	defer s.mu.Unlock()
	room := maxDevices - (s.total - s.kept[sl.Name])
	if n := len(kept.devices); n > room {
		dropped += n - max(room, 0)
		kept.devices = kept.devices[:max(room, 0)]
	}
	s.total += len(kept.devices) - s.kept[sl.Name]
	s.kept[sl.Name] = len(kept.devices)
	s.dropped += dropped
	return kept, nil
}

// Facts returns what the watches say: the node's devices and the classes'
// extended resources. It never waits.
func (s *Source) Facts() dra.Facts {
	st := s.state.Load()
	return dra.Facts{Devices: st.devices, ClassResources: st.classes}
}

// Run watches the slices and the classes until ctx is done, and makes the
// facts anew at each change.
func (s *Source) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	wg.Go(func() { _ = s.slices.Run(ctx) })
	wg.Go(func() { _ = s.classes.Run(ctx) })
	defer wg.Wait()
	logged := map[string]string{}
	for {
		sc, cc := s.slices.Changed(), s.classes.Changed()
		s.rebuild()
		for resource, inf := range map[string]*informer.Informer{"resourceslices": s.slices, "deviceclasses": s.classes} {
			msg := ""
			if err := inf.Err(); err != nil {
				msg = s.explain("list and watch", resource, err).Error()
			}
			switch {
			case msg == logged[resource]:
			case msg == "":
				s.log.Infof("DRA: %s listed again", resource)
			default:
				s.log.Warnf("DRA: %s; what was read last keeps answering, the watch retries", msg)
			}
			logged[resource] = msg
		}
		select {
		case <-ctx.Done():
			return nil
		case <-sc:
		case <-cc:
		}
	}
}

// Wait returns once both watches have their first lists, at most Timeout:
// serve waits before serving the legacy view, since NFD asks
// GetAllocatableResources once, at its start. It returns a failed list's
// error at once.
func (s *Source) Wait(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, s.opts.Timeout)
	defer cancel()
	if err := s.slices.Wait(ctx); err != nil {
		return s.explain("list and watch", "resourceslices", err)
	}
	if err := s.classes.Wait(ctx); err != nil {
		return s.explain("list and watch", "deviceclasses", err)
	}
	s.rebuild()
	return nil
}

// rebuild makes the facts from what the watches keep.
func (s *Source) rebuild() {
	s.mu.Lock()
	defer s.mu.Unlock()
	objs := s.slices.Objects()
	slices := make([]*slice, 0, len(objs))
	s.kept, s.total = make(map[string]int, len(objs)), 0
	for _, o := range objs {
		if sl, ok := o.(*slice); ok {
			slices = append(slices, sl)
			s.kept[sl.Name] = len(sl.devices)
			s.total += len(sl.devices)
		}
	}
	devices, dropped := nodeDevices(slices, s.opts.NodeName, maxDevices)
	var classes []deviceClass
	for _, o := range s.classes.Objects() {
		if c, ok := o.(*resourcev1.DeviceClass); ok {
			classes = append(classes, classOf(c))
		}
	}
	resources, skipped := classResources(classes)
	if len(skipped) > 0 {
		s.log.WithField("classes", skipped).Debug("DRA: DeviceClasses with an extended resource name whose selectors are not all device.driver == \"...\": their devices are folded when allocated but not listed as allocatable")
	}
	if msg := fmt.Sprint(s.dropped, dropped); (s.dropped > 0 || dropped > 0) && msg != s.logged {
		s.log.WithField("dropped", s.dropped+dropped).Warnf("DRA: node %s's ResourceSlices list more devices than are kept (%d, at most %d a slice): the rest are not folded", s.opts.NodeName, maxDevices, maxSliceDevices)
		s.logged = msg
	}
	s.state.Store(&state{devices: devices, classes: resources})
}

// Allocation reads the ResourceClaim namespace/name's allocation.
func (s *Source) Allocation(ctx context.Context, namespace, name string) (dra.Allocation, error) {
	u, err := s.claims.Namespace(namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, s.explain("get", "resourceclaims", err)
	}
	c := &resourcev1.ResourceClaim{}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, c); err != nil {
		return nil, fmt.Errorf("ResourceClaim %s/%s: %w", namespace, name, err)
	}
	if c.Namespace != namespace || c.Name != name {
		return nil, fmt.Errorf("ResourceClaim %s/%s: got %s/%s", namespace, name, c.Namespace, c.Name)
	}
	alloc, ok := allocationOf(c)
	if !ok {
		return nil, fmt.Errorf("ResourceClaim %s/%s: the claim is not allocated", namespace, name)
	}
	return alloc, nil
}

// explain names the RBAC rule a 403 lacks.
func (s *Source) explain(verbs, resource string, err error) error {
	if apierrors.IsForbidden(err) {
		v := `"list", "watch"`
		if verbs == "get" {
			v = `"get"`
		}
		return fmt.Errorf("%s %s: 403 Forbidden: the service account lacks the RBAC rule {apiGroups: [\"resource.k8s.io\"], resources: [%q], verbs: [%s]} (deploy/components/dra-legacy-view): %w", verbs, resource, resource, v, err)
	}
	return fmt.Errorf("%s %s: %w", verbs, resource, err)
}
