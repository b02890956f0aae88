package proxy_test

import (
	"net"
	"os"
	"testing"
	"time"

	v1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/podres-proxy/podres-proxy/internal/unixsock"
	"github.com/podres-proxy/podres-proxy/test/poll"
)

// The new instance of a rolling update renames its socket over the old
// one's path. While it answers there, the old instance leaves the path to
// it; when it stops answering (it crashed, or a broken version was rolled
// out and died), the old instance, still running, serves the path again, so
// that the node keeps an answering socket until the new one is back.
func TestTheOldInstanceServesThePathAgainWhenTheNewOneStopsAnswering(t *testing.T) {
	h := newHarness(t)
	newer, err := unixsock.Listen(h.socket, "")
	if err != nil {
		t.Fatal(err)
	}
	accepted := make(chan struct{}, 1)
	go func() {
		for {
			c, err := newer.Accept()
			if err != nil {
				return
			}
			c.Close()
			select {
			case accepted <- struct{}{}:
			default:
			}
		}
	}()
	if !unixsock.Answers(h.socket, time.Second) {
		t.Fatal("the newer instance does not answer on the path it took")
	}
	<-accepted
	// An absence can only be seen by waiting: two of the old instance's
	// checks, while the newer one answers.
	time.Sleep(2500 * time.Millisecond)
	if fi, err := os.Lstat(h.socket); err != nil || !newer.Owned() {
		t.Fatalf("the old instance took the path back from an instance that answers there (%v, %v)", fi, err)
	}

	// The newer instance dies as a SIGKILL leaves it: its socket file stays,
	// nothing listens behind it.
	if err := newer.Listener.(*net.UnixListener).Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(h.socket); err != nil {
		t.Fatalf("the dead instance's socket file should stay: %v", err)
	}
	poll.Until(t, "the old instance to serve the path again", func() bool {
		_, err := h.v1().List(ctx(t), &v1.ListPodResourcesRequest{})
		return err == nil
	})
}
