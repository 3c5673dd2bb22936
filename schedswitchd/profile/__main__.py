"""``python -m schedswitchd.profile``: see :mod:`schedswitchd.cli.profile_cmd`. A closed
output pipe (``| head``) ends it quietly with status 141 (:func:`schedswitchd.entry.run_entry`)."""

from schedswitchd.cli.profile_cmd import main
from schedswitchd.entry import run_entry

raise SystemExit(run_entry(main, None))
