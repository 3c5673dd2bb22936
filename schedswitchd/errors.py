"""The exception hierarchy: one root, one branch per floor.

Every error carries a message a user can act on. The daemon maps each branch to a reply
code (``SchedSwitchError.code``), so the branches are part of the wire contract.
"""

from __future__ import annotations


def unreadable(exc: OSError, expected: str) -> str:
    """Why a file could not be opened or read, and what was expected there, without the
    file's path: the caller names the path once, in its own words. ``exc.strerror`` (e.g.
    ``No such file or directory``, from errno) is used rather than ``str(exc)``, which
    repeats the path (``[Errno 2] No such file or directory: '/x.o'``).
    -> ``"No such file or directory (expected a BPF ELF object)"``."""
    reason = exc.strerror or type(exc).__name__
    return f"{reason} (expected {expected})"


class SchedSwitchError(Exception):
    """Root of every error schedswitchd raises on purpose.

    ``code`` is the stable, machine-readable name sent to socket clients. ``verifier_log``
    is the BPF verifier's text (``BPF_PROG_LOAD``'s ``log_buf``, ``include/uapi/linux/bpf.h``)
    when the error comes from a program the kernel refused, on whichever branch carries it
    (:class:`BpfSyscallError`, a loader's ``ProgramLoadError``, a :class:`LoadError` that
    wraps one, a daemon's error reply), else ``None``: every caller reads it without asking
    the error's class.
    """

    code = "internal"
    verifier_log: str | None = None


# --- bpf/ (pure) ---------------------------------------------------------------------------


class BtfError(SchedSwitchError):
    """Malformed or unsupported BTF (kernel doc ``Documentation/bpf/btf.rst``).

    ``where`` names the place: a byte offset, a type id or a section, as a short string.
    """

    code = "btf"

    def __init__(self, message: str, *, where: str | None = None) -> None:
        self.where = where
        super().__init__(f"{message} (at {where})" if where else message)


class ObjectError(SchedSwitchError):
    """A BPF ELF object that cannot be understood (bad sections, symbols, relocations)."""

    code = "object"


class CoreError(SchedSwitchError):
    """A CO-RE relocation that cannot be resolved consistently (e.g. ambiguous candidates)."""

    code = "core"


class CustomizationError(ObjectError):
    """A pre-load edit of an object spec that does not fit (unknown variable, bad value)."""

    code = "customization"


class ProfileError(SchedSwitchError):
    """A scheduler profile that does not validate, does not fit its object, or whose value
    expressions cannot be evaluated; names the file and the dotted key."""

    code = "profile"


# --- kernel/ ---------------------------------------------------------------------------------


class KernelError(SchedSwitchError):
    """Something the running kernel refused or lacks."""

    code = "kernel"


class BpfSyscallError(KernelError):
    """A ``bpf(2)`` command failed.

    Attributes: ``command`` (e.g. ``"BPF_PROG_LOAD"``), ``errno`` (int), ``errno_name``
    (e.g. ``"EINVAL"``), ``verifier_log`` (the verifier's text for program loads, else
    ``None``) and ``kernel_log`` (kernel log lines about the failure read from
    ``/dev/kmsg`` during the call, e.g. ``TCP: x does not implement required ops``; empty
    when none were found or the log is not readable).
    """

    code = "bpf_syscall"

    def __init__(
        self,
        command: str,
        errno: int,
        message: str,
        *,
        verifier_log: str | None = None,
        kernel_log: tuple[str, ...] = (),
    ) -> None:
        import errno as errno_mod

        self.command = command
        self.errno = errno
        self.errno_name = errno_mod.errorcode.get(errno, str(errno))
        self.verifier_log = verifier_log
        self.kernel_log = kernel_log
        super().__init__(f"{command} failed with {self.errno_name}: {message}")


class LoadError(KernelError):
    """An object could not be loaded (missing kfunc, struct_ops mismatch, verifier, ...)."""

    code = "load"


class RegistryError(KernelError):
    """The kernel BTF registry could not find or read a BTF it was asked for."""

    code = "registry"


class SchedExtError(KernelError):
    """sched_ext did not reach the expected state (see ``/sys/kernel/sched_ext``)."""

    code = "sched_ext"


# --- daemon/ ---------------------------------------------------------------------------------


class ConfigError(SchedSwitchError):
    """A configuration file that does not validate; names the file, key and reason."""

    code = "config"


class ExecutableError(SchedSwitchError):
    """A scheduler run as its own executable that could not be started, or that exited (or
    never got the kernel to enable it) before the kernel ran it; names the program, its
    exit status or signal, and how long it ran."""

    code = "executable"


class ProtocolError(SchedSwitchError):
    """A socket request that does not parse or is not allowed."""

    code = "protocol"


# --- desktop/ --------------------------------------------------------------------------------


class BusUnavailableError(SchedSwitchError):
    """A D-Bus bus that cannot be used: no bus at its address, or a bus name another
    connection owns; the message names the address or the owner."""

    code = "dbus"
