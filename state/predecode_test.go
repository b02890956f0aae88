package state

import (
	"sync"
	"testing"
	"time"

	"github.com/podres-proxy/podres-proxy/model"
	"github.com/podres-proxy/podres-proxy/state/record"
)

// readingDecoder is a decoder that, in every Decode, checks that a reader
// can still look a live pod up: a decoding done with the store's lock held
// (a hostile pod's huge annotation keeping it busy) would make that reader
// wait for it.
type readingDecoder struct {
	fakeDecoder
	s *Store

	mu      sync.Mutex
	blocked []string // pods whose decoding kept a reader out
}

// hangGuard bounds the wait for a reader that a regression would block
// until the decoding returns; it measures nothing.
const hangGuard = 30 * time.Second

func (d *readingDecoder) Decode(ref model.PodRef, ann map[string]string) ([]model.Device, []error) {
	read := make(chan bool, 1)
	go func() {
		_, ok := d.s.Snapshot().Live(model.PodKey{Namespace: "ns", Name: "other"})
		read <- ok
	}()
	select {
	case ok := <-read:
		if !ok {
			d.note(ref.Name + " (the live pod was not found)")
		}
	case <-time.After(hangGuard):
		d.note(ref.Name)
	}
	return d.fakeDecoder.Decode(ref, ann)
}

func (d *readingDecoder) note(name string) {
	d.mu.Lock()
	d.blocked = append(d.blocked, name)
	d.mu.Unlock()
}

func TestDecodingDoesNotHoldTheStoresLock(t *testing.T) {
	dec := &readingDecoder{}
	s := New(Options{Decoder: dec})
	dec.s = s
	s.ObserveSandbox(record.OriginNRI, readySandbox("u-other", "ns", "other", "sb0", nil))
	s.ObserveSandbox(record.OriginNRI, readySandbox("u1", "ns", "big", "sb1", map[string]string{"alloc/gpu": "G1"}))
	s.ObserveKubeletPods(time.Now(), nil, []model.KubeletPod{{UID: "u2", Namespace: "ns", Name: "new", Phase: "Pending",
		Annotations: map[string]string{"alloc/gpu": "G2"}}, {UID: "u-other", Namespace: "ns", Name: "other", Phase: "Running"}})
	s.Reconcile(record.OriginCRI, time.Now(), []model.Sandbox{
		readySandbox("u3", "ns", "cri", "sb3", map[string]string{"alloc/gpu": "G3"}),
		readySandbox("u-other", "ns", "other", "sb0", nil),
		readySandbox("u1", "ns", "big", "sb1", map[string]string{"alloc/gpu": "G1"}),
		readySandbox("u2", "ns", "new", "sb2", map[string]string{"alloc/gpu": "G2"}),
	}, nil, false)
	if dec.Calls() < 3 {
		t.Fatalf("%d decodings, want one per pod with annotations at least", dec.Calls())
	}
	if len(dec.blocked) != 0 {
		t.Errorf("decoding %v kept a reader waiting: it held the store's lock", dec.blocked)
	}
	for _, uid := range []string{"u1", "u2", "u3"} {
		if r := mustGet(t, s, uid); len(r.Devices) != 1 {
			t.Errorf("%s: devices %+v, want the decoded one", uid, r.Devices)
		}
	}
}
