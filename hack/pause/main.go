// Command pause is the sandbox ("infra") process of the test node's pods: it
// holds the pod's namespaces open, reaps the zombies of processes that end up
// as its children (it is PID 1 when the pod shares its PID namespace) and
// exits cleanly on SIGINT or SIGTERM. With -ignore-sigterm it keeps running
// through SIGTERM, as a container that ignores it does until the kubelet
// kills it at the end of its grace period (the cluster suite's force-deleted
// pod). hack/build-node.sh packs it into the
// OCI image that containerd pins for sandboxes, since the test node has no
// image registry to pull the real one from.
package main

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "-v" {
		fmt.Println("pause (podres-proxy test node)")
		return
	}
	ignoreTerm := len(os.Args) > 1 && os.Args[1] == "-ignore-sigterm"
	signals := make(chan os.Signal, 8)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for s := range signals {
		switch {
		case s == syscall.SIGCHLD:
			reap()
		case s == syscall.SIGTERM && ignoreTerm:
		default:
			os.Exit(0)
		}
	}
}

// reap collects every child that has exited, so none stays a zombie.
func reap() {
	for {
		var status syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil)
		if pid <= 0 || err != nil {
			return
		}
	}
}
