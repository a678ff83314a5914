"""The in-graph greedy head (engine/fast_path/greedy_head.py) against torch's argmax and
isfinite, in Triton's CPU interpreter."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before any kernel module is imported

import pytest
import torch

from inferd.engine.fast_path.availability import has_triton
from inferd.engine.fast_path.greedy_head import CHUNK, greedy_with_flag, greedy_with_flag_reference

pytestmark = pytest.mark.skipif(
    not has_triton() or os.environ.get("TRITON_INTERPRET") != "1",
    reason="needs triton (pip) with TRITON_INTERPRET=1 for its CPU interpreter",
)


@pytest.mark.parametrize("rows,vocab", [(1, 3 * CHUNK + 517), (3, CHUNK), (5, 1000)])
def test_tokens_and_flag_match_torch(rows, vocab):
    logits = torch.randn(rows, vocab, generator=torch.Generator().manual_seed(rows))
    packed = greedy_with_flag(logits)
    assert packed.dtype == torch.int64 and packed.shape == (rows + 1,)
    assert packed.tolist() == greedy_with_flag_reference(logits).tolist()
    assert packed[0].item() == 1


def test_ties_take_the_first_index_across_lanes_and_chunks():
    logits = torch.zeros(3, 2 * CHUNK + 10)
    logits[0, [7, 7 + 1024, CHUNK + 3]] = 5.0  # same lane of the block, later block, later chunk
    logits[1, [CHUNK + 9, 2 * CHUNK + 1]] = 2.0  # first maximum in the second chunk
    logits[2, [2 * CHUNK + 9, 1]] = 1.0  # the last chunk's and the first's: the first wins
    assert greedy_with_flag(logits)[1:].tolist() == [7, CHUNK + 9, 1]


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_a_non_finite_logit_of_a_live_row_clears_the_flag(bad):
    logits = torch.randn(4, 2 * CHUNK + 1)
    logits[2, CHUNK + 5] = bad
    assert greedy_with_flag(logits)[0].item() == 0
    live = torch.tensor([1, 1, 0, 1])  # row 2 is padding: its logits are not checked
    packed = greedy_with_flag(logits, live)
    assert packed[0].item() == 1
    assert packed[[1, 2, 4]].tolist() == logits[[0, 1, 3]].argmax(dim=-1).tolist()
    live[2] = 7  # any non-zero entry is live
    assert greedy_with_flag(logits, live)[0].item() == 0


def test_half_precision_and_strided_rows():
    wide = torch.randn(2, 3000).to(torch.bfloat16)
    logits = wide[:, :2500]  # rows strided by 3000
    assert greedy_with_flag(logits).tolist() == greedy_with_flag_reference(logits).tolist()


@pytest.mark.parametrize(
    "logits,live,match",
    [
        (torch.zeros(4), None, "logits must be"),
        (torch.zeros(0, 5), None, "logits must be"),
        (torch.zeros(2, 5, dtype=torch.int64), None, "floating point"),
        (torch.zeros(2, 5), torch.ones(3), "live must be"),
    ],
)
def test_bad_input_is_refused_by_name(logits, live, match):
    with pytest.raises(ValueError, match=match):
        greedy_with_flag(logits, live)
