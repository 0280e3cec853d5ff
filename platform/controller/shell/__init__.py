"""The controller's shell: the loop that observes (etcd, the cluster), asks the core for a decision,
commits it and carries out its effects, and runs long work (node checks, stack rounds, crash
diagnosis) off the loop, feeding the results back as observations."""
