//go:build tools

// Package tools keeps `go mod tidy` from dropping the binary we build.
package tools

import _ "github.com/rancher/local-path-provisioner"
