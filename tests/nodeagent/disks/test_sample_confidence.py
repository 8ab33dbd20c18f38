"""The confidence a wipe's sampled read-back states (nodeagent/disks/wipe.py): computed, not
asserted: a residue on the stated fraction of a disk's blocks escapes the sampler's distinct
random blocks with at most the stated chance (exact hypergeometric bound)."""
import math

from hypothesis import given, settings
from hypothesis import strategies as st

from nodeagent.disks.backend import VERIFY_SAMPLES
from nodeagent.disks.wipe import BLOCK, fixed_offsets, sample_confidence, sample_offsets


def test_the_default_count_states_a_tenth_of_a_percent_at_95_percent():
    blocks = 2 * 1024 ** 4 // BLOCK                           # a 2 TB lease disk
    stated = sample_confidence(VERIFY_SAMPLES - 3, blocks=blocks)
    assert stated["level"] == 0.95 and 0.00099 < stated["min_fraction"] <= 0.001
    assert "0.100% or more" in stated["statement"] and "95% confidence" in stated["statement"]
    assert sample_confidence(100, blocks=50)["statement"] == "every block of the disk was read back"
    assert sample_confidence(0, blocks=10 ** 6)["level"] == 0.0


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 4000), st.integers(10_000, 10 ** 9))
def test_a_residue_of_the_stated_fraction_escapes_every_sample_at_most_as_often_as_stated(n, blocks):
    """The exact chance that n distinct random blocks of `blocks` all miss a residue of
    ceil(p * blocks) blocks (hypergeometric, as the sampler draws without replacement) is
    within 1 - level for the stated p."""
    stated = sample_confidence(n, blocks=blocks)
    residue = math.ceil(stated["min_fraction"] * blocks)
    miss = 1.0
    for i in range(n):                      # C(blocks - residue, n) / C(blocks, n)
        miss *= (blocks - residue - i) / (blocks - i)
    assert miss <= 1 - stated["level"] + 1e-9


def test_the_sampler_reads_the_fixed_blocks_and_the_asked_count_of_distinct_ones():
    size = 100_000 * BLOCK
    offsets = sample_offsets(size, VERIFY_SAMPLES)
    assert len(offsets) == len(set(offsets)) == VERIFY_SAMPLES
    assert set(fixed_offsets(size)) <= set(offsets) and all(o % BLOCK == 0 and o < size for o in offsets)
