"""The kernel's sched_ext: its sysfs view, a scheduler's exit record, its pins and the steps a
switch takes around load and link.

- :mod:`.sysfs`: ``/sys/kernel/sched_ext`` (state, the running ops' name, counters);
- :mod:`.exit_info`: a scheduler's own record of why it ended (the ``uei`` variable);
- :mod:`.scheduler_pins`: bpffs pins that keep a scheduler alive across a daemon restart;
- :mod:`.profile_steps`: a profile's plan carried out between load and link;
- :mod:`.rcu_expedite`: expedited RCU grace periods for the length of a switch.

Source: ``kernel/sched/ext.c`` and ``Documentation/scheduler/sched-ext.rst``.
"""
