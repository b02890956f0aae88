package record

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/podres-proxy/podres-proxy/model"
)

func sampleRecord() *Record {
	at := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	minor, idx := int64(3), 0
	return &Record{
		SchemaVersion: SchemaVersion, UID: "0b5d8e3a-1c2f-4b7e-9a6d-2f1e3c4b5a69",
		Namespace: "ml", Name: "trainer-0", SandboxID: "4f1c0d2e9b8a", State: PhaseReady,
		KubeletPhase: "Running",
		Containers:   []Container{{Name: "main", ID: "c0ffee", State: model.ContainerRunning}},
		Spec: &model.PodSpec{Containers: []model.ContainerSpec{
			{Name: "init", Kind: model.KindInit},
			{Name: "main", Kind: model.KindApp, Requests: map[string]string{"nvidia.com/gpu": "1"}},
		}},
		Annotations: map[string]string{"scheduling.koordinator.sh/device-allocated": `{"gpu":[{"minor":3}]}`},
		Devices: []model.Device{{Allocator: "koordinator", Type: "gpu", Resource: "nvidia.com/gpu",
			IDs: []string{"GPU-1"}, Minor: &minor, ContainerIndex: &idx}},
		DecodeErrors: []string{"rdma: unexpected end of JSON input"},
		Provenance: Provenance{
			Sandbox:     &Seen{Origin: OriginNRI, At: at},
			Annotations: &Seen{Origin: OriginNRI, At: at},
			Spec:        &Seen{Origin: OriginKubelet, At: at},
			Containers:  &Seen{Origin: OriginCRI, At: at},
		},
		UpdatedAt: at,
		RemovedAt: &at,
	}
}

func TestRecordFileRoundTripsEveryField(t *testing.T) {
	want := sampleRecord()
	data, err := Encode(want)
	if err != nil {
		t.Fatal(err)
	}
	got, err := Decode(data)
	if err != nil {
		t.Fatalf("decode: %v\n%s", err, data)
	}
	again, err := Encode(got)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(data, again) {
		t.Errorf("record changed through its file:\n%s\nbecame\n%s", data, again)
	}
	if !bytes.HasSuffix(data, []byte("}\n")) || !bytes.Contains(data, []byte("\n  \"uid\": ")) {
		t.Errorf("file is not indented JSON with a final newline:\n%s", data)
	}
}

func TestRecordFilesThatAreNotExactlyOursAreRefused(t *testing.T) {
	good, err := Encode(sampleRecord())
	if err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string]string{
		"empty":          "",
		"null":           "null",
		"array":          "[]",
		"no version":     strings.Replace(string(good), `"schemaVersion": 3,`, "", 1),
		"oldest version": strings.Replace(string(good), `"schemaVersion": 3`, `"schemaVersion": 0`, 1),
		"version 1":      strings.Replace(string(good), `"schemaVersion": 3`, `"schemaVersion": 1`, 1),
		"version 2":      strings.Replace(string(good), `"schemaVersion": 3`, `"schemaVersion": 2`, 1),
		"newer version":  strings.Replace(string(good), `"schemaVersion": 3`, `"schemaVersion": 4`, 1),
		"unknown field":  strings.Replace(string(good), `"schemaVersion": 3,`, `"schemaVersion": 3, "color": "red",`, 1),
		"trailing data":  string(good) + "{}",
		"truncated":      string(good[:len(good)-3]),
		"bad state":      strings.Replace(string(good), `"state": "ready"`, `"state": "running"`, 1),
		"bad source":     strings.Replace(string(good), `"source": "cri"`, `"source": "docker"`, 1),
		"path in uid":    strings.Replace(string(good), `"uid": "0b5d8e3a`, `"uid": "../0b5d8e3a`, 1),
		"bad ctr state":  strings.Replace(string(good), `"state": "running"`, `"state": "paused"`, 1),
		"string version": strings.Replace(string(good), `"schemaVersion": 3`, `"schemaVersion": "2"`, 1),
	} {
		if _, err := Decode([]byte(data)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestValidUIDRefusesNamesThatEscapeOrHide(t *testing.T) {
	for _, uid := range []string{"", ".", "..", ".hidden", "a/b", "a\x00b", "a\nb", strings.Repeat("x", 201), "\xff"} {
		if ValidUID(uid) {
			t.Errorf("ValidUID(%q) = true", uid)
		}
	}
	for _, uid := range []string{"0b5d8e3a-1c2f-4b7e-9a6d-2f1e3c4b5a69", "d41d8cd98f00b204e9800998ecf8427e", "a.b"} {
		if !ValidUID(uid) {
			t.Errorf("ValidUID(%q) = false", uid)
		}
	}
}

// FuzzLoadRecord feeds arbitrary bytes to the record file decoder: it must
// never panic, and what it accepts must survive another trip through the
// file format unchanged (a loaded record is written back by the writer).
func FuzzLoadRecord(f *testing.F) {
	good, err := Encode(sampleRecord())
	if err != nil {
		f.Fatal(err)
	}
	minimal, err := Encode(&Record{SchemaVersion: SchemaVersion, UID: "u", State: PhasePending})
	if err != nil {
		f.Fatal(err)
	}
	f.Add(good)
	f.Add(minimal)
	f.Add(good[:len(good)/2])
	f.Add([]byte(`{"schemaVersion":3,"uid":"u","state":"removed","removedAt":"0000-01-01T00:00:00+01:00","updatedAt":"9999-12-31T23:59:59-23:59"}`))
	f.Add([]byte(`{"schemaVersion":3,"UID":"u","State":"ready","devices":[{"ids":null,"minor":-1}]}`))
	f.Add([]byte(`{"schemaVersion":3}`))
	f.Add([]byte("\x00garbage"))
	f.Fuzz(func(t *testing.T, data []byte) {
		r, err := Decode(data)
		if err != nil {
			return
		}
		first, err := Encode(r)
		if err != nil {
			t.Fatalf("accepted a record that cannot be written back: %v", err)
		}
		r2, err := Decode(first)
		if err != nil {
			t.Fatalf("a record written back is refused: %v\n%s", err, first)
		}
		second, err := Encode(r2)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(first, second) {
			t.Fatalf("record changed on its second trip:\n%s\n%s", first, second)
		}
		if _, err := Load(r.UID+Ext, data); err != nil {
			t.Fatalf("accepted record refused under its own file name: %v", err)
		}
	})
}
