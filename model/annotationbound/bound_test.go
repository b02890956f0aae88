package annotationbound

import (
	"encoding/json"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/podres-proxy/podres-proxy/model"
)

// A value's size must be what /pods spends on it, or the Pods API and the
// runtime would keep values /pods replaces, and the reverse.
func TestEncodedSizeIsWhatEncodingJSONWrites(t *testing.T) {
	alphabet := []string{"a", "Z", "0", " ", `"`, `\`, "/", "\b", "\f", "\n", "\r", "\t", "\x00", "\x1f", "\x7f",
		"<", ">", "&", "é", "€", "𝄞", "\u2028", "\u2029", "\xff", "\xe2\x82", "\xed\xa0\x80"}
	rng := rand.New(rand.NewPCG(1, 2))
	cases := append([]string{""}, alphabet...)
	for range 2000 {
		var b strings.Builder
		for range rng.IntN(40) {
			b.WriteString(alphabet[rng.IntN(len(alphabet))])
		}
		cases = append(cases, b.String())
	}
	for _, v := range cases {
		enc, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		if got, want := EncodedSize(v), len(enc)-2; got != want {
			t.Fatalf("EncodedSize(%q) = %d, encoding/json writes %d bytes (%s)", v, got, want, enc)
		}
	}
}

func TestApplyKeepsAllocatorKeysWithinTheirBoundsAndThePods(t *testing.T) {
	b := Allocators(func(key string) int {
		switch key {
		case "alloc/hint":
			return 4 << 10
		case "alloc/a", "alloc/b", "alloc/c":
			return 64 << 10
		}
		return 0
	})
	all := map[string]string{
		"alloc/a":    strings.Repeat("a", 40<<10),
		"alloc/b":    strings.Repeat("b", 30<<10), // would take the pod past 64 KiB
		"alloc/c":    "c",
		"alloc/hint": strings.Repeat("h", 255<<10),
		"other":      strings.Repeat("o", 255<<10),
	}
	got := b.Apply(all)
	if len(got) != 4 {
		t.Fatalf("kept %d keys, want the 4 allocator keys", len(got))
	}
	if got["alloc/a"] != all["alloc/a"] || got["alloc/c"] != "c" {
		t.Errorf("values within the bounds not kept whole")
	}
	for _, k := range []string{"alloc/b", "alloc/hint"} {
		if _, ok := model.Oversized(got[k]); !ok {
			t.Errorf("%s kept as %.40q..., want it replaced as oversized", k, got[k])
		}
	}
	if got := b.Apply(nil); got != nil {
		t.Errorf("Apply(nil) = %v, want nil", got)
	}
	if got := b.Apply(map[string]string{"other": "x"}); got == nil || len(got) != 0 {
		t.Errorf("Apply of no allocator key = %#v, want an empty map", got)
	}
	if got := (Bounds{}).Apply(all); len(got) != len(all) || got["other"] != all["other"] {
		t.Errorf("zero Bounds do not keep every annotation whole")
	}
}
