"""The bounded LRU: order, both bounds, counters."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from schedswitchd.kernel.lru import BoundedLru


def test_hits_misses_and_recency_order() -> None:
    lru: BoundedLru[str, int] = BoundedLru(max_entries=3, max_bytes=1000)
    for i, k in enumerate("abc"):
        lru.put(k, i, 10)
    assert lru.get("a") == 0  # a becomes most recent
    assert lru.get("zz") is None
    assert lru.put("d", 3, 10) == ["b"]
    assert lru.ordered_keys() == ["c", "a", "d"]
    s = lru.stats()
    assert (s.hits, s.misses, s.evictions, s.entries, s.bytes_held) == (1, 1, 1, 3, 30)


def test_byte_bound_evicts_oldest_until_it_fits() -> None:
    lru: BoundedLru[str, str] = BoundedLru(max_entries=10, max_bytes=100)
    lru.put("a", "A", 40)
    lru.put("b", "B", 40)
    lru.put("c", "C", 10)
    assert lru.put("d", "D", 60) == ["a", "b"]
    assert lru.ordered_keys() == ["c", "d"] and lru.bytes_held == 70


def test_oversized_value_is_rejected_and_drops_old_value() -> None:
    lru: BoundedLru[str, str] = BoundedLru(max_entries=10, max_bytes=100)
    lru.put("a", "old", 10)
    assert lru.put("a", "huge", 101) == []
    assert "a" not in lru and lru.stats().rejected == 1 and lru.bytes_held == 0


def test_replace_same_key_updates_bytes() -> None:
    lru: BoundedLru[str, str] = BoundedLru(max_entries=2, max_bytes=100)
    lru.put("a", "x", 30)
    lru.put("a", "y", 50)
    assert lru.peek("a") == "y" and lru.bytes_held == 50 and len(lru) == 1


def test_pop_and_clear_count_invalidations() -> None:
    lru: BoundedLru[str, str] = BoundedLru(max_entries=5, max_bytes=100)
    for k in "abc":
        lru.put(k, k, 5)
    assert lru.pop("b") == "b" and lru.pop("b") is None
    assert lru.clear() == 2
    s = lru.stats()
    assert (s.invalidations, s.entries, s.bytes_held) == (3, 0, 0)


def test_get_with_validator_drops_invalid_entry() -> None:
    lru: BoundedLru[str, int] = BoundedLru(max_entries=5, max_bytes=100)
    lru.put("a", 1, 10)
    assert lru.get("a", valid=lambda v: v == 1) == 1
    assert lru.get("a", valid=lambda v: v == 2) is None
    s = lru.stats()
    assert "a" not in lru and (s.hits, s.misses, s.invalidations, s.bytes_held) == (1, 1, 1, 0)


def test_bad_bounds() -> None:
    with pytest.raises(ValueError):
        BoundedLru(max_entries=0, max_bytes=1)
    lru: BoundedLru[str, str] = BoundedLru(max_entries=1, max_bytes=1)
    with pytest.raises(ValueError):
        lru.put("a", "a", -1)


@given(
    st.integers(1, 6),
    st.integers(1, 200),
    st.lists(st.tuples(st.sampled_from("abcdefgh"), st.integers(0, 120), st.booleans())),
)
def test_bounds_always_hold(
    max_entries: int, max_bytes: int, ops: list[tuple[str, int, bool]]
) -> None:
    lru: BoundedLru[str, int] = BoundedLru(max_entries=max_entries, max_bytes=max_bytes)
    for key, size, is_get in ops:
        if is_get:
            lru.get(key)
        else:
            lru.put(key, size, size)
        s = lru.stats()
        assert s.entries <= max_entries and s.bytes_held <= max_bytes
        held = lru.ordered_keys()
        assert s.bytes_held == sum(lru.peek(k) or 0 for k in held)
