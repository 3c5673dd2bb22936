"""``python -m schedswitchd.bpf.btf PATH [--base BASE]``: the BTF of a file as bpftool-shaped
JSON on stdout (:func:`schedswitchd.bpf.btf.json_dump.main`). A closed output pipe
(``| head``) ends it quietly with status 141, as the installed commands do
(:func:`schedswitchd.entry.run_entry`)."""

from schedswitchd.bpf.btf.json_dump import main
from schedswitchd.entry import run_entry

raise SystemExit(run_entry(main, None))
