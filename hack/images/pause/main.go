// pause: the sandbox ("pause") container of the real test node's pods
// (hack/realnode.sh, containerd's sandbox_image). It holds the pod's
// namespaces, reaps orphaned children, and exits on SIGINT or SIGTERM.
// Built statically by hack/images.sh; it needs nothing from a registry.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sig := make(chan os.Signal, 8)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for s := range sig {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			var ws syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
