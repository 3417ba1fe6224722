"""Strategy options: the `strategy` section of a job's config, owned here beside the strategies.

Options of one strategy nest under its name (`strategy.specdec.top_beta`); options shared by
several strategies sit directly under `strategy` (`strategy.num_speculative_tokens`). Every field
carries its help text, which `accelgen generate --help` prints.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SpecDecOptions:
    top_beta: int = field(
        default=3, metadata={"help": "SpecDec β: a draft token is acceptable if among the target's top-β tokens…"}
    )
    tolerance: float = field(
        default=1.0,
        metadata={"help": "…and its target logit is within this gap of the top-1 logit (β=1, 0: exact greedy)."},
    )


@dataclass
class PromptLookupOptions:
    max_ngram: int = field(default=3, metadata={"help": "Longest suffix n-gram looked up in the row's context."})
    min_ngram: int = field(default=1, metadata={"help": "Shortest suffix n-gram tried before giving up."})


@dataclass
class LookaheadOptions:
    decoding_length: int = field(default=16, metadata={"help": "Most draft tree nodes verified per row and step."})
    branch_length: int = field(default=8, metadata={"help": "Deepest draft branch (tokens a step can accept)."})
    max_query_length: int = field(
        default=6, metadata={"help": "Longest context suffix matched in the trie (longest match first)."}
    )
    mode: str = field(default="hier", metadata={"help": "hier: a tree of the best continuations; one: one branch."})
    max_nodes: int = field(
        default=300_000, metadata={"help": "Trie size cap per actor; beyond it output counts decay and prune."}
    )
    own_prompt_weight: float = field(
        default=3.0, metadata={"help": "Weight of a count from the row's own prompt vs other rows and outputs (1)."}
    )


@dataclass
class StrategyOptions:
    name: str = field(
        default="autoregressive", metadata={"help": "Decoding strategy; an unknown name lists the available ones."}
    )
    num_speculative_tokens: int = field(
        default=4, metadata={"help": "Draft tokens proposed per step (chain length) by drafting strategies."}
    )
    adaptive: bool = field(
        default=True,
        metadata={"help": "Let the controller turn speculation off where it does not pay and size drafts."},
    )
    candidates: list[str] = field(
        default_factory=list,
        metadata={"help": "Drafting strategies `auto` chooses among. Empty: every lossless one whose models exist."},
    )
    specdec: SpecDecOptions = field(default_factory=SpecDecOptions)
    prompt_lookup: PromptLookupOptions = field(default_factory=PromptLookupOptions)
    lookahead: LookaheadOptions = field(default_factory=LookaheadOptions)
