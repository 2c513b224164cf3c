// Command testbed-pause is the real-node testbed's sandbox image: it holds a Pod's
// namespaces and does nothing until SIGTERM or SIGINT, like registry.k8s.io/pause,
// so no registry is needed. Static (CGO_ENABLED=0), it is the image's only file.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	// As PID 1 of the sandbox it also reaps the orphans that end up with it.
	signal.Ignore(syscall.SIGCHLD)
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	<-stop
}
