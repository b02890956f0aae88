package names

import (
	"fmt"
	"testing"
	"time"

	"github.com/podres-proxy/podres-proxy/model"
)

func TestPodsTheWatchAddsAndDeletesLeaveNoNamesBehind(t *testing.T) {
	var tab Table
	now := time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC)
	noLive := func(model.PodKey) bool { return false }
	for i := range 1000 {
		key := model.PodKey{Namespace: "ns", Name: fmt.Sprintf("job-%d", i)}
		tab.Note(key, fmt.Sprintf("uid-%d", i), now, noLive)
		now = now.Add(time.Second)
		tab.Note(key, "", now, noLive)
	}
	// What the last maxNamedAge's deletions left, and no more.
	if limit := 2 * int(maxNamedAge/time.Second); len(tab.uids) > limit || len(tab.namedAt) > limit {
		t.Fatalf("after 1000 pods added and deleted: %d names, %d times kept, want at most %d", len(tab.uids), len(tab.namedAt), limit)
	}
}

func TestANameWithALiveRecordIsKept(t *testing.T) {
	var tab Table
	now := time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC)
	key := model.PodKey{Namespace: "ns", Name: "web-0"}
	tab.Note(key, "", now, func(model.PodKey) bool { return true })
	later := now.Add(3 * maxNamedAge)
	tab.Note(model.PodKey{Namespace: "ns", Name: "other"}, "u", later, func(k model.PodKey) bool { return k == key })
	if uid, ok := tab.UID(key); !ok || uid != "" {
		t.Fatalf("a name of no pod whose sandbox still runs was forgotten: UID = %q, %v; want \"\", true", uid, ok)
	}
}
