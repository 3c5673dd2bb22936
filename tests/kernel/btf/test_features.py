"""BTF feature probes against the host kernel (6.18 accepts every kind)."""

from __future__ import annotations

import pytest

from schedswitchd.bpf.btf.builder import BtfBuilder
from schedswitchd.kernel.btf import features

pytestmark = pytest.mark.root


def test_modern_kernel_supports_every_probed_kind() -> None:
    feats = features.probe_btf_features()
    assert feats.missing() == ()
    assert features.btf_features() is features.btf_features()  # cached


def test_probe_reports_an_unknown_kind_as_missing() -> None:
    b = BtfBuilder()
    b.add_raw(31, "nope", 0, False, 4)  # no kernel knows BTF kind 31
    assert features.probe_btf(b.build()) is False


def test_probe_blobs_are_distinct_and_valid_btf() -> None:
    blobs = {name: make() for name, make in features.PROBES.items()}
    assert len(set(blobs.values())) == len(blobs)
    for raw in blobs.values():
        assert features.probe_btf(raw)
