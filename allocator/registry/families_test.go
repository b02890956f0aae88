package registry

import (
	"reflect"
	"strings"
	"testing"

	"github.com/podres-proxy/podres-proxy/allocator/hami"
	"github.com/podres-proxy/podres-proxy/allocator/volcano"
)

// Each family's list is believed for every allocator of the family
// (Volcano's two), trimmed.
func TestTrustedSchedulersGivesEachAllocatorItsFamilysNames(t *testing.T) {
	got, err := TrustedSchedulers(func(flag string) string {
		if flag == "volcano" {
			return " volcano , default-scheduler,"
		}
		return "sched"
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"volcano", "default-scheduler"}
	if !reflect.DeepEqual(got[volcano.VGPUName], want) || !reflect.DeepEqual(got[volcano.GPUShareName], want) {
		t.Errorf("volcano's allocators believe %q and %q, want %q for both", got[volcano.VGPUName], got[volcano.GPUShareName], want)
	}
	if !reflect.DeepEqual(got[hami.Name], []string{"sched"}) {
		t.Errorf("hami believes %q, want [sched]", got[hami.Name])
	}
}

// A family whose list names no scheduler is refused, naming its flag.
func TestTrustedSchedulersRefusesAnEmptyList(t *testing.T) {
	_, err := TrustedSchedulers(func(flag string) string {
		if flag == "hami" {
			return " , "
		}
		return "s"
	})
	if err == nil || !strings.Contains(err.Error(), "--hami-scheduler-names is empty") {
		t.Errorf("error %v, want --hami-scheduler-names is empty", err)
	}
}
