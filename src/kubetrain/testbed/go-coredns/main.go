// Command coredns is CoreDNS with the few plugins the testbed's cluster DNS uses:
// it answers for cluster.local from the API server and nothing else (no forward
// plugin: a name outside the cluster is refused here, never asked about elsewhere).
// Built like the other testbed binaries; a module of its own, so CoreDNS's
// requirements do not move the Kubernetes module's.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
)

func init() {
	// The order plugins run in, as in CoreDNS's plugin.cfg.
	dnsserver.Directives = []string{"bind", "health", "errors", "kubernetes"}
}

func main() {
	coremain.Run()
}
