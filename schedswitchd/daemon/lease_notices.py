"""What the daemon says of its leases: a log line when one comes into force or ends, and
its changes on the feed (``lease_added``, ``lease_ended``; :mod:`~schedswitchd.daemon.feed`),
each lease's in that order.

A lease's ``lease_added`` may be held back: a standby hit's reply does not wait for the
publication, which comes once its client took the reply (docs/performance.md, "Standby
hit"). A lease that ends first is announced just before its end.
"""

from __future__ import annotations

import logging

from schedswitchd.daemon.feed import ChangeFeed
from schedswitchd.daemon.policy import Lease

log = logging.getLogger("schedswitchd")


class LeaseNotices:
    """The log lines and feed changes of one server's leases, published on ``feed``. On the
    event loop only."""

    def __init__(self, feed: ChangeFeed) -> None:
        self.feed = feed
        #: Leases :meth:`added` without announcing them yet.
        self._unannounced: dict[str, Lease] = {}

    def added(self, lease: Lease, *, announce: bool = True) -> None:
        """``lease`` was made: announced now, or with ``announce`` False held back until
        :meth:`announce` or its end."""
        self._unannounced[lease.id] = lease
        if announce:
            self.announce(lease.id)

    def announce(self, lease_id: str) -> None:
        """Publish ``lease_added`` for a lease :meth:`added` held back; nothing if it was
        published already."""
        lease = self._unannounced.pop(lease_id, None)
        if lease is not None:
            self.feed.publish(
                "lease_added",
                lease=lease.id,
                workload=lease.workload,
                uid=lease.owner_uid,
                pid=lease.pid,
            )

    def in_force(self, lease: Lease, scheduler: str) -> None:
        """A hint's lease is in force (its hint answered): announced if it was not, and
        logged with the scheduler its rule wants (journal fields ``LEASE``,
        ``SCHEDULER``)."""
        self.announce(lease.id)
        log.info(
            "lease %s: %s for uid %d pid %s",
            lease.id,
            lease.workload,
            lease.owner_uid,
            lease.pid if lease.pid is not None else "-",
            extra={"LEASE": lease.id, "SCHEDULER": scheduler},
        )

    def ended(self, lease: Lease, why: str) -> None:
        """``lease`` ended (``why``): logged, announced first if it was not (a watcher sees
        it added before it ends), then ``lease_ended``."""
        log.info("lease %s ended: %s", lease.id, why, extra={"LEASE": lease.id})
        self.announce(lease.id)
        self.feed.publish(
            "lease_ended",
            lease=lease.id,
            workload=lease.workload,
            uid=lease.owner_uid,
            why=why,
        )
