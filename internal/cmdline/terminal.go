package cmdline

import (
	"io"
	"strconv"
	"unicode"
	"unicode/utf8"
)

// terminal escapes what must not reach a terminal raw: every rune that
// is not printable (tabs and newlines, which tables and lines need, aside)
// is written as strconv.Quote writes it (\x1b, \u200b), and so is every
// byte that is not UTF-8. Device ids, pod names and annotation errors come
// from tenants' annotations and from the kubelet; printed raw, an ESC in one
// could rewrite an operator's screen or hide a line. JSON output needs no
// such care: the encoders escape control characters themselves.
type terminal struct{ w io.Writer }

// Write implements io.Writer.
func (t terminal) Write(p []byte) (int, error) {
	out := make([]byte, 0, len(p)+16)
	for i := 0; i < len(p); {
		r, size := utf8.DecodeRune(p[i:])
		switch {
		case printableRune(r, size):
			out = append(out, p[i:i+size]...)
		case r == utf8.RuneError && size == 1:
			out = append(out, `\x`...)
			out = append(out, "0123456789abcdef"[p[i]>>4], "0123456789abcdef"[p[i]&0xf])
		default:
			q := strconv.QuoteRune(r) // 'x', with x escaped
			out = append(out, q[1:len(q)-1]...)
		}
		i += size
	}
	if _, err := t.w.Write(out); err != nil {
		return 0, err
	}
	return len(p), nil
}

func printableRune(r rune, size int) bool {
	if r == utf8.RuneError && size == 1 {
		return false
	}
	return r == '\t' || r == '\n' || unicode.IsPrint(r)
}
