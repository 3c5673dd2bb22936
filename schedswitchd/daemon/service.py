"""``schedswitchd``: the service entry point (configuration, systemd glue, main loop).

- Configuration: ``--config`` (default ``$SCHEDSWITCHD_CONFIG`` or
  ``/etc/schedswitchd/schedswitchd.toml``); ``--print-schema`` prints its JSON Schema;
  ``--check-config`` validates it and checks every scheduler (see
  :mod:`schedswitchd.daemon.check_config`), exit 0 only if all are fine.
- Socket: the one passed by systemd socket activation (``sd_listen_fds(3)`` through
  ``systemd.daemon.listen_fds``), else its own at ``[socket] path`` with ``mode``/``group``.
- Notifications (``sd_notify(3)``): ``READY=1`` once serving, ``STATUS=`` after every
  reconcile pass, ``WATCHDOG=1`` every half ``WATCHDOG_USEC`` while the reconcile loop is
  alive, ``STOPPING=1`` on SIGTERM/SIGINT. SIGHUP reloads the configuration.
- Logging: to the journal with structured fields (``SCHEDULER``, ``LEASE``, ``SWITCH_NS``,
  ``EXIT_KIND``) when stderr is the journal (``$JOURNAL_STREAM``, ``systemd.exec(5)``),
  else plain text on stderr.
- Kernel side: the real backend (:func:`schedswitchd.daemon.kernel_backend.create_backend`);
  :func:`main` takes another ``(Config) -> SchedulerBackend`` factory from Python callers
  (the tests' fake), not from the command line.
- Extra faces: :func:`main` and :func:`serve` take a :class:`FaceStarter`, started when the
  configuration has a ``[dbus]`` table. The ``schedswitchd`` command (:mod:`schedswitchd.app`)
  passes the D-Bus faces of ``desktop/``; this floor never imports them.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import grp
import importlib
import json
import logging
import os
import signal
import socket
import stat
import sys
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from schedswitchd import __version__
from schedswitchd.daemon.launcher_wire import DEFAULT_SOCKET
from schedswitchd.daemon.memory_tuning import (
    disable_transparent_hugepages,
    limit_malloc_arenas,
    skip_pydantic_plugins,
)
from schedswitchd.errors import ConfigError, SchedSwitchError

# The daemon's heavy imports (asyncio, pydantic, the loader: most of its resident set) happen
# in main(), after it opted out of transparent huge pages (schedswitchd.daemon.memory_tuning;
# docs/performance.md, "Memory").
if TYPE_CHECKING:
    from schedswitchd.daemon.backend import SchedulerBackend
    from schedswitchd.daemon.config import Config
    from schedswitchd.daemon.control import DaemonControl
    from schedswitchd.daemon.server import Server

DEFAULT_CONFIG = "/etc/schedswitchd/schedswitchd.toml"

log = logging.getLogger("schedswitchd")


def _systemd(name: str) -> Any:
    # By import_module: the repo's systemd/ directory of unit files would otherwise shadow
    # the systemd-python package for the type checker.
    return importlib.import_module(f"systemd.{name}")


BackendFactory = Callable[["Config"], "SchedulerBackend"]


class StartedFaces(Protocol):
    """Faces a :class:`FaceStarter` started: :meth:`close` stops them all."""

    async def close(self) -> None:
        """Release the faces' names and stop their tasks; called once, before the server
        closes."""


class FaceStarter(Protocol):
    """Starts the daemon's extra faces on the in-process interface once the server serves
    (the ``schedswitchd`` command's: the D-Bus faces, :mod:`schedswitchd.app`); a face that
    cannot start is the starter's to log and leave out, the socket serves on regardless."""

    async def __call__(self, control: DaemonControl, /) -> StartedFaces:
        """Start the configured faces on ``control``; the started ones, to be closed at stop."""
        ...


# --- systemd glue -------------------------------------------------------------------------------


def notify(state: str) -> bool:
    """``sd_notify(0, state)``; False when not run by systemd (no ``$NOTIFY_SOCKET``)."""
    if not os.environ.get("NOTIFY_SOCKET"):
        return False
    return bool(_systemd("daemon").notify(state))


def watchdog_interval_s() -> float | None:
    """Half of ``$WATCHDOG_USEC`` in seconds if the watchdog is meant for this process."""
    usec = os.environ.get("WATCHDOG_USEC")
    pid = os.environ.get("WATCHDOG_PID")
    if not usec or (pid and pid != str(os.getpid())):
        return None
    try:
        return int(usec) / 2e6
    except ValueError:
        return None


def under_journal() -> bool:
    """True if stderr is connected to the journal (``$JOURNAL_STREAM`` is ``dev:ino`` of it)."""
    value = os.environ.get("JOURNAL_STREAM", "")
    try:
        device, inode = (int(x) for x in value.split(":"))
        st = os.fstat(2)
    except (ValueError, OSError):
        return False
    return (st.st_dev, st.st_ino) == (device, inode)


class JournalFieldsHandler(logging.Handler):
    """Sends records to the journal with ``PRIORITY``, ``SYSLOG_IDENTIFIER`` and every
    upper-case ``extra=`` field of the record (e.g. ``SCHEDULER``, ``SWITCH_NS``)."""

    _PRIORITY: ClassVar[dict[int, int]] = {
        logging.DEBUG: 7,
        logging.INFO: 6,
        logging.WARNING: 4,
        logging.ERROR: 3,
        logging.CRITICAL: 2,
    }

    def __init__(self, send: Callable[..., Any] | None = None) -> None:
        super().__init__()
        if send is None:
            send = _systemd("journal").send
        self._send = send

    def emit(self, record: logging.LogRecord) -> None:
        """Send ``record`` to the journal: its message, ``PRIORITY`` from its level, the
        upper-case extra fields as journal fields; a failed send is handled as
        :meth:`logging.Handler.handleError` does."""
        try:
            fields = {k: str(v) for k, v in record.__dict__.items() if k.isupper() and k.isascii()}
            message = self.format(record)
            self._send(
                message,
                PRIORITY=str(self._PRIORITY.get(record.levelno, 6)),
                SYSLOG_IDENTIFIER="schedswitchd",
                CODE_FILE=record.pathname,
                CODE_LINE=record.lineno,
                CODE_FUNC=record.funcName,
                **fields,
            )
        except Exception:
            self.handleError(record)


def setup_logging(config: Config) -> None:
    """Journal or plain-text logging per ``[logging]``."""
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    mode = config.logging.journal
    handler: logging.Handler
    if mode == "yes" or (mode == "auto" and under_journal()):
        handler = JournalFieldsHandler()
        handler.setFormatter(logging.Formatter("%(message)s"))
    else:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("schedswitchd: %(levelname)s: %(message)s"))
    root.addHandler(handler)
    root.setLevel(config.logging.level.upper())


# --- socket -------------------------------------------------------------------------------------


def activated_socket() -> socket.socket | None:
    """The socket systemd passed (exactly one listening ``AF_UNIX`` stream), else ``None``.

    Raises :class:`ConfigError` if systemd passed something else.
    """
    if "LISTEN_FDS" not in os.environ:
        # Not socket-activated (sd_listen_fds(3) would find nothing): leave libsystemd and
        # its libraries unloaded unless the journal or sd_notify needs them (their resident
        # pages: docs/performance.md, "Memory").
        return None
    daemon = _systemd("daemon")
    fds: list[int] = daemon.listen_fds()  # also unsets $LISTEN_FDS so children do not inherit it
    if not fds:
        return None
    if len(fds) != 1 or not daemon.is_socket_unix(fds[0], socket.SOCK_STREAM, 1):
        raise ConfigError(
            f"socket activation passed {len(fds)} fds; want one listening AF_UNIX stream socket"
        )
    return socket.socket(fileno=fds[0])


def own_socket(path: str, mode: int, group: str | int | None) -> socket.socket:
    """Bind and listen at ``path`` (replacing a stale socket file, never a live one or a
    non-socket), then apply ``mode`` and ``group``. Raises :class:`ConfigError`."""
    if "\0" in path:
        raise ConfigError(f"cannot bind {path!r}: the path has a NUL byte")
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        pass
    else:
        if not stat.S_ISSOCK(st.st_mode):
            raise ConfigError(f"{path} exists and is not a socket; not replacing it")
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(path)
        except OSError as exc:
            if exc.errno not in (errno.ECONNREFUSED, errno.ENOENT):
                raise ConfigError(f"{path}: {exc.strerror}") from None
            os.unlink(path)  # stale: nobody listens
        else:
            raise ConfigError(f"{path}: another schedswitchd is already listening")
        finally:
            probe.close()
    from schedswitchd.daemon.acceptor import LISTEN_BACKLOG

    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old_umask = os.umask(0o177)  # no window in which the socket is wider than asked
    try:
        sock.bind(path)
        # At once: a client that sees the path must not be refused (ECONNREFUSED)
        # while the file's mode and group are set; the umask keeps it owner-only.
        sock.listen(LISTEN_BACKLOG)
    except OSError as exc:
        sock.close()
        raise ConfigError(f"cannot bind {path}: {exc.strerror}") from None
    finally:
        os.umask(old_umask)
    bound = socket_identity(path)
    try:
        if group is not None:
            try:
                gid = group if isinstance(group, int) else grp.getgrnam(group).gr_gid
            except KeyError:
                raise ConfigError(f"{path}: [socket] group {group!r}: no such group") from None
            os.chown(path, -1, gid)
        os.chmod(path, mode)
    except (OSError, ConfigError) as exc:
        sock.close()
        unlink_own_socket(path, bound)  # the file just bound, nothing else
        if isinstance(exc, ConfigError):
            raise
        raise ConfigError(f"cannot set the mode or group of {path}: {exc.strerror}") from None
    return sock


def socket_identity(path: str) -> tuple[int, int] | None:
    """``(st_dev, st_ino)`` of the socket at ``path`` (not following a symlink), or
    ``None`` if nothing is there: what :func:`unlink_own_socket` compares with, so that
    the daemon removes only the socket file it bound."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino) if stat.S_ISSOCK(st.st_mode) else None


def unlink_own_socket(path: str, identity: tuple[int, int] | None) -> None:
    """Remove ``path`` if it is still the socket :func:`socket_identity` saw when the
    daemon bound it; a path that names something else by now (a daemon started since,
    an admin's file) is left alone. Never raises."""
    if identity is None or socket_identity(path) != identity:
        return
    with contextlib.suppress(OSError):
        os.unlink(path)


# --- main loop ---------------------------------------------------------------------------------


async def serve(
    config: Config,
    backend: SchedulerBackend,
    sock: socket.socket,
    *,
    start_faces: FaceStarter | None = None,
) -> None:
    """Run the server until SIGTERM/SIGINT; SIGHUP reloads; talks to systemd as documented.
    ``start_faces``: started on the server when ``config`` has a ``[dbus]`` table (without
    one, a ``[dbus]`` table is logged as not served)."""
    import asyncio

    from schedswitchd.daemon.reconcile import Reconciler
    from schedswitchd.daemon.server import Server

    loop = asyncio.get_running_loop()
    stop = asyncio.Event()

    def on_change(text: str) -> None:
        notify(f"STATUS={text}")

    server = Server(Reconciler(config, backend, on_change=on_change))

    reloads: set[asyncio.Task[None]] = set()

    async def reload_now() -> None:
        with contextlib.suppress(ConfigError):  # logged and shown in status by reload()
            await server.reload()

    def reload() -> None:
        task = asyncio.create_task(reload_now())
        reloads.add(task)  # a strong reference until it is done
        task.add_done_callback(reloads.discard)

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    loop.add_signal_handler(signal.SIGHUP, reload)
    await server.start(sock)
    faces: StartedFaces | None = None
    if config.dbus is not None and start_faces is None:
        log.warning("[dbus] is configured, but this entry point serves no D-Bus faces")
    elif config.dbus is not None and start_faces is not None:
        from schedswitchd.daemon.control import DaemonControl

        faces = await start_faces(DaemonControl(server))
    notify(f"READY=1\nSTATUS={server.summary()}\nMAINPID={os.getpid()}")
    log.info("schedswitchd %s ready (pid %d)", __version__, os.getpid())
    watchdog: asyncio.Task[None] | None = None
    interval = watchdog_interval_s()
    if interval is not None:
        watchdog = asyncio.create_task(_watchdog(server, interval))
    try:
        await stop.wait()
    finally:
        notify("STOPPING=1")
        if server.switcher.current is not None:
            log.info("stopping; the attached scheduler %s stays pinned", server.switcher.active)
        else:
            log.info("stopping; no scheduler is attached")
        if watchdog is not None:
            watchdog.cancel()
        if faces is not None:
            await faces.close()
        await server.close()


async def _watchdog(server: Server, interval: float) -> None:
    # Pet only while reconcile passes keep completing: a wedged worker thread or loop then
    # gets the daemon restarted by systemd, and the pinned scheduler survives that.
    import asyncio

    while True:
        await asyncio.sleep(interval)
        # A pass may legitimately wait for a detach and an attach (and a rollback).
        allowed_s = 4 * interval + 3 * server.config.limits.switch_timeout_s
        if time.monotonic_ns() - server.last_pass_ns < allowed_s * 1e9:
            notify("WATCHDOG=1")


#: ``--help``'s last paragraph (and the man page's): signals and exit statuses, as
#: :func:`_main` returns them.
_EPILOG = (
    "SIGTERM or SIGINT stops the daemon (an attached scheduler stays pinned and running);\n"
    "SIGHUP re-reads the configuration.\n"
    "\n"
    "With a [dbus] table in the configuration the daemon also serves D-Bus: org.scx.Loader\n"
    "on the system bus in place of scx_loader (polkit action org.scx.loader.manage-schedulers),\n"
    "and follows the desktop's power profile; see docs/desktop.md. It reads\n"
    "$DBUS_SYSTEM_BUS_ADDRESS as every D-Bus program does.\n"
    "\n"
    "Exit status: 0 stopped by a signal, or --print-schema, or --check-config found every\n"
    "scheduler fine; 1 --sysfs's topology does not load, --check-config found a problem\n"
    "with a scheduler, or the daemon could not start (its socket, the kernel side); 2 bad\n"
    "usage; 78 (EX_CONFIG) the configuration (the file or a drop-in in conf.d/ beside it)\n"
    "does not load, at start or with --check-config: the unit's RestartPreventExitStatus=78\n"
    "keeps systemd from restarting it until it is fixed; 141 the output pipe was closed."
)


def build_parser() -> argparse.ArgumentParser:
    """The ``schedswitchd`` argument parser (also what the man page is generated from)."""
    parser = argparse.ArgumentParser(
        prog="schedswitchd",
        description="The schedswitchd service: switches sched_ext CPU schedulers on workload "
        "hints received on its Unix socket (normally started by systemd).",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument(
        "--config",
        default=os.environ.get("SCHEDSWITCHD_CONFIG", DEFAULT_CONFIG),
        # Not %(default)s: the man page is generated from this text, and the environment
        # of whoever generates it is not the reader's.
        help=f"configuration file (default: $SCHEDSWITCHD_CONFIG or {DEFAULT_CONFIG})",
    )
    parser.add_argument("--print-schema", action="store_true", help="print the JSON Schema")
    parser.add_argument(
        "--check-config", action="store_true", help="validate and check every scheduler"
    )
    parser.add_argument(
        "--sysfs",
        metavar="ROOT",
        default="/sys",
        help="with --check-config: the sysfs tree scheduler profiles are resolved for, e.g. "
        "a copy of another machine's (default: %(default)s; another tree checks statically "
        "only, without loading into this kernel)",
    )
    parser.add_argument(
        "--vmlinux",
        metavar="BTF",
        default=None,
        help="with --check-config: the target kernel's BTF that SCX_OPS_* flags and "
        "kernel_enum() are checked against (default: the running kernel's "
        "/sys/kernel/btf/vmlinux; give a sched_ext kernel's on a host without sched_ext)",
    )
    parser.add_argument(
        "--socket",
        metavar="PATH",
        help=f"listen here instead of the config's [socket] path (default: {DEFAULT_SOCKET})",
    )
    return parser


def main(
    argv: Sequence[str] | None = None,
    *,
    backend_factory: BackendFactory | None = None,
    start_faces: FaceStarter | None = None,
) -> int:
    """Entry point; returns the process exit status (141 when the output pipe was closed,
    e.g. ``--print-schema | head``: :func:`schedswitchd.entry.run_entry`).
    ``backend_factory``: makes the kernel side from the configuration (default: the real
    backend, loader + sched_ext sysfs + pins). ``start_faces``: the extra faces a ``[dbus]``
    table starts (:func:`serve`; the ``schedswitchd`` command's are :mod:`schedswitchd.app`'s)."""
    from schedswitchd.entry import run_entry

    return run_entry(
        lambda a: _main(a, backend_factory=backend_factory, start_faces=start_faces), argv
    )


def _main(
    argv: Sequence[str] | None,
    *,
    backend_factory: BackendFactory | None = None,
    start_faces: FaceStarter | None = None,
) -> int:
    args = build_parser().parse_args(argv)  # argparse only: --help/--version exit here
    if not (args.print_schema or args.check_config):
        # Serving: tune memory for the long-running process (process-wide, so never for the
        # one-shot modes or a test calling main()): THP off before the heavy imports below,
        # one malloc arena before any thread starts, pydantic's plugin scan off before its
        # first model.
        disable_transparent_hugepages()
        limit_malloc_arenas()
        skip_pydantic_plugins()
    import asyncio

    from schedswitchd.daemon.check_config import (
        TargetBtfError,
        check_config,
        format_report,
        sched_ext_missing,
    )
    from schedswitchd.daemon.config import json_schema, load_config

    if args.print_schema:
        print(json.dumps(json_schema(), indent=2))
        return 0
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        print(f"schedswitchd: {exc}", file=sys.stderr)
        if not os.path.exists(args.config):
            print(
                "schedswitchd: name a configuration file with --config PATH or "
                "$SCHEDSWITCHD_CONFIG",
                file=sys.stderr,
            )
        return os.EX_CONFIG
    factory = backend_factory
    if factory is None:
        from schedswitchd.daemon.kernel_backend import create_backend

        factory = create_backend
    if args.check_config:
        backend: SchedulerBackend | None = None
        if args.sysfs != "/sys":
            # A tree asked for by name must be one, whether or not a scheduler has a profile
            # to resolve for it: a mistyped path would otherwise pass unnoticed.
            from schedswitchd.profile.topology import TopologyError, read_topology

            try:
                read_topology(args.sysfs)
            except TopologyError as exc:
                print(f"schedswitchd: --sysfs: {exc}", file=sys.stderr)
                return 1
            # Profiles resolved for another machine's topology: loading them here would
            # compute this machine's values instead (the backend reads /sys).
            print(f"schedswitchd: profiles resolved for {args.sysfs}; static checks only")
        else:
            try:
                backend = factory(config)
            except SchedSwitchError as exc:
                print(f"schedswitchd: kernel backend unavailable ({exc}); static checks only")
        if args.vmlinux is not None and not os.path.isfile(args.vmlinux):
            print(f"schedswitchd: --vmlinux: {args.vmlinux} is not a file", file=sys.stderr)
            return 1
        from pathlib import Path

        vmlinux = None if args.vmlinux is None else Path(args.vmlinux)
        try:
            results = check_config(config, backend, sysfs_root=args.sysfs, vmlinux=vmlinux)
        except TargetBtfError as exc:
            print(f"schedswitchd: --vmlinux: {exc}", file=sys.stderr)
            return 1
        report = format_report(
            config,
            results,
            f"{factory.__module__}.{factory.__qualname__}" if backend is not None else None,
            no_sched_ext=backend is not None and sched_ext_missing(backend),
            vmlinux=vmlinux,
        )
        print(report)
        return 0 if all(r.ok for r in results) else 1
    setup_logging(config)
    sock: socket.socket | None = None
    own_path: str | None = None
    owned: tuple[int, int] | None = None  # the socket file this daemon bound, if any
    try:
        sock = activated_socket()
        if sock is None:
            own_path = args.socket or config.socket.path
            sock = own_socket(own_path, config.socket.mode, config.socket.group)
            owned = socket_identity(own_path)
        from schedswitchd.daemon.collector import freeze_startup_objects
        from schedswitchd.daemon.exec_backend import with_executables
        from schedswitchd.daemon.reconcile import Reconciler  # noqa: F401 (frozen with the rest)
        from schedswitchd.daemon.server import Server  # noqa: F401

        # What the imports made, out of every later full collection's way; before the
        # backend and the server build their state, part of which is replaced while the
        # daemon runs and, frozen, would never be collected if cyclic (docs/performance.md,
        # "Memory").
        freeze_startup_objects()
        backend = with_executables(factory(config))
        asyncio.run(serve(config, backend, sock, start_faces=start_faces))
    except SchedSwitchError as exc:
        log.error("%s", exc)
        return 1
    finally:
        if sock is not None:
            sock.close()
        if own_path is not None:
            unlink_own_socket(own_path, owned)
    return 0


if __name__ == "__main__":
    sys.exit(main())
