package podsapi

import (
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
)

// The wait between watch attempts must grow to its cap and stay there: a
// kubelet that stays away must not be called at the initial pace forever.
func TestBackoffGrowsToItsCapAndStays(t *testing.T) {
	s, err := New(Options{Socket: "/nonexistent/pods-api.sock", Backoff: wait.Backoff{Duration: time.Millisecond, Factor: 2, Cap: 8 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	bo := s.backoff
	var got []time.Duration
	for range 7 {
		got = append(got, bo.Step())
	}
	want := []time.Duration{1, 2, 4, 8, 8, 8, 8}
	for i := range want {
		if got[i] != want[i]*time.Millisecond {
			t.Fatalf("delays %v, want %v ms", got, want)
		}
	}

	d, err := New(Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	bo = d.backoff
	var last time.Duration
	for range 20 {
		last = bo.Step()
	}
	if last < DefaultBackoff.Cap || last > DefaultBackoff.Cap*12/10 {
		t.Errorf("default delay after 20 attempts is %v, want %v with jitter", last, DefaultBackoff.Cap)
	}
}
