package state

import (
	"testing"
	"time"

	"github.com/podres-proxy/podres-proxy/model"
	"github.com/podres-proxy/podres-proxy/state/record"
)

// slowDecoder is a decoder whose every Decode waits until released, as a
// hostile pod's huge annotation would keep it busy.
type slowDecoder struct {
	fakeDecoder
	entered chan struct{}
	release chan struct{}
}

func (d *slowDecoder) Decode(ref model.PodRef, ann map[string]string) ([]model.Device, []error) {
	d.entered <- struct{}{}
	<-d.release
	return d.fakeDecoder.Decode(ref, ann)
}

// hangGuard bounds the wait for an event a regression would never produce;
// it measures nothing.
const hangGuard = 30 * time.Second

func TestDecodingDoesNotHoldTheStoresLock(t *testing.T) {
	dec := &slowDecoder{entered: make(chan struct{}), release: make(chan struct{})}
	s := New(Options{Decoder: dec})
	s.ObserveSandbox(record.OriginNRI, readySandbox("u-other", "ns", "other", "sb0", nil))
	for _, observe := range []struct {
		name string
		do   func()
	}{
		{"ObserveSandbox", func() {
			s.ObserveSandbox(record.OriginNRI, readySandbox("u1", "ns", "big", "sb1", map[string]string{"alloc/gpu": "G1"}))
		}},
		{"ObserveKubeletPods", func() {
			s.ObserveKubeletPods(time.Now(), []model.KubeletPod{{UID: "u2", Namespace: "ns", Name: "new", Phase: "Pending",
				Annotations: map[string]string{"alloc/gpu": "G2"}}})
		}},
		{"Reconcile", func() {
			s.Reconcile(record.OriginCRI, time.Now(), []model.Sandbox{
				readySandbox("u3", "ns", "cri", "sb3", map[string]string{"alloc/gpu": "G3"}),
				readySandbox("u-other", "ns", "other", "sb0", nil),
				readySandbox("u1", "ns", "big", "sb1", map[string]string{"alloc/gpu": "G1"}),
				readySandbox("u2", "ns", "new", "sb2", map[string]string{"alloc/gpu": "G2"}),
			}, nil, false)
		}},
	} {
		done := make(chan struct{})
		go func() { observe.do(); close(done) }()
		<-dec.entered // decoding now
		read := make(chan bool)
		go func() {
			_, ok := s.Live(model.PodKey{Namespace: "ns", Name: "other"})
			read <- ok
		}()
		select {
		case ok := <-read:
			if !ok {
				t.Errorf("%s: the live pod was not found while another decoded", observe.name)
			}
		case <-time.After(hangGuard):
			t.Fatalf("%s: a reader waited for a decoding: it holds the store's lock", observe.name)
		}
		close(dec.release)
		<-done
		dec.release = make(chan struct{})
	}
	if n := s.decodedUnderLock; n != 0 {
		t.Errorf("%d decodings under the lock", n)
	}
	for _, uid := range []string{"u1", "u2", "u3"} {
		if r := mustGet(t, s, uid); len(r.Devices) != 1 {
			t.Errorf("%s: devices %+v, want the decoded one", uid, r.Devices)
		}
	}
}
