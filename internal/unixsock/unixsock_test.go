package unixsock

import "testing"

func TestTargetReadsPathsAndUnixURLsOnly(t *testing.T) {
	for in, want := range map[string]string{
		"/var/lib/kubelet/pod-resources/kubelet.sock": "unix:///var/lib/kubelet/pod-resources/kubelet.sock",
		"unix:///run/containerd/containerd.sock":      "unix:///run/containerd/containerd.sock",
		"unix:/run/containerd/containerd.sock":        "unix:///run/containerd/containerd.sock",
	} {
		if got, err := Target(in); err != nil || got != want {
			t.Errorf("Target(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"", "unix://", "relative.sock", "unix://relative.sock", "tcp://127.0.0.1:10250"} {
		if got, err := Target(in); err == nil {
			t.Errorf("Target(%q) = %q; want an error", in, got)
		}
	}
}
