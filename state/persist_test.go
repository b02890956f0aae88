package state

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/podres-proxy/podres-proxy/model"
	"github.com/podres-proxy/podres-proxy/state/persist"
	"github.com/podres-proxy/podres-proxy/state/record"
	"github.com/podres-proxy/podres-proxy/test/fulldisk"
	"github.com/podres-proxy/podres-proxy/test/poll"
)

// openTest opens a store on dir with fast retries and closes it when the
// test ends.
func openTest(t *testing.T, dir string, opts Options) *Store {
	t.Helper()
	if opts.Log == nil {
		opts.Log = quietLog()
	}
	s, err := Open(dir, opts)
	if err != nil {
		t.Fatalf("Open(%s): %v", dir, err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func flush(t *testing.T, s *Store) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.Flush(ctx); err != nil {
		t.Fatalf("Flush: %v", err)
	}
}

// podFiles lists the names in <dir>/pods.
func podFiles(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(filepath.Join(dir, podsDirName))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}

func readRecordFile(t *testing.T, dir, uid string) *record.Record {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dir, podsDirName, uid+recordExt))
	if err != nil {
		t.Fatal(err)
	}
	r, err := decodeRecord(data)
	if err != nil {
		t.Fatalf("file of %s does not decode: %v\n%s", uid, err, data)
	}
	return r
}

func encodedRecords(t *testing.T, rs []*record.Record) string {
	t.Helper()
	var b bytes.Buffer
	for _, r := range rs {
		data, err := encodeRecord(r)
		if err != nil {
			t.Fatal(err)
		}
		b.Write(data)
	}
	return b.String()
}

func TestOpenedStoreWritesOneReadableFilePerPodAndLoadsThemBack(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	dec := &fakeDecoder{}
	clock := newFakeClock()
	s := openTest(t, dir, Options{Decoder: dec, Clock: clock})
	s.ObserveKubeletPods(time.Now(), nil, []model.KubeletPod{{UID: "u1", Namespace: "ns", Name: "web-0", Phase: "Pending",
		Annotations: map[string]string{"alloc/gpu": "GPU-1"},
		Spec:        model.PodSpec{Containers: []model.ContainerSpec{{Name: "app", Kind: model.KindApp, Requests: map[string]string{"example.com/gpu": "1"}}}}}})
	s.ObserveSandbox(record.OriginNRI, readySandbox("u1", "ns", "web-0", "sb1", map[string]string{"alloc/gpu": "GPU-1"}))
	s.ObserveContainer(record.OriginNRI, model.RuntimeContainer{ID: "c1", SandboxID: "sb1", Name: "app", State: model.ContainerRunning})
	s.ObserveSandbox(record.OriginNRI, readySandbox("u2", "ns", "web-1", "sb2", nil))
	flush(t, s)
	want := encodedRecords(t, s.Records())
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}

	if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o750 {
		t.Errorf("state directory mode %v (err %v), want 0750", fi.Mode().Perm(), err)
	}
	// The file is plain JSON with the documented field names.
	var generic map[string]any
	data, err := os.ReadFile(filepath.Join(dir, "pods", "u1.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &generic); err != nil {
		t.Fatalf("u1.json is not JSON: %v", err)
	}
	for _, k := range []string{"schemaVersion", "uid", "namespace", "name", "sandboxID", "state", "containers", "devices", "sources"} {
		if _, ok := generic[k]; !ok {
			t.Errorf("u1.json has no %q field:\n%s", k, data)
		}
	}
	if devs, _ := generic["devices"].([]any); len(devs) != 1 {
		t.Errorf("u1.json devices = %v, want one device", generic["devices"])
	}
	if devs, ok := readRecordFileGeneric(t, dir, "u2")["devices"].([]any); !ok || len(devs) != 0 {
		t.Errorf("a pod without devices must have \"devices\": [] for jq, got %v", devs)
	}

	calls := dec.Calls()
	s2 := openTest(t, dir, Options{Decoder: dec, Clock: clock})
	if got := encodedRecords(t, s2.Records()); got != want {
		t.Errorf("records loaded back differ:\n got %s\nwant %s", got, want)
	}
	if r, ok := s2.Snapshot().Live(pod); !ok || r.UID != "u1" {
		t.Errorf("a reopened store does not answer the running pod: %v, %v", r, ok)
	}
	if dec.Calls() != calls+1 {
		t.Errorf("decoder called %d times on load, want once for the pod with annotations", dec.Calls()-calls)
	}
	flush(t, s2)
	if st := s2.Stats(); st.Writes != 0 || st.Records != 2 {
		t.Errorf("loading unchanged records: %+v, want 2 records and no writes", st)
	}
}

func readRecordFileGeneric(t *testing.T, dir, uid string) map[string]any {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dir, podsDirName, uid+recordExt))
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(data, &m); err != nil {
		t.Fatal(err)
	}
	return m
}

func TestOpenDecodesAnnotationsAgainWithTheCurrentDecoder(t *testing.T) {
	dir := t.TempDir()
	clock := newFakeClock()
	s := openTest(t, dir, Options{Decoder: &fakeDecoder{prefix: "old.example.com"}, Clock: clock})
	s.ObserveSandbox(record.OriginNRI, readySandbox("u1", "ns", "a", "sb1", map[string]string{"alloc/gpu": "GPU-1"}))
	learned := mustGet(t, s, "u1").Provenance.Annotations
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	clock.Advance(time.Hour)
	s2 := openTest(t, dir, Options{Decoder: &fakeDecoder{prefix: "new.example.com"}, Clock: clock})
	r := mustGet(t, s2, "u1")
	if len(r.Devices) != 1 || r.Devices[0].Resource != "new.example.com/gpu" {
		t.Fatalf("devices after reopening with a new decoder: %+v", r.Devices)
	}
	if r.Provenance.Annotations.Origin != learned.Origin || !r.Provenance.Annotations.At.Equal(learned.At) {
		t.Errorf("re-decoding changed where the annotations came from: %+v, want %+v", r.Provenance.Annotations, learned)
	}
	flush(t, s2)
	if got := readRecordFile(t, dir, "u1").Devices[0].Resource; got != "new.example.com/gpu" {
		t.Errorf("file still says %q after the re-decoded record was flushed", got)
	}
}

func TestSecondOpenOfALockedDirectoryIsRefused(t *testing.T) {
	dir := t.TempDir()
	s := openTest(t, dir, Options{})
	_, err := Open(dir, Options{Log: quietLog()})
	want := fmt.Sprintf("state directory %s is in use by another podres-proxy (pid %d)", dir, os.Getpid())
	if !errors.Is(err, persist.ErrInUse) || err.Error() != want {
		t.Fatalf("second Open: %v, want %q", err, want)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s2, err := Open(dir, Options{Log: quietLog()})
	if err != nil {
		t.Fatalf("Open after Close: %v", err)
	}
	s2.Close()
}

func TestCorruptFilesAreSetAsideCountedAndTheRestLoads(t *testing.T) {
	dir := t.TempDir()
	good := &record.Record{SchemaVersion: record.SchemaVersion, UID: "good", Namespace: "ns", Name: "a", State: record.PhasePending}
	goodData, err := encodeRecord(good)
	if err != nil {
		t.Fatal(err)
	}
	wrongVersion := bytes.Replace(goodData, []byte(`"schemaVersion": 3`), []byte(`"schemaVersion": 99`), 1)
	// A file an earlier build wrote is not read as the current schema: it
	// is set aside like any other file that cannot be loaded.
	oldVersion := bytes.Replace(goodData, []byte(`"schemaVersion": 3`), []byte(`"schemaVersion": 2`), 1)
	files := map[string][]byte{
		"good.json":          goodData,
		"truncated.json":     bytes.Replace(goodData, []byte(`"good"`), []byte(`"truncated"`), 1)[:len(goodData)/2],
		"version.json":       bytes.Replace(wrongVersion, []byte(`"good"`), []byte(`"version"`), 1),
		"old-version.json":   bytes.Replace(oldVersion, []byte(`"good"`), []byte(`"old-version"`), 1),
		"garbage.json":       []byte("\x00\x01not json at all"),
		"other-uid.json":     goodData, // says uid "good"
		".good.json.123.tmp": goodData[:10],
		"README":             []byte("not a record, left alone"),
	}
	podsDir := filepath.Join(dir, podsDirName)
	if err := os.MkdirAll(podsDir, 0o750); err != nil {
		t.Fatal(err)
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(podsDir, name), data, 0o640); err != nil {
			t.Fatal(err)
		}
	}

	// A reader sees the problems without moving anything.
	recs, errs := persist.ReadDir(dir)
	if len(recs) != 1 || len(errs) != 5 {
		t.Errorf("ReadDir: %d records and %d errors, want 1 and 5: %v", len(recs), len(errs), errs)
	}
	for _, err := range errs {
		var fe *persist.FileError
		if !errors.As(err, &fe) {
			t.Errorf("ReadDir error %v is not a *FileError", err)
		} else if strings.HasSuffix(fe.Path, "old-version.json") && !strings.Contains(fe.Error(), "schemaVersion 2, this podres-proxy reads only 3") {
			t.Errorf("ReadDir does not say why the older version is refused: %v", err)
		}
	}

	logger, logged := newCapturedLog()
	s := openTest(t, dir, Options{Log: logger})
	if recs := s.Records(); len(recs) != 1 || recs[0].UID != "good" {
		t.Errorf("loaded %v, want only the good record", recs)
	}
	st := s.Stats()
	if st.CorruptFiles != 5 {
		t.Errorf("Stats.CorruptFiles = %d, want 5", st.CorruptFiles)
	}
	if got := strings.Join(podFiles(t, dir), " "); got != "README good.json" {
		t.Errorf("pods directory after Open: %s; want the bad and temporary files gone", got)
	}
	corrupt, err := os.ReadDir(filepath.Join(dir, corruptDirName))
	if err != nil {
		t.Fatal(err)
	}
	var setAside []string
	for _, e := range corrupt {
		setAside = append(setAside, e.Name())
	}
	for _, name := range []string{"truncated.json", "version.json", "old-version.json", "garbage.json", "other-uid.json"} {
		found := false
		for _, got := range setAside {
			if strings.HasPrefix(got, name+".") {
				found = true
				data, _ := os.ReadFile(filepath.Join(dir, corruptDirName, got))
				if !bytes.Equal(data, files[name]) {
					t.Errorf("%s was altered when set aside", name)
				}
			}
		}
		if !found {
			t.Errorf("%s not in corrupt/ (%v)", name, setAside)
		}
	}
	text := logged.Text()
	for _, want := range []string{"set aside a pod record file", "removed the temporary file"} {
		if !strings.Contains(text, want) {
			t.Errorf("log does not say %q:\n%s", want, text)
		}
	}
}

func TestWritesFailingWhileThePodsDirectoryIsGoneAreRetriedAndNothingIsLost(t *testing.T) {
	dir := t.TempDir()
	durable := make(chan time.Duration, 16)
	s := openTest(t, dir, Options{OnDurable: func(d time.Duration) { durable <- d }})
	s.ObserveSandbox(record.OriginNRI, readySandbox("u1", "ns", "a", "sb1", nil))
	flush(t, s)

	// Root ignores permissions, so take the directory away instead: a plain
	// file where the pods directory was makes every write fail (ENOTDIR).
	podsDir := filepath.Join(dir, podsDirName)
	away := filepath.Join(dir, "pods.away")
	if err := os.Rename(podsDir, away); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(podsDir, nil, 0o640); err != nil {
		t.Fatal(err)
	}
	s.SandboxStopped(record.OriginNRI, "sb1", "")
	s.ObserveSandbox(record.OriginNRI, readySandbox("u2", "ns", "b", "sb2", nil))
	err := s.Flush(context.Background())
	if !errors.Is(err, syscall.ENOTDIR) && (err == nil || !strings.Contains(err.Error(), "not a directory")) {
		t.Fatalf("Flush with the pods directory gone: %v, want ENOTDIR", err)
	}
	st := s.Stats()
	if st.WriteErrors == 0 || !strings.Contains(st.LastWriteError, "not a directory") || st.Pending != 2 {
		t.Errorf("stats while failing: %+v, want write errors, the error text and 2 pending", st)
	}
	if r := mustGet(t, s, "u1"); r.State != record.PhaseStopped {
		t.Errorf("memory lost the change while writes failed: %q", r.State)
	}

	// The way cleared, the writer makes the directory again and writes
	// what is pending. (Putting the old directory back instead races with
	// a retry that has already made a new one.)
	if err := os.Remove(podsDir); err != nil {
		t.Fatal(err)
	}
	flush(t, s)
	if got := readRecordFile(t, dir, "u1").State; got != record.PhaseStopped {
		t.Errorf("file of u1 says %q after recovery, want stopped", got)
	}
	readRecordFile(t, dir, "u2")
	if st := s.Stats(); st.Pending != 0 || st.Writes < 3 {
		t.Errorf("stats after recovery: %+v", st)
	}
	// Three writes became durable: u1 before and after the outage, u2 after.
	for n := 0; n < 3; n++ {
		select {
		case <-durable:
		case <-time.After(10 * time.Second):
			t.Fatalf("OnDurable called %d times, want once per write (3)", n)
		}
	}
}

func TestAWriteFailingOnAFullDiskIsRetriedAndLeavesTheOldFileIntact(t *testing.T) {
	// A disk without a free block fails the temporary file's write; one
	// without a free inode fails its creation. Either way the old file
	// stays whole and the change is written once there is room.
	for _, full := range []struct {
		name   string
		inodes bool
	}{{"no free block", false}, {"no free inode", true}} {
		t.Run(full.name, func(t *testing.T) {
			disk := fulldisk.Mount(t)
			dir := filepath.Join(disk, "state")
			s := openTest(t, dir, Options{})
			s.ObserveSandbox(record.OriginNRI, readySandbox("u1", "ns", "a", "sb1", nil))
			flush(t, s)
			path := filepath.Join(dir, podsDirName, "u1.json")
			before, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}

			free := fulldisk.Fill(t, disk, full.inodes)
			s.SandboxStopped(record.OriginNRI, "sb1", "")
			if err := s.Flush(context.Background()); !errors.Is(err, syscall.ENOSPC) && (err == nil || !strings.Contains(err.Error(), "no space")) {
				t.Fatalf("Flush on a full disk: %v, want ENOSPC", err)
			}
			if err := s.Flush(context.Background()); err == nil {
				t.Fatal("a second Flush while writes still fail returned nil")
			}
			if after, err := os.ReadFile(path); err != nil || !bytes.Equal(before, after) {
				t.Errorf("a failed write changed the file (err %v):\n%s\nwas\n%s", err, after, before)
			}

			free()
			flush(t, s)
			if got := readRecordFile(t, dir, "u1").State; got != record.PhaseStopped {
				t.Errorf("file says %q after recovery, want stopped", got)
			}
			for _, name := range podFiles(t, dir) {
				if isTempName(name) {
					t.Errorf("temporary file %s left after recovery", name)
				}
			}
			if st := s.Stats(); st.WriteErrors < 2 || st.LastWriteError == "" {
				t.Errorf("stats %+v: want the write errors counted", st)
			}
		})
	}
}

func TestPrunerDeletesRemovedRecordsAndTheirFiles(t *testing.T) {
	dir := t.TempDir()
	clock := newFakeClock()
	s := openTest(t, dir, Options{Clock: clock, PruneAfter: time.Millisecond})
	s.ObserveSandbox(record.OriginNRI, readySandbox("u1", "ns", "a", "sb1", nil))
	s.SandboxRemoved(record.OriginNRI, "sb1", "")
	flush(t, s)
	if names := podFiles(t, dir); len(names) != 1 {
		t.Fatalf("files %v, want the removed record kept during the grace period", names)
	}
	clock.Advance(time.Millisecond)
	// The pruner runs on its own ticker; wait for its effect.
	poll.Until(t, "the pruner to delete the expired record", func() bool { _, ok := s.Get("u1"); return !ok })
	flush(t, s)
	if names := podFiles(t, dir); len(names) != 0 {
		t.Errorf("files %v after prune, want none", names)
	}
}

func TestFlushAndCloseOfAnInMemoryStoreDoNothing(t *testing.T) {
	s := New(Options{})
	s.ObserveSandbox(record.OriginNRI, readySandbox("u1", "ns", "a", "sb1", nil))
	if err := s.Flush(context.Background()); err != nil {
		t.Errorf("Flush: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	if st := s.Stats(); st != (Stats{Records: 1}) {
		t.Errorf("Stats %+v, want only Records", st)
	}
	s.ObserveSandbox(record.OriginNRI, readySandbox("u2", "ns", "b", "sb2", nil))
	if len(s.Records()) != 2 {
		t.Error("an in-memory store stopped working after Close")
	}
}

func TestCloseWritesPendingChangesAndLaterChangesStayInMemory(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir, Options{Log: quietLog()})
	if err != nil {
		t.Fatal(err)
	}
	s.ObserveSandbox(record.OriginNRI, readySandbox("u1", "ns", "a", "sb1", nil))
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	readRecordFile(t, dir, "u1")
	s.ObserveSandbox(record.OriginNRI, readySandbox("u2", "ns", "b", "sb2", nil))
	if _, ok := s.Get("u2"); !ok {
		t.Error("the store stopped answering after Close")
	}
	if err := s.Flush(context.Background()); err != nil {
		t.Errorf("Flush after Close: %v", err)
	}
	if names := podFiles(t, dir); len(names) != 1 {
		t.Errorf("files after Close %v, want only u1", names)
	}
	if err := s.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

func TestReadDirNeverSeesAHalfWrittenFileWhileTheWriterRuns(t *testing.T) {
	dir := t.TempDir()
	s := openTest(t, dir, Options{})
	for i := range 20 {
		s.ObserveSandbox(record.OriginNRI, readySandbox(fmt.Sprintf("u%02d", i), "ns", fmt.Sprintf("p%02d", i), fmt.Sprintf("sb%02d", i), nil))
	}
	flush(t, s)
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for n := 0; ; n++ {
			select {
			case <-stop:
				return
			default:
			}
			i := n % 20
			state := model.ContainerRunning
			if n/20%2 == 1 {
				state = model.ContainerStopped
			}
			s.ObserveContainer(record.OriginNRI, model.RuntimeContainer{ID: fmt.Sprintf("c%d", i), SandboxID: fmt.Sprintf("sb%02d", i), Name: "app", State: state})
			if n%50 == 0 {
				s.Flush(context.Background())
			}
		}
	}()
	for range 50 {
		recs, errs := persist.ReadDir(dir)
		if len(errs) != 0 || len(recs) != 20 {
			t.Errorf("ReadDir while writing: %d records, errors %v", len(recs), errs)
			break
		}
	}
	close(stop)
	<-done
}

func TestReadDirOfADirectoryThatCannotBeReadIsOneError(t *testing.T) {
	recs, errs := persist.ReadDir(filepath.Join(t.TempDir(), "missing"))
	if recs != nil || len(errs) != 1 {
		t.Fatalf("ReadDir of a missing directory: %v, %v", recs, errs)
	}
	var fe *persist.FileError
	if errors.As(errs[0], &fe) {
		t.Errorf("a directory error looks like a file error: %v", errs[0])
	}
	recs, errs = persist.ReadDir(t.TempDir())
	if recs == nil || len(recs) != 0 || errs != nil {
		t.Errorf("ReadDir of a state directory without pods yet: %v, %v; want no records", recs, errs)
	}
}

func TestStatsReportDurableLatency(t *testing.T) {
	s := openTest(t, t.TempDir(), Options{})
	s.ObserveSandbox(record.OriginNRI, readySandbox("u1", "ns", "a", "sb1", nil))
	flush(t, s)
	st := s.Stats()
	if st.Writes != 1 || st.LastDurable <= 0 || st.MaxDurable < st.LastDurable || st.Pending != 0 || st.Records != 1 {
		t.Errorf("stats after one write: %+v", st)
	}
}
