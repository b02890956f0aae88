// Package hami decodes HAMi's allocations (hami.io/<vendor>-devices-allocated
// and the MIG instances of hami.io/vgpu-mig-allocations) in HAMi's list
// format, which Volcano's vGPU plugin writes too (DecodeList).
//
// hami.io/<vendor>-devices-allocated (hami.io/vgpu-devices-allocated for
// NVIDIA; not the in-flight -devices-to-allocate keys) holds one entry per
// container, each ended by ';', each a list of devices "UUID,Type,mem,cores"
// each ended by ':':
//
//	GPU-903ecef4-bb8d-d7fe-65e2-e327e6258e76,NVIDIA,500,5:;
//
// Each device is reported under its vendor's resource name (DefaultResources,
// which Options.Resources overrides) and replaces what the kubelet reported
// for that resource in that container: HAMi's device plugins give the
// kubelet ids of their own (<UUID>-<n> for NVIDIA) that DCGM cannot match.
//
// Which container an entry is for: HAMi's device plugin hands the k-th
// non-empty entry to the k-th container, in spec order (init and sidecar
// containers first), that requests the vendor's resource, and so does
// Attribution. HAMi has written three shapes of list: one entry per app
// container (before its PR #1650), one per container, init containers
// first (after), and recently no entry at all for a container without the
// vendor's devices; counting non-empty entries reads all three alike.
package hami
