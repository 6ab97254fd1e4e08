"""Helpers every process shares with the operating system: resource limits (`rlimits`),
descriptor passing (`fdpass`), the allocator (`malloc`), serving and stopping (`serving`), JSON
logs (`logs`), futures (`futures`), paths built from identifiers (`paths`), and bounded
Kubernetes watch streams (`kubewatch`)."""
