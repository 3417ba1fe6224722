"""What a drafter's test asserts besides the tokens: the drafter drafted the whole batch.

Exact verification makes the output the target's whatever a drafter proposes, and the loop turns a
proposer that raises off and decodes plainly (`strategies.verification.speculative`): a broken drafter
still emits the right tokens. Only the batch's statistics (`strategies.verification.metrics`) tell.
"""

from __future__ import annotations

from strategies.verification.control import AUTOREGRESSIVE


def assert_drafted(stats: dict, *, every_step: bool = False, tau_at_least: float | None = None) -> None:
    """No fault and no refused draft, some tokens drafted; with `every_step` (a drafter that always finds
    something), every step but maybe the last verifies a draft: a plain step comes only where no row
    has room for a draft token, which ends the batch. `tau_at_least`: the batch's τ floor."""
    assert not stats["faults"], f"a drafter raised and was turned off: {stats['faults']}"
    assert stats["fallbacks"] == 0, f"{stats['fallbacks']} drafts refused as invalid"
    assert stats["draft_tokens"] > 0, "nothing was drafted"
    if every_step:
        plain = stats["steps_by_drafter"].get(AUTOREGRESSIVE, 0)
        assert plain <= 1, f"{plain} plain steps where every step but the last should verify a draft"
    if tau_at_least is not None:
        assert stats["tau"] >= tau_at_least, f"τ {stats['tau']} below its floor {tau_at_least}"
