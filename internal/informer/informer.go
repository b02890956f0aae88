// Package informer keeps a bounded local copy of the API server's objects of
// one resource, read by client-go's reflector: one list, in pages, then a
// watch resumed from its resourceVersion, a relist only when the API server
// has forgotten that version. Readers read the copy and never wait on the API server;
// Changed says when to read it again.
//
// A resource the API server does not serve (no DRA API, no Koordinator CRD)
// or forbids is no failure: the reflector retries with its backoff (up to
// 30 s) and Wait reports the list's error at once, so a caller can answer
// without the resource.
package informer

import (
	"cmp"
	"context"
	"fmt"
	"sync"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/cache"
)

// DefaultMaxPages bounds one list: the reflector asks pages of 500 objects.
const DefaultMaxPages = 8

// Options configure an Informer.
type Options struct {
	// List and Watch read the resource, with the caller's selectors added.
	List  func(context.Context, metav1.ListOptions) (runtime.Object, error)
	Watch func(context.Context, metav1.ListOptions) (watch.Interface, error)
	// Object is the type List and Watch return items of.
	Object runtime.Object
	// Transform keeps of each object only what the caller reads, before
	// it is stored; it must pass through what it already returned and a
	// cache.DeletedFinalStateUnknown. It must not fail for an object it
	// cannot read: it keeps the error in what it returns.
	Transform cache.TransformFunc
	// MaxPages bounds a list's pages; 0 means DefaultMaxPages.
	MaxPages int
}

// ListWatch returns the List and Watch of Options for res, each with
// fieldSelector ("" selects every object).
func ListWatch(res dynamic.ResourceInterface, fieldSelector string) (
	func(context.Context, metav1.ListOptions) (runtime.Object, error),
	func(context.Context, metav1.ListOptions) (watch.Interface, error),
) {
	return func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.FieldSelector = fieldSelector
			return res.List(ctx, o)
		}, func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.FieldSelector = fieldSelector
			return res.Watch(ctx, o)
		}
}

// Informer is a local copy of one resource's objects. Its methods are safe
// for concurrent use.
type Informer struct {
	store cache.Store
	ctrl  cache.Controller

	mu      sync.Mutex
	changed chan struct{} // closed at the next change
	listErr error         // the last list's error; nil after a good one
	failed  chan struct{} // closed at a failed list; replaced after a good one
}

// New returns an informer; nothing is read until Run.
func New(o Options) *Informer {
	inf := &Informer{changed: make(chan struct{}), failed: make(chan struct{})}
	pages, maxPages := 0, cmp.Or(o.MaxPages, DefaultMaxPages)
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
			// The reflector's pager asks the pages of one list one after
			// another, the first without a continue token.
			if opts.Continue == "" {
				pages = 0
			}
			if pages++; pages > maxPages {
				err := fmt.Errorf("the list has more than %d pages", maxPages)
				inf.listed(err)
				return nil, err
			}
			obj, err := o.List(ctx, opts)
			inf.listed(err)
			return obj, err
		},
		WatchFuncWithContext: o.Watch,
	}
	h := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { inf.change() },
		UpdateFunc: func(any, any) { inf.change() },
		DeleteFunc: func(any) { inf.change() },
	}
	inf.store, inf.ctrl = cache.NewInformerWithOptions(cache.InformerOptions{
		ListerWatcher: pagedList{lw},
		ObjectType:    o.Object,
		Handler:       h,
		Transform:     o.Transform,
	})
	return inf
}

// pagedList makes the reflector list in pages rather than ask for the list
// as a watch's first events (watch-list): a list's outcome is then known
// (Wait, Err), and its pages bounded in number.
type pagedList struct{ *cache.ListWatch }

func (pagedList) IsWatchListSemanticsUnSupported() bool { return true }

// listed records a list's outcome.
func (inf *Informer) listed(err error) {
	inf.mu.Lock()
	defer inf.mu.Unlock()
	if err == nil {
		if inf.listErr != nil {
			inf.failed = make(chan struct{})
			close(inf.changed) // Err changed
			inf.changed = make(chan struct{})
		}
		inf.listErr = nil
		return
	}
	if inf.listErr == nil {
		close(inf.failed)
	}
	inf.listErr = err
	close(inf.changed)
	inf.changed = make(chan struct{})
}

func (inf *Informer) change() {
	inf.mu.Lock()
	defer inf.mu.Unlock()
	close(inf.changed)
	inf.changed = make(chan struct{})
}

// Run lists and watches until ctx is done.
func (inf *Informer) Run(ctx context.Context) error {
	inf.ctrl.RunWithContext(ctx)
	return nil
}

// Synced reports whether the first list has been stored.
func (inf *Informer) Synced() bool { return inf.ctrl.HasSynced() }

// Objects returns the stored objects, as Transform returned them.
func (inf *Informer) Objects() []any { return inf.store.List() }

// Changed returns a channel closed at the next change of the stored objects
// or a failed list.
func (inf *Informer) Changed() <-chan struct{} {
	inf.mu.Lock()
	defer inf.mu.Unlock()
	return inf.changed
}

// Err returns the last list's error, nil after a good one.
func (inf *Informer) Err() error {
	inf.mu.Lock()
	defer inf.mu.Unlock()
	return inf.listErr
}

// Wait returns nil once the first list is stored, a failed list's error
// as soon as a list fails before that, or ctx's error.
func (inf *Informer) Wait(ctx context.Context) error {
	synced := inf.ctrl.HasSyncedChecker().Done()
	for {
		if inf.Synced() {
			return nil
		}
		inf.mu.Lock()
		failed, err := inf.failed, inf.listErr
		inf.mu.Unlock()
		if err != nil {
			return err
		}
		select {
		case <-synced:
			return nil
		case <-failed:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
