"""Reference workloads: real training loops the orchestrator launches and the probes time."""
