package informer

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
)

// A list of more pages than MaxPages fails, and Wait says so at once; a
// list that succeeds later clears the error.
func TestAListPastItsPagesFailsAndWaitSaysSo(t *testing.T) {
	pages := 3
	calls := 0
	relisted := make(chan struct{})
	inf := New(Options{
		List: func(_ context.Context, o metav1.ListOptions) (runtime.Object, error) {
			calls++
			page, _ := strconv.Atoi(o.Continue)
			l := &unstructured.UnstructuredList{Object: map[string]any{"apiVersion": "v1", "kind": "List"}}
			l.SetResourceVersion("1")
			if page+1 < pages {
				l.SetContinue(strconv.Itoa(page + 1))
			}
			if calls == 3 { // the first list failed at its third page
				pages = 1
				close(relisted)
			}
			return l, nil
		},
		Watch: func(ctx context.Context, _ metav1.ListOptions) (watch.Interface, error) {
			return watch.NewFake(), nil
		},
		Object:   &unstructured.Unstructured{},
		MaxPages: 2,
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = inf.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	wctx, wcancel := context.WithTimeout(ctx, 5*time.Second)
	defer wcancel()
	if err := inf.Wait(wctx); err == nil || !strings.Contains(err.Error(), "more than 2 pages") {
		t.Fatalf("Wait: %v, want the pages' bound", err)
	}
	<-relisted
	for {
		changed := inf.Changed()
		if inf.Err() == nil {
			break
		}
		select {
		case <-changed:
		case <-wctx.Done():
			t.Fatal("the good list's outcome was not recorded")
		}
	}
	if err := inf.Wait(wctx); err != nil {
		t.Fatalf("Wait after a good list: %v", err)
	}
}
