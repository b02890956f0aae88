// Package poll is the tests' one way to wait for what has no notification
// (a background writer, a reconnect, a file appearing): poll a condition
// until it holds, and fail the test with what was awaited when it does not
// within Timeout.
package poll

import (
	"context"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
)

// Timeout and Interval bound every wait: generous, as the tests run on
// loaded 2-core machines and under the race detector.
const (
	Timeout  = 15 * time.Second
	Interval = 5 * time.Millisecond
)

// Until polls cond until it holds; after Timeout it fails t with "timed out
// waiting for what".
func Until(t testing.TB, what string, cond func() bool) {
	t.Helper()
	UntilWith(t, what, cond, nil)
}

// UntilWith is Until that adds state(), when state is not nil, to the
// failure: what the test was looking at.
func UntilWith(t testing.TB, what string, cond func() bool, state func() string) {
	t.Helper()
	err := wait.PollUntilContextTimeout(context.Background(), Interval, Timeout, true,
		func(context.Context) (bool, error) { return cond(), nil })
	if err == nil {
		return
	}
	if state != nil {
		t.Fatalf("timed out waiting for %s; %s", what, state())
	}
	t.Fatalf("timed out waiting for %s", what)
}
