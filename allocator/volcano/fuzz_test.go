package volcano

import (
	"fmt"
	"math"
	"reflect"
	"strings"
	"testing"

	"github.com/podres-proxy/podres-proxy/allocator/parse"
	"github.com/podres-proxy/podres-proxy/test/allocfixture"
)

// FuzzVolcanoGPUShareDecode feeds arbitrary values to the gpushare decoder:
// never a panic, deterministic, all or nothing, and every device an index
// to translate, each GPU once.
func FuzzVolcanoGPUShareDecode(f *testing.F) {
	for _, seed := range []string{"0", "0,2", "3,0,2", " 0 , 2 ", "", " ", "0,", ",", "0,,2", "-1", "gpu0",
		"1,2,1", "2147483647", "2147483648", "99999999999999999999", "+1", "1.5", "0;1", uuidA} {
		f.Add(seed)
	}
	allocfixture.AddSeeds(f, func(key string) bool { return key == GPUShareAnnotation })
	g := NewGPUShare(GPUShareOptions{})
	f.Fuzz(func(t *testing.T, value string) {
		ann := map[string]string{GPUShareAnnotation: value}
		devices, err := g.Decode(ann)
		again, errAgain := g.Decode(ann)
		if !reflect.DeepEqual(devices, again) || fmt.Sprint(err) != fmt.Sprint(errAgain) {
			t.Fatalf("Decode is not deterministic: %+v %v / %+v %v", devices, err, again, errAgain)
		}
		if err != nil {
			if devices != nil || !strings.HasPrefix(err.Error(), "decode "+GPUShareAnnotation+": ") {
				t.Errorf("Decode = %+v, %v; want no devices and an error naming the annotation", devices, err)
			}
			return
		}
		if strings.TrimSpace(value) != "" && len(devices) != strings.Count(value, ",")+1 {
			t.Errorf("%d devices for %q", len(devices), value)
		}
		seen := map[int64]bool{}
		for _, d := range devices {
			if d.Allocator != GPUShareName || d.Type != "gpu" || d.Resource != parse.DefaultGPUResource || d.IDs != nil || d.Replace || d.ContainerIndex != nil {
				t.Errorf("unexpected device %+v", d)
			}
			if d.Index == nil || *d.Index < 0 || *d.Index > math.MaxInt32 || seen[*d.Index] {
				t.Errorf("bad or repeated index in %+v", devices)
				continue
			}
			seen[*d.Index] = true
		}
	})
}
