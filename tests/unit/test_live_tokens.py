"""The live servers' token rule, prefix hashes and synthetic prompts."""

from __future__ import annotations

import pytest

from fleetsim.live.protocol import ApiError, parse_request
from fleetsim.live.tokens import (
    count_tokens,
    output_text,
    prefix_hashes,
    synthetic_prompt_ids,
    synthetic_prompt_text,
)


def test_counting_rule():
    assert count_tokens("") == 0
    assert count_tokens("the cat") == 2
    assert count_tokens("tokenizer") == 3  # toke|niz|er by runs of four
    assert count_tokens("a, b!") == 4
    assert count_tokens("".join(output_text(i) for i in range(50))) == 50


def test_prefix_hashes_are_chained_over_whole_blocks():
    a = list(range(100, 164))
    b = a[:32] + [0] + a[33:]
    ha, hb = prefix_hashes(a, 16), prefix_hashes(b, 16)
    assert len(ha) == 4 and len(prefix_hashes(a[:63], 16)) == 3
    assert ha[:2] == hb[:2] and ha[2] != hb[2]
    assert ha[3] != hb[3]  # a block's hash covers everything before it
    assert all(-(2**63) <= h < 2**63 for h in ha)
    assert prefix_hashes(["x"] * 32, 16)[0] == prefix_hashes(["x"] * 16, 16)[0]


def test_synthetic_prompts_share_exactly_the_shared_hash_blocks():
    p = synthetic_prompt_ids(1200, (1, 2, 3), 512, seed=0)
    q = synthetic_prompt_ids(1100, (1, 2, 9), 512, seed=1)
    assert len(p) == 1200 and len(q) == 1100
    assert p[:1024] == q[:1024] and p[1024:1100] != q[1024:1100]
    assert synthetic_prompt_ids(40, (), 512, seed=5) != synthetic_prompt_ids(40, (), 512, seed=6)
    assert count_tokens(synthetic_prompt_text(77, seed=3)) == 77


def test_chat_prompt_counts_the_template():
    req = parse_request("chat", {"model": "m", "messages": [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "hello there"}]}]})
    assert req.num_prompt_tokens == count_tokens(
        "<|system|>\nbe brief\n<|user|>\nhello there\n<|assistant|>\n")
    with pytest.raises(ApiError) as info:
        parse_request("chat", {"model": "m", "messages": []})
    assert info.value.status == 400 and info.value.param == "messages"
