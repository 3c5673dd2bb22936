"""Developer tooling: the Debian sid kernel cache and the sched_ext VM harness.

Not part of the installed daemon; the Makefile, tests and benchmarks import it from the
repository root.
"""
