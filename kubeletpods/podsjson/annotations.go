package podsjson

import (
	"bytes"
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
	s := scanner{b: raw}
	s.space()
	if s.literal("null") {
		s.space()
		if !s.done() {
			return nil, s.errorf("data after null")
		}
		return nil, nil
	}
	if !s.consume('{') {
		return nil, s.errorf("want an object")
	}
	kept := map[string]string{}
	pod := b.NewPod()
	s.space()
	if s.consume('}') {
		return kept, s.end()
	}
	for {
		s.space()
		rawKey, err := s.str()
		if err != nil {
			return nil, err
		}
		key, err := unquote(rawKey)
		if err != nil {
			return nil, err
		}
		s.space()
		if !s.consume(':') {
			return nil, s.errorf("want ':' after annotation %q", key)
		}
		s.space()
		var rawValue []byte // nil: null
		if !s.literal("null") {
			if rawValue, err = s.str(); err != nil {
				if errors.Is(err, errNotString) {
					return nil, fmt.Errorf("annotation %q: %w", key, err)
				}
				return nil, err
			}
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
			size = len(rawValue) - 2 + 5*s.notUTF8
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
		s.space()
		if s.consume(',') {
			continue
		}
		if s.consume('}') {
			return kept, s.end()
		}
		return nil, s.errorf("want ',' or '}' after annotation %q", key)
	}
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

// scanner walks a JSON object of strings without building anything.
type scanner struct {
	b []byte
	i int
	// notUTF8 is how many bytes of the last string str returned are not
	// UTF-8.
	notUTF8 int
}

func (s *scanner) space() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

func (s *scanner) done() bool { return s.i == len(s.b) }

func (s *scanner) consume(c byte) bool {
	if s.i < len(s.b) && s.b[s.i] == c {
		s.i++
		return true
	}
	return false
}

func (s *scanner) literal(lit string) bool {
	if bytes.HasPrefix(s.b[s.i:], []byte(lit)) {
		s.i += len(lit)
		return true
	}
	return false
}

// end checks that nothing but space follows the object.
func (s *scanner) end() error {
	s.space()
	if !s.done() {
		return s.errorf("data after the object")
	}
	return nil
}

// str returns the string token at the scanner, quotes included, and moves
// past it. It checks what a JSON string may hold (no control characters,
// only JSON's escapes) without decoding it, and counts its bytes that are
// not UTF-8 in s.notUTF8.
func (s *scanner) str() ([]byte, error) {
	start := s.i
	s.notUTF8 = 0
	if !s.consume('"') {
		if s.i < len(s.b) && s.b[s.i] != '}' && s.b[s.i] != ',' {
			return nil, errNotString
		}
		return nil, s.errorf("want a string")
	}
	for s.i < len(s.b) {
		c := s.b[s.i]
		s.i++
		switch {
		case c == '"':
			return s.b[start:s.i], nil
		case c < 0x20:
			return nil, s.errorf("control character in a string")
		case c >= utf8.RuneSelf:
			// A rune's other bytes are never a quote, a backslash or a
			// control character: skipping them skips nothing to check.
			if r, n := utf8.DecodeRune(s.b[s.i-1:]); r == utf8.RuneError && n == 1 {
				s.notUTF8++
			} else {
				s.i += n - 1
			}
		case c == '\\':
			if s.i >= len(s.b) {
				return nil, s.errorf("unfinished escape")
			}
			e := s.b[s.i]
			s.i++
			switch e {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			case 'u':
				if s.i+4 > len(s.b) || !isHex(s.b[s.i:s.i+4]) {
					return nil, s.errorf("bad \\u escape")
				}
				s.i += 4
			default:
				return nil, s.errorf("bad escape \\%c", e)
			}
		}
	}
	return nil, s.errorf("unfinished string")
}

func isHex(b []byte) bool {
	for _, c := range b {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F') {
			return false
		}
	}
	return true
}

func (s *scanner) errorf(format string, args ...any) error {
	return fmt.Errorf("annotations: offset %d: %s", s.i, fmt.Sprintf(format, args...))
}
