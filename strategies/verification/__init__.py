"""Draft, then verify: the proposer contract, draft trees, the verifier, acceptance rules, the speculative
loop, what it asks its controller and the metrics it reports."""
