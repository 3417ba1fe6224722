"""The base proposer keeps one record per row: made as rows start and join, selected as rows finish."""

from __future__ import annotations

from dataclasses import dataclass

from strategies.base import GenerationParams
from strategies.runtime.sampling import SamplingParams
from strategies.verification.proposer import Proposer


@dataclass
class _Seen:
    context: list[int]
    first: int


class _Recorder(Proposer[_Seen]):
    name = "recorder"

    def new_row_state(self, context: list[int]) -> _Seen:
        return _Seen(list(context), context[0])


def _params() -> GenerationParams:
    return GenerationParams(4, SamplingParams(), eos_token_ids=frozenset(), ignore_eos=True)


def test_rows_are_made_joined_and_kept_in_batch_order():
    proposer = _Recorder()
    params = _params()
    proposer.start([[1, 2], [3]], params, None)
    assert proposer.params is params
    assert proposer.rows == [_Seen([1, 2], 1), _Seen([3], 3)]
    proposer.add_rows([[4, 5, 6]], None)
    assert [r.first for r in proposer.rows] == [1, 3, 4]
    kept = proposer.rows[2]
    proposer.keep_rows([2, 0])
    assert [r.first for r in proposer.rows] == [4, 1] and proposer.rows[0] is kept
    proposer.add_rows([[7], [8]], None)
    assert [r.first for r in proposer.rows] == [4, 1, 7, 8]
    proposer.keep_rows([])
    assert proposer.rows == []


def test_a_new_batch_starts_from_no_rows():
    proposer = _Recorder()
    proposer.start([[1], [2]], _params(), None)
    proposer.start([[9]], _params(), None)
    assert proposer.rows == [_Seen([9], 9)]
