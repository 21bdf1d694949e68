"""Central training over records: SGD (and, in later modules, DP-SGD)."""
