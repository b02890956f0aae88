package proxy_test

import (
	"bytes"
	"fmt"
	"slices"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	v1 "k8s.io/kubelet/pkg/apis/podresources/v1"
	"k8s.io/kubelet/pkg/apis/podresources/v1alpha1"

	fk "github.com/podres-proxy/podres-proxy/test/fakekubelet"
)

// A List answer is spliced from the kubelet's own bytes and the pods'
// cached outputs (package reuse), never decoded and encoded as a whole.
// What a client receives must still be, byte for byte, what gRPC's
// protobuf codec would have sent for the answer: the kubelet's pods in the
// kubelet's order, each as Get answers it, unknown fields included.

// rawList is the bytes of one List answer, as a gRPC client receives them.
func rawList(t *testing.T, conn *grpc.ClientConn, method string, req proto.Message) []byte {
	t.Helper()
	var raw []byte
	if err := conn.Invoke(ctx(t), method, req, &raw, grpc.ForceCodecV2(bytesCodec{})); err != nil {
		t.Fatalf("%s: %v", method, err)
	}
	return raw
}

func TestListAnswerBytesAreWhatGRPCWouldEncodeForShuffledKubeletAnswers(t *testing.T) {
	h := newHarness(t)
	h.k.SetUnknownFields(true)
	// At most one kubelet device entry per container, so that the kubelet's
	// shuffling of a container's devices cannot tell Get from List.
	pods := slices.DeleteFunc(mixedPods(), func(p fk.Pod) bool { return p.Name == "devs" })
	h.k.SetPods(pods...)
	h.list() // learns the specs
	for i, p := range pods {
		h.markLive(p, fmt.Sprintf("sb-%d", i))
	}
	gets := map[string]*v1.PodResources{}
	for _, p := range pods {
		gets[p.Namespace+"/"+p.Name] = h.get(p.Namespace, p.Name)
	}

	conn := h.conn()
	for i := range 10 {
		raw := rawList(t, conn, v1.PodResourcesLister_List_FullMethodName, &v1.ListPodResourcesRequest{})
		var got v1.ListPodResourcesResponse
		if err := proto.Unmarshal(raw, &got); err != nil {
			t.Fatalf("List %d does not decode: %v", i, err)
		}
		// The answer gRPC's codec would send: every pod as Get answers it,
		// in the order this List names them.
		want := &v1.ListPodResourcesResponse{}
		for _, p := range got.PodResources {
			g, ok := gets[p.Namespace+"/"+p.Name]
			if !ok {
				t.Fatalf("List %d names %s/%s, which the kubelet does not list", i, p.Namespace, p.Name)
			}
			want.PodResources = append(want.PodResources, g)
		}
		wantRaw, err := proto.Marshal(want)
		if err != nil {
			t.Fatal(err)
		}
		if len(got.PodResources) != len(pods) || !bytes.Equal(raw, wantRaw) {
			t.Fatalf("List %d: %d pods, %d bytes, want %d pods, %d bytes, as gRPC would encode them:\ngot  %x\nwant %x",
				i, len(got.PodResources), len(raw), len(pods), len(wantRaw), raw, wantRaw)
		}

		alpha := rawList(t, conn, v1alpha1.PodResourcesLister_List_FullMethodName, &v1alpha1.ListPodResourcesRequest{})
		var gotAlpha v1alpha1.ListPodResourcesResponse
		if err := proto.Unmarshal(alpha, &gotAlpha); err != nil {
			t.Fatalf("v1alpha1 List %d does not decode: %v", i, err)
		}
		if again, err := proto.Marshal(&gotAlpha); err != nil || !bytes.Equal(alpha, again) || len(gotAlpha.PodResources) != len(pods) {
			t.Fatalf("v1alpha1 List %d (%d pods) is not what gRPC would encode for it (%v):\ngot  %x\nwant %x", i, len(gotAlpha.PodResources), err, alpha, again)
		}
	}
	if n := h.counter("podres_proxy_list_pods_total", "answer", "reused"); n == 0 {
		t.Errorf("no pod of a shuffled answer was reused")
	}
}
