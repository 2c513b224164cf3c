//go:build tools

// Package tools keeps `go mod tidy` from dropping the binary we build.
package tools

import _ "sigs.k8s.io/kueue/cmd/kueue"
