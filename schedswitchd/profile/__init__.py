"""Scheduler profiles: what a scheduler's own user space does around loading its BPF
object, as data (``docs/profiles.md``).

Pure, like :mod:`schedswitchd.bpf`: the model (:mod:`.model`), its safe expression
language (:mod:`.expr`), the topology read from a given sysfs root (:mod:`.topology`),
resolution for one machine (:mod:`.resolve`) and the edits of an object spec before load
(:mod:`.apply`). The steps between load and attach run in the kernel floor
(:mod:`schedswitchd.kernel.sched_ext.profile_steps`).
"""
