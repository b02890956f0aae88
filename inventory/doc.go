// Package inventory is the node's device inventory: which GPUs, RDMA NICs
// (with their SR-IOV virtual functions) and FPGAs this node has, their ids,
// minors, vendor indices and NUMA nodes.
//
// The proxy needs it for two answers the scheduler's annotations cannot
// give: the NUMA topology of each device it adds to List and Get (NFD's
// topology-updater and RTE count devices per NUMA node), and the device list
// of GetAllocatableResources. It also translates allocations that name a
// device only by minor (older Koordinator annotations) or by vendor index
// (Volcano gpushare) into the ids consumers expect.
//
// This package is the common vocabulary (Device, Snapshot, the Source
// interface) and the combining of the sources (Inventory); each source is a
// package of its own, as node-feature-discovery's source/<name>/ are, and
// serve asks them in this order of precedence:
//
//   - inventory/devicecr: Koordinator's Device object named after the node
//     (scheduling.koordinator.sh/v1alpha1, cluster-scoped), read from the API
//     server: it is what the scheduler allocated from, so its ids are the ids
//     in the pods' annotations;
//   - inventory/localfile: a local inventory file an operator writes
//     (docs/inventory.md);
//   - inventory/sysfs: PCI discovery from sysfs (and NVIDIA's procfs for GPU
//     UUIDs and minors).
//
// A device found by several sources is one device: each field comes from the
// first source, in that order, that knows it. So sysfs can supply the NUMA
// node a Device object left out, and the Device object's health wins over
// sysfs, which knows nothing of health.
//
// An Inventory keeps each source's last good answer: a source that fails
// (API server down, RBAC missing, malformed file) is logged and the others
// keep serving. Readers take an immutable Snapshot. inventory/publish writes
// it to serve's state directory for inspect and query.
package inventory
