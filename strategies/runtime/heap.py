"""`freeze_loaded`: what a process loaded before decoding, kept out of the cyclic garbage collector's scans.

Why: Python's full collection walks every tracked object, and a process that has loaded torch,
transformers and a model holds hundreds of thousands of them, so that one full collection costs
as much as many decode steps. Decoding itself triggers few (its tensors die young), but objects that
survive do: a Lookahead trie counting each batch's new prompts (tens of thousands of nodes), which
one strategy instance keeps for an actor's life, triggers full collections that would take a large
share of its decoding time. Frozen (`gc.freeze`), the modules and models loaded so far are never
scanned again, and a full collection walks what decoding keeps alive. They stay alive for the
process's life anyway: an actor keeps its models until it ends, and garbage among them in cycles is
collected first.
"""

from __future__ import annotations

import gc


def freeze_loaded() -> None:
    """Collect what is garbage now, then move every object alive into the collector's permanent generation."""
    gc.collect()
    gc.freeze()
