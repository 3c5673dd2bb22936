"""The daemon's D-Bus faces (``[dbus]``, ``docs/desktop.md``): ``org.scx.Loader`` and the
desktop's other services, driving the daemon through
:class:`schedswitchd.daemon.control.DaemonControl`.

Imported only when the configuration has a ``[dbus]`` table (by the daemon's entry point,
:mod:`schedswitchd.daemon.service`): a daemon without it loads no D-Bus library. The D-Bus
library is sdbus (libsystemd's sd-bus, asyncio-native); why that one: ``docs/desktop.md``.
"""
