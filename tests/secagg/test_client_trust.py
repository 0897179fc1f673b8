"""A node's SecAgg+ trust comes from its own config, read strictly."""

from __future__ import annotations

import pytest

from privfed.secagg.client_trust import SECAGG_MAX_CORRUPT, TrustMissing, max_corrupt_of


@pytest.mark.parametrize("given, read", [(None, 0), (0, 0), (2, 2), ("3", 3)])
def test_max_corrupt_is_a_whole_number_from_the_node_config(given, read):
    node = {} if given is None else {SECAGG_MAX_CORRUPT: given}
    assert max_corrupt_of(node) == read


@pytest.mark.parametrize("given", [-1, 1.9, "1.5", "two", True])
def test_a_max_corrupt_that_is_negative_or_not_whole_is_refused_not_rounded(given):
    """A fraction read as its floor would let a node count one corrupt client too few towards K_min."""
    with pytest.raises(TrustMissing, match=SECAGG_MAX_CORRUPT):
        max_corrupt_of({SECAGG_MAX_CORRUPT: given})
