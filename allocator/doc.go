// Package allocator turns the device allocations that centralized
// schedulers record in pod annotations into model.Devices, and decides which
// container of the pod each device is reported on. It is pure: no I/O, no
// clock, the same input always gives the same output, so the proxy's List
// and Get, which both call it, always agree.
//
// One Format per scheduler's annotation format, each in a package of its
// own (koordinator, hami, volcano, tensorfusion; parse holds what they
// share), built by name by registry.NewFormats, is gathered in a Set, which
// is the decoder the store calls (state/decode.Decoder) and the attribution
// policy the proxy calls (Assign). Translate gives ids to devices an
// allocator named by number only, from the node's inventory, when they are
// answered; package devids spells the ids as consumers match them.
//
// # Limits
//
// Set.Decode refuses, as malformed, the devices of an allocator that would
// take the pod past the limit on device ids (Set.LimitDevicesPerPod). Every
// decoder is linear in its annotation's length (duplicate checks are maps),
// so a 256 KiB annotation naming thousands of VFs is read and refused
// quickly.
//
// # Not read
//
// In-flight keys (-devices-to-allocate), scheduling bookkeeping, HAMi's
// hami.io/kunlun-allocated (no writer's format checked; Kunlunxin devices
// come from hami.io/xpu-devices-allocated), and Koordinator's other hint
// fields and adapter annotations. A VF's minor (0..n, left out when 0) is
// not reported. HAMi's Cambricon MLU ids (<node>-cambricon-mlu-<n>) are
// names HAMi makes up; they replace the kubelet's, which are the device
// plugin's own and name no card either, so that a container shows the card
// HAMi chose and its sharers the same one.
//
// # Several allocators
//
// Every decoder reads only its own keys, so enabling all of them costs
// nothing for pods of one scheduler. A pod carrying two allocators'
// annotations for one device shows it once per container and resource (the
// merge never repeats an id there), but may show it on two containers if the
// allocators attribute it differently.
//
// # Attribution
//
// Koordinator allocates per pod, but the kubelet reports devices per
// container, and consumers (DCGM labels metrics with the container name) need
// the container that uses them. Set.Assign decides, given the pod spec
// (init, sidecar and app containers in spec order):
//
//   - A device with ContainerIndex (per-container allocators) goes to the
//     index-th container of its ContainerScope: every container that
//     requests it by its decoder's Wants, init containers included, in spec
//     order (ScopeRequestingAll: HAMi), or the app containers that request
//     it (ScopeRequesting: Volcano vGPU). If the container is a plain init
//     container the device is dropped, because the kubelet never reports
//     init containers and the device was not the other containers'; if the
//     index is out of range the device falls through to the pod-level policy
//     below.
//   - Pod-level devices are grouped by kind (allocator, type, resource). The
//     requesting containers of a kind are the sidecars and app containers
//     whose requests Want it; plain init containers never request.
//   - None requests: the first app container gets them all (never a sidecar,
//     which the kubelet lists first, nor an init container).
//   - Exactly one requests: it gets them all.
//   - Several request: a Shared device goes to every container that asks
//     for a share; each other device goes to one container asking whole
//     devices, in container order, as many as it asks for; what is left goes
//     to every container asking a share if there is one (they share it),
//     else to the last requesting container. A Shared device when nobody asks
//     a share is handed out like the others.
//   - A device the allocator gave to a named container (Device.Container:
//     TensorFusion's container-gpus) goes to that container; a name the
//     spec lacks falls through to the pod-level policy.
//
// Each container's devices keep the order of the input.
//
// # Trust
//
// Decoding believes nothing: any tenant can write any annotation on its own
// pod. Package trust decides which decoded devices are reported, asking a
// format what only it knows through the interfaces of gate.go.
package allocator
