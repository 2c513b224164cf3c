"""A real local Kubernetes control plane for tests, benchmarks and the demo.

etcd, kube-apiserver, kube-controller-manager and kube-scheduler run for real
on loopback; KWOK plays the kubelets of fake GPU nodes declared in pool files.
"""
