"""The configuration of a private D-Bus system bus (``dbus-daemon --config-file``), shaped
like Debian's ``/usr/share/dbus-1/system.conf``: every name's ownership and every method
call denied but what a policy file (its ``system.d`` and the files given) opens, so that the
shipped ``dbus/org.scx.Loader.conf`` is what lets the daemon own its name. The desktop
tests' buses (``tests/desktop/buses.py``) and ``make demo``'s bus use it.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

#: Debian's system bus policy files (polkitd's lets it own org.freedesktop.PolicyKit1).
SYSTEM_POLICY_DIR = "/usr/share/dbus-1/system.d"

_SYSTEM_CONF = """<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>system</type>
  <auth>EXTERNAL</auth>
  <listen>{listen}</listen>
  <policy context="default">
    <allow user="*"/>
    <deny own="*"/>
    <deny send_type="method_call"/>
    <allow send_type="signal"/>
    <allow send_requested_reply="true" send_type="method_return"/>
    <allow send_requested_reply="true" send_type="error"/>
    <allow receive_type="method_call"/>
    <allow receive_type="method_return"/>
    <allow receive_type="error"/>
    <allow receive_type="signal"/>
    <allow send_destination="org.freedesktop.DBus" send_interface="org.freedesktop.DBus"/>
    <allow send_destination="org.freedesktop.DBus"
           send_interface="org.freedesktop.DBus.Introspectable"/>
    <allow send_destination="org.freedesktop.DBus"
           send_interface="org.freedesktop.DBus.Properties"/>
  </policy>
  <policy user="root">
    <allow send_destination="org.freedesktop.DBus"
           send_interface="org.freedesktop.DBus.Monitoring"/>
  </policy>
  <includedir>{system_d}</includedir>
{includes}
</busconfig>
"""


def system_bus_conf(
    listen: str,
    policies: Iterable[Path | str] = (),
    system_d: str = SYSTEM_POLICY_DIR,
    service_dirs: Iterable[Path | str] = (),
) -> str:
    """The configuration text: listening at ``listen`` (a D-Bus server address, e.g.
    ``unix:path=/x/socket`` or ``unix:tmpdir=/tmp``), with ``system_d``'s policy files and
    then ``policies`` included, and activation files read from ``service_dirs``."""
    includes = "\n".join(
        [
            *(f"  <include>{p}</include>" for p in policies),
            *(f"  <servicedir>{d}</servicedir>" for d in service_dirs),
        ]
    )
    return _SYSTEM_CONF.format(listen=listen, system_d=system_d, includes=includes)
