"""Proposers: one file per way of drafting below each row's pending token, all verified by `strategies.verification`."""
