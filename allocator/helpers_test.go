package allocator

import (
	"github.com/podres-proxy/podres-proxy/allocator/hami"
	"github.com/podres-proxy/podres-proxy/allocator/koordinator"
	"github.com/podres-proxy/podres-proxy/allocator/parse"
	"github.com/podres-proxy/podres-proxy/allocator/volcano"
	"github.com/podres-proxy/podres-proxy/model"
)

// Devices as each format decodes them, for the tests of attribution.

const (
	uuidA = "GPU-903ecef4-bb8d-d7fe-65e2-e327e6258e76"
	uuidB = "GPU-2c1b5e0f-77aa-4a4a-9b9b-123456789abc"
)

func ptr[T any](v T) *T { return &v }

func gpu(id string, minor int64) model.Device {
	d := model.Device{Allocator: koordinator.Name, Type: "gpu", Resource: "nvidia.com/gpu", Minor: ptr(minor)}
	if id != "" {
		d.IDs = []string{id}
	}
	return d
}

func rdma(minor int64, ids ...string) model.Device {
	return model.Device{Allocator: koordinator.Name, Type: "rdma", Resource: "koordinator.sh/rdma", Minor: ptr(minor), IDs: ids}
}

func shared(d model.Device) model.Device { d.Shared = true; return d }

// hv builds the device the HAMi decoder reports for an NVIDIA vGPU.
func hv(id string, index, count int, isShared bool) model.Device {
	return model.Device{
		Allocator: hami.Name, Type: "NVIDIA", Resource: parse.DefaultGPUResource, IDs: []string{id},
		Shared: isShared, ContainerIndex: ptr(index), ContainerScope: model.ScopeRequestingAll,
		ContainerCount: count, Replace: true,
	}
}

func scoped(d model.Device, s model.ContainerScope) model.Device { d.ContainerScope = s; return d }

// gs builds the device the gpushare decoder reports for a GPU index.
func gs(index int64) model.Device {
	return model.Device{Allocator: volcano.GPUShareName, Type: "gpu", Resource: parse.DefaultGPUResource, Index: ptr(index)}
}

const hamiExample = "GPU-903ecef4-bb8d-d7fe-65e2-e327e6258e76,NVIDIA,500,5:;"
