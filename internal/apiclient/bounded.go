package apiclient

import (
	"errors"
	"fmt"
	"io"
	"net/http"

	"k8s.io/client-go/rest"
)

// Bounded returns a copy of cfg whose answers are bounded: a list's page or
// a get at most list bytes (a larger answer fails), a watch at most watch
// bytes in all (it is ended there, and an informer's reflector watches again from
// its resourceVersion: no relist).
func Bounded(cfg *rest.Config, list, watch int64) *rest.Config {
	c := rest.CopyConfig(cfg)
	c.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(req *http.Request) (*http.Response, error) {
			resp, err := rt.RoundTrip(req)
			if err == nil && resp.Body != nil {
				max := list
				if w := req.URL.Query().Get("watch"); w == "true" || w == "1" {
					max = watch
				}
				resp.Body = &limitedBody{body: resp.Body, left: max, max: max, path: req.URL.Path}
			}
			return resp, err
		})
	})
	return c
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// ErrTooLarge is the error of an answer past Bounded's bound.
var ErrTooLarge = errors.New("the API server's answer is too large")

// limitedBody fails a read past its bound.
type limitedBody struct {
	body      io.ReadCloser
	left, max int64
	path      string
}

func (l *limitedBody) Read(p []byte) (int, error) {
	if l.left <= 0 {
		// One byte more tells a body of exactly the bound from a longer one.
		var one [1]byte
		if _, err := io.ReadFull(l.body, one[:]); err != nil {
			return 0, err
		}
		return 0, fmt.Errorf("%s: %w (more than %d bytes)", l.path, ErrTooLarge, l.max)
	}
	if int64(len(p)) > l.left {
		p = p[:l.left]
	}
	n, err := l.body.Read(p)
	l.left -= int64(n)
	return n, err
}

func (l *limitedBody) Close() error { return l.body.Close() }
