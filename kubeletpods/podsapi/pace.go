package podsapi

import (
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/util/wait"
)

// initializingBound bounds the wait between watch attempts while the
// kubelet says it is initializing, as a multiple of Options.Backoff's
// Duration (2 s by default).
const initializingBound = 4

// pace decides when Run watches again after a watch ends, and logs and
// counts why it ended. Only Run's goroutine uses it.
//
//   - A watch that had synced and ended (the kubelet dropped a watcher that
//     fell 100 events behind, or is shutting down) is followed at once by
//     the next, as client-go's reflector relists at once: until its relist
//     the view misses what happens, and every fresh read costs a ListPods.
//   - Attempts that fail to sync (no socket: a kubelet without the PodsAPI
//     gate, or one restarting) wait Options.Backoff, growing to its Cap.
//   - Attempts the kubelet refuses with FailedPrecondition ("Kubelet is
//     initializing": v1.37, after every start until its pod sources are
//     ready) wait the backoff's first Duration growing to initializingBound
//     times it, no more: the kubelet is up and seconds from serving, and a
//     grown backoff would leave reads on /pods long after it serves.
type pace struct {
	s            *Source
	failing      wait.Backoff // attempts that failed to sync
	initializing wait.Backoff // attempts refused while the kubelet initializes
	failures     int          // attempts in a row that failed to sync
	refused      bool         // the last attempt was refused as initializing
}

func newPace(s *Source) *pace {
	p := &pace{s: s}
	p.reset()
	return p
}

func (p *pace) reset() {
	p.failing, p.initializing = p.s.backoff, p.initializingBackoff()
	p.failures, p.refused = 0, false
}

// initializingBackoff is Options.Backoff capped at initializingBound times
// its Duration.
func (p *pace) initializingBackoff() wait.Backoff {
	bo := p.s.backoff
	bo.Cap = min(bo.Cap, initializingBound*bo.Duration)
	return bo
}

// next returns how long to wait before the next watch, given how the last
// one ended.
func (p *pace) next(synced bool, err error) time.Duration {
	s := p.s
	s.metrics.PodsAPIReconnect(err)
	switch {
	case synced:
		p.reset()
		s.log.WithError(err).Info("Kubelet Pods API watch ended; watching again at once")
		return 0
	case initializing(err):
		s.metrics.PodsAPIInitializing()
		delay := p.initializing.Step()
		log := s.log.WithError(err).WithField("retryIn", delay.Round(time.Millisecond))
		if !p.refused {
			// Once per initialization, not once per attempt.
			log.Info("Kubelet Pods API: the kubelet is initializing; pods are read from /pods until it serves them")
		} else {
			log.Debug("Kubelet Pods API: the kubelet is still initializing")
		}
		// The kubelet answers: a failure after this is a new one.
		p.failing, p.failures, p.refused = s.backoff, 0, true
		return delay
	}
	p.failures++
	if p.refused {
		// The kubelet went away while initializing: its next
		// initialization starts the bounded pace again.
		p.initializing, p.refused = p.initializingBackoff(), false
	}
	delay := p.failing.Step()
	log := s.log.WithError(err).WithField("retryIn", delay.Round(time.Millisecond))
	if p.failures <= 1 {
		log.Info("Kubelet Pods API watch failed; watching again")
	} else {
		// A kubelet without the PodsAPI feature gate never serves the
		// socket: one line, not one every 30 s forever.
		log.WithField("attempts", p.failures).Debug("Kubelet Pods API watch failed again")
	}
	return delay
}

// initializing reports whether err is the kubelet saying it is not ready
// to serve pods: FailedPrecondition, which v1.37 answers with "Kubelet is
// initializing" and no other way.
func initializing(err error) bool {
	return status.Code(err) == codes.FailedPrecondition
}
