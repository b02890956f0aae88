// Package statetest helps tests of the store's writers (the NRI plugin, the
// CRI reconciler) read what they wrote: wait for a record to change, read a
// pod's phase or a container's state, print the store when a wait fails,
// and decode annotations without a scheduler's format.
package statetest

import (
	"encoding/json"
	"strings"
	"sync"
	"testing"

	"github.com/podres-proxy/podres-proxy/model"
	"github.com/podres-proxy/podres-proxy/state"
	"github.com/podres-proxy/podres-proxy/state/record"
	"github.com/podres-proxy/podres-proxy/test/poll"
)

// Wait waits until cond holds; on timeout it fails t and prints the store.
func Wait(t testing.TB, s *state.Store, what string, cond func() bool) {
	t.Helper()
	poll.UntilWith(t, what, cond, func() string { return "store:\n" + Dump(s) })
}

// Dump is the store's records as indented JSON.
func Dump(s *state.Store) string {
	b, _ := json.MarshalIndent(s.Records(), "", "  ")
	return string(b)
}

// Phase returns the phase of a pod, "" when the store has no record of it.
func Phase(s *state.Store, uid string) record.Phase {
	if r, ok := s.Get(uid); ok {
		return r.State
	}
	return ""
}

// ContainerState returns the state of a container, "" when the store has
// none.
func ContainerState(s *state.Store, uid, id string) model.ContainerState {
	r, ok := s.Get(uid)
	if !ok {
		return ""
	}
	for _, c := range r.Containers {
		if c.ID == id {
			return c.State
		}
	}
	return ""
}

// Decoder keeps annotations under example.com/ and makes each one a
// device. An annotation example.com/hold blocks Decode until Release, so a
// test can hold a writer in the middle of decoding; Held is closed when
// that starts.
type Decoder struct {
	held    chan struct{}
	release chan struct{}
	once    sync.Once
}

// NewDecoder returns a Decoder.
func NewDecoder() *Decoder {
	return &Decoder{held: make(chan struct{}), release: make(chan struct{})}
}

// Relevant implements the store's Decoder.
func (d *Decoder) Relevant(key string) bool { return strings.HasPrefix(key, "example.com/") }

// MaxAnnotationBytes implements the store's Decoder: 64 KiB for each key
// it reads, as an allocation's.
func (d *Decoder) MaxAnnotationBytes(key string) int {
	if d.Relevant(key) {
		return 64 << 10
	}
	return 0
}

// Decode implements the store's Decoder.
func (d *Decoder) Decode(_ model.PodRef, ann map[string]string) ([]model.Device, []error) {
	if _, ok := ann["example.com/hold"]; ok {
		d.once.Do(func() { close(d.held) })
		<-d.release
	}
	var devs []model.Device
	for k, v := range ann {
		devs = append(devs, model.Device{Allocator: "test", Resource: k, IDs: []string{v}})
	}
	return devs, nil
}

// Held is closed when Decode starts holding on example.com/hold.
func (d *Decoder) Held() <-chan struct{} { return d.held }

// Release lets a held Decode go on.
func (d *Decoder) Release() { close(d.release) }
