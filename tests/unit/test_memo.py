"""The bounded process memo: the oldest entry goes first once full, a key put again stays
one entry, and what it keeps is what was put."""

from __future__ import annotations

import pytest

from fleetsim.memo import BoundedMemo


def test_oldest_entry_is_dropped_when_full():
    memo: BoundedMemo[str, int] = BoundedMemo(2)
    assert memo.put("a", 1) == 1 and memo.put("b", 2) == 2
    memo.put("a", 3)  # a key already kept: replaced in place, nothing dropped
    assert len(memo) == 2 and memo.get("a") == 3
    memo.put("c", 4)
    assert memo.get("a") is None and memo.get("b") == 2 and memo.get("c") == 4
    assert memo.values() == [2, 4]
    memo.clear()
    assert len(memo) == 0 and memo.get("b") is None


def test_it_holds_at_least_one_entry():
    with pytest.raises(ValueError, match="most must be >= 1"):
        BoundedMemo(0)
