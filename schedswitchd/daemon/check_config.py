"""``schedswitchd --check-config``: validate the file and vet every scheduler it names.

Two depths, and the report says which one ran for each scheduler:

- ``object``: a static look at the file with pyelftools, no kernel involved: it exists, is a
  64-bit little-endian relocatable ELF for ``EM_BPF`` (247, ``include/uapi/linux/elf-em.h``),
  holds a ``.struct_ops``/``.struct_ops.link`` section (where a sched_ext scheduler keeps
  its ``struct sched_ext_ops``), and every configured ``rodata`` tunable is a symbol in a
  ``.rodata*`` section. It also lists the modules the object declares in ``.kmod_btfs``.
- ``prepared``: additionally :meth:`SchedulerBackend.prepare` (open, CO-RE against the
  running kernel, maps and programs loaded; never attached), then ``discard``.
"""

from __future__ import annotations

import struct
import time
from dataclasses import dataclass, field

from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile
from elftools.elf.sections import SymbolTableSection

from schedswitchd.daemon.config import Config, SchedulerConfig
from schedswitchd.daemon.switcher import NO_SCHED_EXT, UNAVAILABLE, SchedulerBackend
from schedswitchd.errors import SchedSwitchError

EM_BPF = 247
ET_REL = "ET_REL"


@dataclass
class CheckResult:
    """Outcome for one scheduler. ``depth``: ``object`` or ``prepared`` (see module doc);
    ``ok``; ``problems``: one line each; ``notes``: facts found (kmods, timings)."""

    name: str
    object: str
    depth: str
    ok: bool
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def inspect_object(spec: SchedulerConfig) -> tuple[list[str], list[str]]:
    """Static checks of ``spec.object`` -> (problems, notes). Never raises for bad files."""
    problems: list[str] = []
    notes: list[str] = []
    try:
        with open(spec.object, "rb") as handle:
            elf = ELFFile(handle)
            header = elf.header
            if elf.elfclass != 64 or not elf.little_endian:
                problems.append("not a 64-bit little-endian ELF")
            if header["e_type"] != ET_REL:
                problems.append(f"ELF type is {header['e_type']}, want ET_REL (a .o file)")
            machine = header["e_machine"]
            if machine not in ("EM_BPF", EM_BPF):
                problems.append(f"ELF machine is {machine}, want EM_BPF")
            names = [s.name for s in elf.iter_sections()]
            if not any(n in (".struct_ops", ".struct_ops.link") for n in names):
                problems.append("no .struct_ops or .struct_ops.link section: not a scheduler")
            kmods = elf.get_section_by_name(".kmod_btfs")
            if kmods is not None:
                declared = [m.decode(errors="replace") for m in kmods.data().split(b"\0") if m]
                notes.append(f".kmod_btfs declares: {', '.join(declared) or '(none)'}")
            if spec.rodata:
                rodata_idx = {
                    i for i, s in enumerate(elf.iter_sections()) if s.name.startswith(".rodata")
                }
                symtab = elf.get_section_by_name(".symtab")
                symbols = set()
                if isinstance(symtab, SymbolTableSection):
                    symbols = {
                        sym.name
                        for sym in symtab.iter_symbols()
                        if isinstance(sym["st_shndx"], int) and sym["st_shndx"] in rodata_idx
                    }
                for key in spec.rodata:
                    if key not in symbols:
                        problems.append(f"rodata tunable {key!r} is not a .rodata variable")
    except FileNotFoundError:
        problems.append("object file does not exist")
    except OSError as exc:
        problems.append(f"cannot read object: {exc.strerror}")
    except (ELFError, ValueError, KeyError, IndexError, struct.error) as exc:
        # pyelftools raises assorted errors on truncated files; the message is what matters.
        problems.append(f"not a readable ELF file: {exc}")
    return problems, notes


def check_config(config: Config, backend: SchedulerBackend | None) -> list[CheckResult]:
    """Check every scheduler of an already validated ``config``; see the module docstring.
    On a kernel without sched_ext (see :func:`sched_ext_missing`) only the static checks
    run: preparing would fail on the first sched_ext kfunc for every scheduler alike."""
    results = []
    prepare = backend is not None and not sched_ext_missing(backend)
    for name, spec in config.schedulers.items():
        problems, notes = inspect_object(spec)
        depth = "object"
        if backend is not None and prepare and not problems:
            depth = "prepared"
            start = time.monotonic_ns()
            try:
                prepared = backend.prepare(name, spec)
            except SchedSwitchError as exc:
                problems.append(f"prepare failed ({exc.code}): {exc}")
                log = getattr(exc, "verifier_log", None)
                if log:
                    notes.append("verifier log:\n" + log)
            else:
                notes.append(
                    f"prepared in {(time.monotonic_ns() - start) / 1e6:.1f} ms, "
                    f"ops name {prepared.ops_name!r}"
                )
                backend.discard(prepared)
        results.append(CheckResult(name, spec.object, depth, not problems, problems, notes))
    return results


def sched_ext_missing(backend: SchedulerBackend) -> bool:
    """True if ``backend`` reports a kernel without sched_ext."""
    return backend.kernel_state().state == UNAVAILABLE


def format_report(
    config: Config,
    results: list[CheckResult],
    backend_name: str | None,
    *,
    no_sched_ext: bool = False,
) -> str:
    """The text ``--check-config`` prints: the file, what was checked, one block per
    scheduler. ``no_sched_ext``: the kernel has no sched_ext, said first."""
    lines = [f"{config.source}: configuration is valid"]
    if no_sched_ext:
        lines.insert(0, f"NOTE: {NO_SCHED_EXT}")
        lines.append(
            "checked: object files statically (ELF64 EM_BPF relocatable, struct_ops section, "
            "rodata tunables); NOT checked: CO-RE and loading, which need sched_ext"
        )
    elif backend_name is None:
        lines.append(
            "checked: object files statically (ELF64 EM_BPF relocatable, struct_ops section, "
            "rodata tunables); NOT checked: CO-RE against the running kernel and loading "
            "(no kernel backend available)"
        )
    else:
        lines.append(f"checked: object files statically, then prepared with {backend_name}")
    for result in results:
        verdict = "ok" if result.ok else "FAILED"
        lines.append(f"  {result.name}: {verdict} [{result.depth}] {result.object}")
        lines.extend(f"    problem: {problem}" for problem in result.problems)
        lines.extend(f"    {note}" for note in result.notes)
    if not results:
        lines.append("  (no schedulers configured)")
    return "\n".join(lines)
