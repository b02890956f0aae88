// Package apiauth lets the API server decide who may read an HTTP endpoint
// of the daemon, as the kubelet and kube-rbac-proxy do: the request's bearer
// token is reviewed (a TokenReview says which user it is) and that user is
// asked to be allowed to get the request's path (a SubjectAccessReview of a
// non-resource URL, so RBAC's nonResourceURLs rules decide).
//
// Every input is bounded: the token's size, the reviews in flight at once,
// each review's time, and the cache of decisions (its entries and how long
// each is kept). A review that fails (the API server down or hung) answers
// 503 within the review's time limit and is never cached.
package apiauth

import (
	"cmp"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/sirupsen/logrus"
	authnv1 "k8s.io/api/authentication/v1"
	authzv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"

	"github.com/podres-proxy/podres-proxy/internal/apiclient"
)

// The defaults of Options.
const (
	DefaultTimeout     = 5 * time.Second
	DefaultAllowedTTL  = time.Minute
	DefaultDeniedTTL   = 10 * time.Second
	DefaultCacheSize   = 256
	DefaultMaxInFlight = 4
)

// maxAnswer bounds the API server's answer to a review.
const maxAnswer = 64 << 10

// The reviews' resources.
var (
	tokenReviews         = authnv1.SchemeGroupVersion.WithResource("tokenreviews")
	subjectAccessReviews = authzv1.SchemeGroupVersion.WithResource("subjectaccessreviews")
)

// MaxTokenBytes bounds the bearer token a request may carry; a longer one
// is refused (401) without a review. Service account tokens are about 1 KiB.
const MaxTokenBytes = 8 << 10

// Options bound the reviews and their cache; zero values are the defaults.
type Options struct {
	// Timeout bounds each review (TokenReview, SubjectAccessReview) and the
	// wait for a place among MaxInFlight; default DefaultTimeout.
	Timeout time.Duration
	// AllowedTTL is how long a request's allowed decision is reused for the
	// same token and path; DeniedTTL the same for a refusal (401 or 403),
	// kept shorter so that a newly granted scraper is let in soon.
	AllowedTTL, DeniedTTL time.Duration
	// CacheSize bounds the decisions kept; the least recently used goes
	// first.
	CacheSize int
	// MaxInFlight bounds the reviews sent at once; requests beyond it wait
	// (within Timeout) for a place.
	MaxInFlight int
	// Audiences, when set, are the audiences a token must be for; empty:
	// the API server's own.
	Audiences []string
	// Log receives each review's failure and each fresh refusal (403 at
	// info, 401 at debug); nil: discarded.
	Log logrus.FieldLogger
	// Now is the clock; nil: time.Now.
	Now func() time.Time
}

// Authorizer decides, through the API server, whether a request may be
// served. It is safe for concurrent use.
type Authorizer struct {
	client   *dynamic.DynamicClient
	o        Options
	cache    *cache
	inFlight chan struct{}
}

// New returns an Authorizer that reviews through the API server cfg points
// at (cfg from internal/apiclient). Each review's context carries o.Timeout.
func New(cfg *rest.Config, o Options) (*Authorizer, error) {
	o.Timeout = cmp.Or(o.Timeout, DefaultTimeout)
	o.AllowedTTL = cmp.Or(o.AllowedTTL, DefaultAllowedTTL)
	o.DeniedTTL = cmp.Or(o.DeniedTTL, DefaultDeniedTTL)
	o.CacheSize = cmp.Or(o.CacheSize, DefaultCacheSize)
	o.MaxInFlight = cmp.Or(o.MaxInFlight, DefaultMaxInFlight)
	if o.Timeout < 0 || o.AllowedTTL < 0 || o.DeniedTTL < 0 || o.CacheSize < 0 || o.MaxInFlight < 0 {
		return nil, errors.New("apiauth: negative bound")
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Log == nil {
		l := logrus.New()
		l.Out = io.Discard
		o.Log = l
	}
	client, err := dynamic.NewForConfig(apiclient.Bounded(cfg, maxAnswer, maxAnswer))
	if err != nil {
		return nil, fmt.Errorf("review client: %w", err)
	}
	return &Authorizer{
		client:   client,
		o:        o,
		cache:    newCache(o.CacheSize),
		inFlight: make(chan struct{}, o.MaxInFlight),
	}, nil
}

// Wrap returns a handler that serves next only to GET and HEAD requests
// whose bearer token names a user allowed to get the request's path: 401
// without a valid token, 403 when the user is not allowed, 405 for another
// method, 503 when the API server did not answer within the time limit.
func (a *Authorizer) Wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		code, why := a.Decide(r.Context(), bearer(r), r.URL.Path)
		switch code {
		case http.StatusOK:
			next.ServeHTTP(w, r)
			return
		case http.StatusUnauthorized:
			w.Header().Set("WWW-Authenticate", `Bearer realm="podres-proxy"`)
		case http.StatusServiceUnavailable:
			w.Header().Set("Retry-After", "5")
		}
		http.Error(w, why, code)
	})
}

// Decide returns the status a request with token for path gets (200, 401,
// 403 or 503) and, when not 200, why. Decisions are cached per token and
// path; 503 (no decision) never is.
func (a *Authorizer) Decide(ctx context.Context, token, path string) (int, string) {
	if token == "" {
		return http.StatusUnauthorized, "a bearer token is required"
	}
	if len(token) > MaxTokenBytes {
		return http.StatusUnauthorized, "the bearer token is too long"
	}
	key := cacheKey(token, path)
	now := a.o.Now()
	if d, ok := a.cache.get(key, now); ok {
		return d.code, d.why
	}
	ctx, cancel := context.WithTimeout(ctx, a.o.Timeout)
	defer cancel()
	select {
	case a.inFlight <- struct{}{}:
		defer func() { <-a.inFlight }()
	case <-ctx.Done():
		return http.StatusServiceUnavailable, "too many requests are being reviewed; try again"
	}
	d, err := a.review(ctx, token, path)
	if err != nil {
		a.o.Log.WithError(err).Warn("metrics request: the API server's review failed; answered 503")
		return http.StatusServiceUnavailable, "the API server could not review the request; try again"
	}
	ttl := a.o.DeniedTTL
	switch d.code {
	case http.StatusOK:
		ttl = a.o.AllowedTTL
	case http.StatusForbidden:
		// A known user refused: a scraper without its RBAC grant, which
		// an operator looks for when a target is down. Once per DeniedTTL
		// per token, as the decision is cached.
		a.o.Log.WithField("path", path).Info("metrics request refused (403): " + d.why)
	default:
		a.o.Log.WithField("path", path).Debug("metrics request refused (401): " + d.why)
	}
	a.cache.put(key, d, now.Add(ttl))
	return d.code, d.why
}

// decision is a review's outcome.
type decision struct {
	code int
	why  string
}

// review asks the API server who token is and whether that user may get
// path.
func (a *Authorizer) review(ctx context.Context, token, path string) (decision, error) {
	tr := &authnv1.TokenReview{
		TypeMeta: metav1.TypeMeta{APIVersion: authnv1.SchemeGroupVersion.String(), Kind: "TokenReview"},
		Spec:     authnv1.TokenReviewSpec{Token: token, Audiences: a.o.Audiences},
	}
	if err := a.create(ctx, tokenReviews, tr); err != nil {
		return decision{}, fmt.Errorf("TokenReview: %w", err)
	}
	if !tr.Status.Authenticated || tr.Status.Error != "" {
		return decision{http.StatusUnauthorized, "the bearer token is not valid"}, nil
	}
	if len(a.o.Audiences) > 0 && !intersects(a.o.Audiences, tr.Status.Audiences) {
		return decision{http.StatusUnauthorized, "the bearer token is not for this audience"}, nil
	}
	u := tr.Status.User
	extra := make(map[string]authzv1.ExtraValue, len(u.Extra))
	for k, v := range u.Extra {
		extra[k] = authzv1.ExtraValue(v)
	}
	sar := &authzv1.SubjectAccessReview{
		TypeMeta: metav1.TypeMeta{APIVersion: authzv1.SchemeGroupVersion.String(), Kind: "SubjectAccessReview"},
		Spec: authzv1.SubjectAccessReviewSpec{
			User: u.Username, UID: u.UID, Groups: u.Groups, Extra: extra,
			NonResourceAttributes: &authzv1.NonResourceAttributes{Path: path, Verb: "get"},
		},
	}
	if err := a.create(ctx, subjectAccessReviews, sar); err != nil {
		return decision{}, fmt.Errorf("SubjectAccessReview for %s: %w", u.Username, err)
	}
	if !sar.Status.Allowed || sar.Status.Denied {
		return decision{http.StatusForbidden, fmt.Sprintf("user %q may not get %s", u.Username, path)}, nil
	}
	return decision{http.StatusOK, ""}, nil
}

// create creates review (a pointer to a review with its TypeMeta set) and
// sets it to the API server's answer, its status filled in.
func (a *Authorizer) create(ctx context.Context, res schema.GroupVersionResource, review any) error {
	obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(review)
	if err != nil {
		return err
	}
	out, err := a.client.Resource(res).Create(ctx, &unstructured.Unstructured{Object: obj}, metav1.CreateOptions{})
	if err != nil {
		return err
	}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(out.Object, review); err != nil {
		return fmt.Errorf("the answer: %w", err)
	}
	return nil
}

// bearer returns the request's bearer token, or "".
func bearer(r *http.Request) string {
	scheme, token, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return ""
	}
	return strings.TrimSpace(token)
}

// cacheKey keys a decision by the token's digest (the token itself is not
// kept) and the path.
func cacheKey(token, path string) [sha256.Size]byte {
	return sha256.Sum256([]byte(token + "\x00" + path))
}

func intersects(a, b []string) bool {
	for _, x := range a {
		for _, y := range b {
			if x == y {
				return true
			}
		}
	}
	return false
}
