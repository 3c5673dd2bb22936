"""Command-line front ends. ``schedswitchctl`` is :func:`schedswitchd.cli.ctl.main`; each
command family lives in its own module and registers its sub-parsers there."""
