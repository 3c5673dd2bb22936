"""``python -m schedswitchd.bpf.btf PATH [--base BASE]``: the BTF of a file as bpftool-shaped
JSON on stdout (:func:`schedswitchd.bpf.btf.json_dump.main`)."""

from schedswitchd.bpf.btf.json_dump import main

raise SystemExit(main())
