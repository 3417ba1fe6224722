"""Strategy options: the `strategy` section of a job's config, owned here beside the strategies.

Options of one strategy nest under its name (`strategy.specdec.top_beta`); options shared by
several strategies sit directly under `strategy` (`strategy.num_speculative_tokens`). Every field
carries its help text, which `accelgen generate --help` prints.
"""

from __future__ import annotations

from dataclasses import dataclass, field

DRAFTERS = ("draft_model", "cmlm")  # what the speculative and specdec strategies draft with

# A numeric key's check: (key, value, whether the value is within bounds, what it must be).
Bound = tuple[str, object, bool, str]


def out_of_bounds(bounds: list[Bound]) -> list[str]:
    """For each bound not met, a message naming the key, what it must be and the value given (a NaN
    compares false, so it is out of every bound)."""
    return [f"{key} must be {need}, got {value!r}" for key, value, ok, need in bounds if not ok]


@dataclass
class SpeculativeOptions:
    drafter: str = field(
        default="draft_model",
        metadata={
            "help": f"One of {DRAFTERS}. draft_model: model.draft drafts k tokens, one forward each; cmlm: "
            "model.cmlm fills k masked tokens in one forward (verified exactly)."
        },
    )


@dataclass
class SpecDecOptions:
    drafter: str = field(
        default="draft_model",
        metadata={
            "help": f"One of {DRAFTERS}. cmlm: SpecDec's own non-autoregressive drafter (model.cmlm), k tokens in "
            "one forward; draft_model: model.draft, one forward per token."
        },
    )
    top_beta: int = field(
        default=3, metadata={"help": "SpecDec β: a draft token is acceptable if among the target's top-β tokens…"}
    )
    tolerance: float = field(
        default=1.0,
        metadata={"help": "…and its target logit is within this gap of the top-1 logit (β=1, 0: exact greedy)."},
    )


PROMPT_LOOKUP_SIZINGS = ("acceptance", "fixed")


@dataclass
class PromptLookupOptions:
    max_ngram: int = field(default=3, metadata={"help": "Longest suffix n-gram looked up in the row's context."})
    min_ngram: int = field(default=1, metadata={"help": "Shortest suffix n-gram tried before giving up."})
    max_speculative_tokens: int = field(
        default=10,
        metadata={
            "help": "Longest draft (never below strategy.num_speculative_tokens). 10: the reference prompt-lookup "
            "decoding's draft length."
        },
    )
    sizing: str = field(
        default="acceptance",
        metadata={
            "help": f"One of {PROMPT_LOOKUP_SIZINGS}. acceptance: the batch's drafts are cut to the depth their "
            "kinds of match (in the row's own output or its prompt, n tokens long) have paid for, up to "
            "max_speculative_tokens; fixed: "
            "strategy.num_speculative_tokens, which the controller lengthens where drafts keep being accepted."
        },
    )
    draft_step_cost: float = field(
        default=1.35,
        metadata={
            "help": "sizing=acceptance: a step drafting one token over a plain step, until the controller has "
            "measured it (always with strategy.adaptive=false). 1.35: batch 1 on a 2-core CPU (bench costs=true)."
        },
    )
    draft_token_cost: float = field(
        default=0.07,
        metadata={"help": "sizing=acceptance: each draft token more, over a plain step, until measured (as above)."},
    )


LOOKAHEAD_MODES = ("hier", "one")


@dataclass
class LookaheadOptions:
    decoding_length: int = field(
        default=8,
        metadata={
            "help": "Most draft tree nodes verified per row and step. 8: the fastest of 2, 4, 8 and 16 at batch 1 "
            "on a 2-core CPU (bench lookahead_nodes=[2,4,8,16]; README): 16 gained τ but its wider verify cost more."
        },
    )
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
    prompt_lookup_first: bool = field(
        default=True,
        metadata={
            "help": "A row whose prompt lookup (strategy.prompt_lookup's n-grams and sizing) finds a draft worth "
            "its cost gets that chain, cut to branch_length, and the trie's best nodes around it up to "
            "decoding_length; the other rows the trie's tree alone. false: the trie alone."
        },
    )


# Medusa's default tree: 8 nodes over 3 heads, the paths of highest estimated acceptance first. Measured on
# a 2-core CPU against trees of 3, 5, 16 and 32 nodes (README, "Draft heads"): wider trees accept more per
# step (τ 2.15 at 8 nodes, 2.38 at 32) but a verify forward costs more per node than they gain.
MEDUSA_TREE = [[0], [0, 0], [1], [0, 0, 0], [2], [0, 1], [1, 0], [3]]
MEDUSA_ACCEPTANCE = ("exact", "typical")


@dataclass
class MedusaOptions:
    choices: list[list[int]] = field(
        default_factory=lambda: [list(p) for p in MEDUSA_TREE],
        metadata={
            "help": "Tree of candidates: paths of ranks, [0, 1] = top-1 of head 0, then top-2 of head 1 below it; "
            "most valuable first, each path after its prefix (a smaller node budget keeps the first ones)."
        },
    )
    acceptance: str = field(
        default="exact",
        metadata={
            "help": f"One of {MEDUSA_ACCEPTANCE}. exact: lossless; typical: Medusa's typical rule (lossy at "
            "temperature > 0; exact matching at temperature 0, as Medusa's reference)."
        },
    )
    typical_epsilon: float = field(
        default=0.09, metadata={"help": "Typical acceptance ε: accept x when p(x) > min(ε, δ·exp(−H(p)))."}
    )
    typical_delta: float = field(default=0.3, metadata={"help": "Typical acceptance δ (about √ε in the paper)."})


EAGLE_TREES = ("dynamic", "static", "chain")


@dataclass
class EagleOptions:
    tree: str = field(
        default="static",
        metadata={
            "help": f"One of {EAGLE_TREES}. static: EAGLE-1's fixed tree, the `nodes` paths of ranks below top_k "
            "most likely under a fixed chance per rank (0.6 · 0.4^rank), every node of a depth expanded in one "
            "pass; dynamic: EAGLE-2's tree, grown top_k nodes wide by cumulative draft confidence and reranked "
            "to the node budget; chain: the head's top-1 token at each depth. static at 8 nodes: the fastest of "
            "the three at 8 and 16 nodes and batch 1, 8 and 32 with the shipped head (README, 'EAGLE's defaults')."
        },
    )
    depth: int = field(default=5, metadata={"help": "Deepest draft path: draft steps of the head per step."})
    top_k: int = field(
        default=4,
        metadata={"help": "dynamic: children per expanded node, and nodes expanded per depth; static: ranks below it."},
    )
    nodes: int = field(
        default=8,
        metadata={
            "help": "dynamic, static: most draft nodes verified per row and step (the controller may verify fewer "
            "where its cost model says a wide verify forward does not pay: the dynamic tree keeps the most "
            "confident, the static tree its first)."
        },
    )


@dataclass
class BlockwiseOptions:
    top_k: int = field(
        default=1,
        metadata={
            "help": "Accept a drafted token when it is among the target's top-k. 1: exact (lossless); "
            ">1: lossy, greedy only."
        },
    )


JACOBI_MODES = ("pj", "pgj", "hgj")
JACOBI_INITS = ("pad", "repeat", "retrieval")


@dataclass
class JacobiOptions:
    mode: str = field(
        default="pgj",
        metadata={"help": "pj: the whole output is one block; pgj: blocks of block_size in turn; hgj: pgj then plain."},
    )
    block_size: int = field(default=8, metadata={"help": "Tokens guessed and refined together (pgj, hgj)."})
    init: str = field(
        default="retrieval",
        metadata={"help": "First guess of an unseen position: pad (EOS id), repeat (last tokens), retrieval (lookup)."},
    )


@dataclass
class SelfSpeculativeOptions:
    exit_layer: int = field(
        default=3,
        metadata={
            "help": "The draft is the target's first exit_layer layers and its exit head there (model.exits "
            "must have one); verification reuses those layers' keys and values."
        },
    )
    min_confidence: float = field(
        default=0.0,
        metadata={
            "help": "A row's draft stops after a token whose exit probability is below this (Draft & Verify's "
            "adaptive draft length): unlikely tokens cost draft steps and verify width. 0: drafts run full length."
        },
    )


@dataclass
class MaskPredictOptions:
    iterations: int = field(
        default=10,
        metadata={
            "help": "T: passes of the CMLM per block. Pass t >= 1 re-masks the N·(T−t)/T least confident tokens and "
            "predicts them again."
        },
    )
    length_beam: int = field(
        default=1,
        metadata={
            "help": "l: the l most likely block lengths are each decoded; the one of highest mean log-probability "
            "is kept (costs l times the compute)."
        },
    )
    max_length: int = field(
        default=0,
        metadata={
            "help": "Longest block, in tokens (0: the CMLM's own, cmlm.json max_length). Longer outputs are decoded "
            "block after block, each conditioned on the ones before."
        },
    )


CALM_MEASURES = ("softmax", "gap", "state", "classifier")
CALM_BATCH_EXITS = ("row", "batch")


@dataclass
class CalmOptions:
    threshold: float = field(
        default=0.8,
        metadata={
            "help": "λ: exit after a layer once its confidence reaches λ_t = λ·(0.9 + 0.1·exp(−τ·t/N)) (decay_tau). "
            "Every measure's confidence is at most 1 and can be exactly 1, and λ_t falls towards λ·(0.9 + "
            "0.1·exp(−τ)) late in the output, so λ just above 1 still exits late tokens; λ ≥ 1/(0.9 + "
            "0.1·exp(−τ)) never exits (the target's own greedy output): 1.1089 at τ = 4, 1 at τ = 0. "
            "The default (with measure softmax) is the shipped exits' calibrated setting: the shallowest mean "
            "exit layer keeping 95% of tokens equal to the full model's greedy choice on training-split "
            "prompts (96.5% on the held-out half), from `accelgen calibrate calm "
            "jobs/configs/calibrate_calm.yaml`; calibrate again for other exits or prompts."
        },
    )
    measure: str = field(
        default="softmax",
        metadata={
            "help": f"One of {CALM_MEASURES}: the exit's top probability, its top-1 minus top-2 probability, the "
            "cosine between the states before and after the layer, or the exits' trained classifier. The "
            "default is calibrated with threshold (see strategy.calm.threshold)."
        },
    )
    decay_tau: float = field(
        default=4.0,
        metadata={"help": "Threshold at output token t of N: λ·(0.9 + 0.1·exp(−τ·t/N)), as in CALM. 0: constant."},
    )
    min_layer: int = field(default=1, metadata={"help": "Exits before this many layers are never taken."})
    batch_exit: str = field(
        default="row",
        metadata={
            "help": f"One of {CALM_BATCH_EXITS}. row: each row exits at its own layer (exited rows skip the layers' "
            "MLP); batch: the whole batch exits together once every row passes (CALM's reference rule)."
        },
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
    allow_lossy_candidates: bool = field(
        default=False,
        metadata={
            "help": "Let strategy.candidates name lossy strategies (specdec, medusa with typical acceptance, "
            "blockwise top-k). `auto` picks them by timing, so a row's tokens may differ from run to run."
        },
    )
    speculative: SpeculativeOptions = field(default_factory=SpeculativeOptions)
    specdec: SpecDecOptions = field(default_factory=SpecDecOptions)
    prompt_lookup: PromptLookupOptions = field(default_factory=PromptLookupOptions)
    lookahead: LookaheadOptions = field(default_factory=LookaheadOptions)
    medusa: MedusaOptions = field(default_factory=MedusaOptions)
    blockwise: BlockwiseOptions = field(default_factory=BlockwiseOptions)
    eagle: EagleOptions = field(default_factory=EagleOptions)
    jacobi: JacobiOptions = field(default_factory=JacobiOptions)
    self_speculative: SelfSpeculativeOptions = field(default_factory=SelfSpeculativeOptions)
    calm: CalmOptions = field(default_factory=CalmOptions)
    mask_predict: MaskPredictOptions = field(default_factory=MaskPredictOptions)
