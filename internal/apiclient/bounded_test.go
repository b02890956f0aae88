package apiclient

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"k8s.io/client-go/rest"
)

// An answer of exactly the bound is read; one byte more fails, naming the
// bound; a watch has a bound of its own.
func TestBoundedCutsAnswersPastTheirBound(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, _ := strconv.Atoi(r.URL.Query().Get("n"))
		_, _ = w.Write([]byte(strings.Repeat("x", n)))
	}))
	defer srv.Close()
	cfg := Bounded(&rest.Config{Host: srv.URL}, 100, 1000)
	rt, err := rest.TransportFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	read := func(query string) (int, error) {
		req, _ := http.NewRequest(http.MethodGet, srv.URL+"/x?"+query, nil)
		resp, err := rt.RoundTrip(req)
		if err != nil {
			return 0, err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return len(b), err
	}
	for query, ok := range map[string]bool{"n=100": true, "n=101": false, "n=1000&watch=true": true, "n=1001&watch=true": false} {
		n, err := read(query)
		if ok && err != nil {
			t.Errorf("%s: %v", query, err)
		}
		if !ok && !errors.Is(err, ErrTooLarge) {
			t.Errorf("%s: read %d bytes, error %v; want ErrTooLarge", query, n, err)
		}
	}
}
