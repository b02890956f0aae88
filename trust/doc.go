// Package trust decides which decoded allocations are believed. The
// decoders only read what an annotation says; any tenant can write any
// annotation on its own pod, and the proxy's answer moves hardware between
// pods (Multus hands the listed VF to the pod's network, Kata cold-plugs the
// listed devices, DCGM attributes GPUs). So a decoded device is reported only
// when the Gate lets it through (gate.go: the pod's scheduler, its requests,
// the ids' shape, the node's inventory), and an exclusive device only on the
// pod that claimed it first (holders.go). What only an allocator's format
// knows (its schedulers, which devices are exclusive, how many a pod may
// hold) the gate asks through allocator.Set, never naming a format.
// Everything refused is returned with a reason (Gate.VetPod, pod.go), which
// the caller records in the pod's record, logs and counts once per change
// (Gate.Report).
package trust
