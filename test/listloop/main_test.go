package main

import (
	"reflect"
	"testing"

	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"
)

func TestDevicesKeepsOneNamespaceAndResource(t *testing.T) {
	dev := func(res string, ids ...string) *podresourcesv1.ContainerDevices {
		return &podresourcesv1.ContainerDevices{ResourceName: res, DeviceIds: ids}
	}
	resp := &podresourcesv1.ListPodResourcesResponse{PodResources: []*podresourcesv1.PodResources{
		{Name: "a", Namespace: "ns", Containers: []*podresourcesv1.ContainerResources{
			{Name: "sidecar", Devices: []*podresourcesv1.ContainerDevices{dev("rdma", "vf-2")}},
			{Name: "app", Devices: []*podresourcesv1.ContainerDevices{dev("rdma", "vf-1"), dev("gpu", "g")}},
		}},
		{Name: "b", Namespace: "ns"},
		{Name: "c", Namespace: "other", Containers: []*podresourcesv1.ContainerResources{
			{Name: "app", Devices: []*podresourcesv1.ContainerDevices{dev("rdma", "vf-3")}},
		}},
	}}
	want := map[string][]string{"a": {"vf-1", "vf-2"}, "b": {}}
	if got := Devices(resp, "ns", "rdma"); !reflect.DeepEqual(got, want) {
		t.Errorf("Devices = %v, want %v", got, want)
	}
}
