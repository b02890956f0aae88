package plugin

import (
	"reflect"
	"testing"

	criv1 "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/podres-proxy/podres-proxy/model"
	"github.com/podres-proxy/podres-proxy/test/critest"
)

func TestFromCRIKeepsKubernetesPodsAndTheirContainersOnly(t *testing.T) {
	web := critest.Pod("web", criv1.PodSandboxState_SANDBOX_READY)
	done := critest.Pod("done", criv1.PodSandboxState_SANDBOX_NOTREADY)
	noUID := critest.Pod("bare", criv1.PodSandboxState_SANDBOX_READY)
	noUID.Metadata.Uid = ""
	noID := critest.Pod("noid", criv1.PodSandboxState_SANDBOX_READY)
	noID.Id = ""
	annotated := critest.Ctr(web, "app", criv1.ContainerState_CONTAINER_RUNNING)
	annotated.Annotations = map[string]string{"example.com/partition": "1g.10gb"}
	webSandbox := model.Sandbox{
		ID: "sb-web", UID: "uid-web", Namespace: "default", Name: "web",
		Annotations: web.Annotations, Ready: true,
	}
	doneSandbox := model.Sandbox{
		ID: "sb-done", UID: "uid-done", Namespace: "default", Name: "done",
		Annotations: done.Annotations,
	}

	for _, tc := range []struct {
		name           string
		pods           []*criv1.PodSandbox
		ctrs           []*criv1.Container
		wantSandboxes  []model.Sandbox
		wantContainers []model.RuntimeContainer
	}{
		{name: "nothing listed", wantSandboxes: []model.Sandbox{}, wantContainers: []model.RuntimeContainer{}},
		{
			name:          "a ready sandbox with a running container and its annotations",
			pods:          []*criv1.PodSandbox{web},
			ctrs:          []*criv1.Container{annotated},
			wantSandboxes: []model.Sandbox{webSandbox},
			wantContainers: []model.RuntimeContainer{{
				ID: "sb-web-app", SandboxID: "sb-web", Name: "app", State: model.ContainerRunning,
				Annotations: annotated.Annotations,
			}},
		},
		{
			name:          "a sandbox not ready, with an exited container",
			pods:          []*criv1.PodSandbox{done},
			ctrs:          []*criv1.Container{critest.Ctr(done, "app", criv1.ContainerState_CONTAINER_EXITED)},
			wantSandboxes: []model.Sandbox{doneSandbox},
			wantContainers: []model.RuntimeContainer{
				{ID: "sb-done-app", SandboxID: "sb-done", Name: "app", State: model.ContainerStopped},
			},
		},
		{
			name: "created and unknown containers",
			pods: []*criv1.PodSandbox{web},
			ctrs: []*criv1.Container{
				critest.Ctr(web, "init", criv1.ContainerState_CONTAINER_CREATED),
				critest.Ctr(web, "odd", criv1.ContainerState_CONTAINER_UNKNOWN),
			},
			wantSandboxes: []model.Sandbox{webSandbox},
			wantContainers: []model.RuntimeContainer{
				{ID: "sb-web-init", SandboxID: "sb-web", Name: "init", State: model.ContainerCreated},
				{ID: "sb-web-odd", SandboxID: "sb-web", Name: "odd", State: model.ContainerUnknown},
			},
		},
		{
			name: "a sandbox without a pod UID or an id is no Kubernetes pod, nor are its containers",
			pods: []*criv1.PodSandbox{noUID, noID, nil},
			ctrs: []*criv1.Container{
				critest.Ctr(noUID, "app", criv1.ContainerState_CONTAINER_RUNNING),
				critest.Ctr(noID, "app", criv1.ContainerState_CONTAINER_RUNNING),
			},
			wantSandboxes:  []model.Sandbox{},
			wantContainers: []model.RuntimeContainer{},
		},
		{
			name: "a container without an id, or of a sandbox not listed, is dropped",
			pods: []*criv1.PodSandbox{web},
			ctrs: []*criv1.Container{
				{PodSandboxId: "sb-web", Metadata: &criv1.ContainerMetadata{Name: "noid"}},
				critest.Ctr(done, "app", criv1.ContainerState_CONTAINER_RUNNING),
				nil,
			},
			wantSandboxes:  []model.Sandbox{webSandbox},
			wantContainers: []model.RuntimeContainer{},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sandboxes, containers := fromCRI(tc.pods, tc.ctrs)
			if !reflect.DeepEqual(sandboxes, tc.wantSandboxes) {
				t.Errorf("sandboxes:\n got %+v\nwant %+v", sandboxes, tc.wantSandboxes)
			}
			if !reflect.DeepEqual(containers, tc.wantContainers) {
				t.Errorf("containers:\n got %+v\nwant %+v", containers, tc.wantContainers)
			}
		})
	}
}
