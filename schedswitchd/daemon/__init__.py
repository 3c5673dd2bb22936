"""The service: socket server, wire models, leases and policy, switcher, systemd glue."""
