// Command pause is the sandbox ("infra") process of the test node's pods: it
// holds the pod's namespaces open, reaps the zombies of processes that end up
// as its children (it is PID 1 when the pod shares its PID namespace) and
// exits cleanly on SIGINT or SIGTERM. hack/build-node.sh packs it into the
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
	signals := make(chan os.Signal, 8)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for s := range signals {
		if s == syscall.SIGCHLD {
			reap()
			continue
		}
		os.Exit(0)
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
