package podsjson

import (
	"bytes"
	stdjson "encoding/json"
	"errors"
	"fmt"
	"unicode/utf8"

	json "github.com/goccy/go-json"

	"github.com/podres-proxy/podres-proxy/model/annotationbound"
)

// Bounds say which annotations a decode keeps of each live pod and how
// large they may be (annotationbound.Bounds: the rule every pod source
// applies), and how much a whole answer may keep. A pod's annotations are
// the one part of /pods a tenant writes freely, and every other tenant's
// new pod waits on the same read, so what one pod's annotations may cost
// is bounded here rather than by the answer: an annotation over its bound
// is replaced by model.OversizedAnnotation (its allocator then refuses it
// as malformed, on that pod only) and the read goes on.
type Bounds struct {
	annotationbound.Bounds
	// Kept bounds the bytes of annotations and container resources the
	// whole answer keeps of its live pods; an answer over it fails the
	// read. 0 means no bound.
	Kept int64
}

// errNotString is the error of an annotation whose value is not a string.
var errNotString = errors.New("annotation value is not a string")

// annotations reads a pod's metadata.annotations as the answer encodes it
// (a JSON object of strings, or null) and returns those b keeps. Values of
// the keys b skips are scanned past, never unescaped or kept: a kubectl
// last-applied-configuration or a tenant's padding costs the scan, not
// memory. Nor are the values of kept keys over their bound. The only copy
// of them is the one go-json makes of the pod's whole annotations object,
// which lives while the pod is decoded. Keys come in the order the kubelet
// writes them (sorted), which is the order annotationbound counts them in.
func (b *Bounds) annotations(raw []byte) (map[string]string, error) {
	if len(raw) == 0 {
		return nil, nil // no annotations field
	}
	// The object is checked whole, as encoding/json checks it, so that
	// the walk below need only find where each token ends.
	if !stdjson.Valid(raw) {
		return nil, errors.New("annotations: not valid JSON")
	}
	w := walker{b: raw}
	if w.literal("null") {
		return nil, nil
	}
	if !w.consume('{') {
		return nil, errors.New("annotations: want an object")
	}
	kept := map[string]string{}
	pod := b.NewPod()
	for !w.consume('}') {
		key, err := unquote(w.str())
		if err != nil {
			return nil, err
		}
		w.consume(':')
		var rawValue []byte // nil: null
		if !w.literal("null") {
			if w.peek() != '"' {
				return nil, fmt.Errorf("annotation %q: %w", key, errNotString)
			}
			rawValue = w.str()
		}
		// The value's size as the kubelet's encoder writes it, without
		// the quotes: its bytes, each byte that is not UTF-8 counted as the
		// six of the \ufffd Go's encoder writes for it, as
		// annotationbound.EncodedSize counts it. Counted as one, such a
		// byte decodes to the three of U+FFFD, and a value of them was
		// kept at three times its bound; counted as six, no value decodes
		// to more bytes than its size (an escape decodes to fewer).
		size := 0 // null
		if rawValue != nil {
			size = len(rawValue) - 2 + 5*w.notUTF8
		}
		if keep, marker := pod.Keep(key, size); keep {
			value := marker
			if marker == "" && rawValue != nil {
				if value, err = unquote(rawValue); err != nil {
					return nil, err
				}
			}
			kept[key] = value
		}
		w.consume(',')
	}
	return kept, nil
}

// unquote decodes a JSON string token exactly as the rest of the answer's
// strings are decoded.
func unquote(tok []byte) (string, error) {
	if bytes.IndexByte(tok, '\\') < 0 && printableASCII(tok) {
		return string(tok[1 : len(tok)-1]), nil
	}
	var s string
	if err := json.Unmarshal(tok, &s); err != nil {
		return "", fmt.Errorf("annotations: %w", err)
	}
	return s, nil
}

// printableASCII reports whether tok has only the bytes a JSON string
// needs no decoding for (invalid UTF-8 is decoded to U+FFFD).
func printableASCII(tok []byte) bool {
	for _, c := range tok {
		if c < 0x20 || c >= 0x7f {
			return false
		}
	}
	return true
}

// walker walks a valid JSON object of strings without building anything.
// Each of its steps skips the white space before the token it reads.
type walker struct {
	b []byte
	i int
	// notUTF8 is how many bytes of the last string str returned are not
	// UTF-8.
	notUTF8 int
}

func (w *walker) peek() byte {
	for w.i < len(w.b) {
		switch c := w.b[w.i]; c {
		case ' ', '\t', '\n', '\r':
			w.i++
		default:
			return c
		}
	}
	return 0
}

func (w *walker) consume(c byte) bool {
	if w.peek() == c {
		w.i++
		return true
	}
	return false
}

func (w *walker) literal(lit string) bool {
	w.peek()
	if bytes.HasPrefix(w.b[w.i:], []byte(lit)) {
		w.i += len(lit)
		return true
	}
	return false
}

// str returns the string token at the walker, quotes included, moves past
// it, and counts its bytes that are not UTF-8 in w.notUTF8.
func (w *walker) str() []byte {
	w.peek()
	start := w.i
	w.i++ // the opening quote
	w.notUTF8 = 0
	for {
		c := w.b[w.i]
		w.i++
		switch {
		case c == '"':
			return w.b[start:w.i]
		case c == '\\':
			w.i++ // the escaped byte; a \u's hex digits need no care
		case c >= utf8.RuneSelf:
			// A rune's other bytes are never a quote or a backslash:
			// skipping them skips nothing to look at.
			if r, n := utf8.DecodeRune(w.b[w.i-1:]); r == utf8.RuneError && n == 1 {
				w.notUTF8++
			} else {
				w.i += n - 1
			}
		}
	}
}
