"""``python -m schedswitchd.profile``: see :mod:`schedswitchd.cli.profile_cmd`."""

from schedswitchd.cli.profile_cmd import main

raise SystemExit(main())
