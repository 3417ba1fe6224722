"""Lookahead: draft trees retrieved from a trie of n-grams shared by every row an actor decodes.

After the Lookahead method of Zhao et al. (Ant Group). The trie holds every substring, up to
`max_query_length + branch_length` tokens, of the prompts (counted per row, so a finished row's
prompt counts leave with it) and of the generated outputs (counted globally, streamed in as rows
decode). To draft, the longest suffix of the row's context (at most `max_query_length` tokens) that
the trie holds is looked up, and the most frequent continuations below it are gathered best-first
into a tree of at most `decoding_length` nodes and `branch_length` depth (`hier`), or the single
most frequent branch is followed (`one`). A row's own prompt counts `own_prompt_weight` times a
count from another row or from outputs. When the trie passes `max_nodes`, output counts decay and
nodes no longer counted are pruned.

First, by default, prompt lookup (`prompt_lookup.PromptLookupProposer`, with its own sizing): a
row whose own context holds a match worth drafting gets its chain, and the trie's tree fills the
rest of the node budget around it (`drafts.merge_drafts`). The two find different drafts: prompt
lookup copies from the latest occurrence of a suffix in the row's own text, long and exact where
code repeats itself, and its sizing drafts nothing where such copies have not paid; the trie ranks
the continuations of every row and output by count. One verify forward checks both guesses, so
the same node budget accepts more tokens a step.
"""

from __future__ import annotations

import dataclasses
import gc
import heapq
import itertools
import time
from collections import deque
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from strategies.base import GenerationParams
from strategies.proposers.prompt_lookup import PromptLookupProposer
from strategies.runtime.target_states import TargetStates
from strategies.verification.drafts import Draft, merge_drafts
from strategies.verification.proposer import ProposalContext, Proposer


class _Node:
    __slots__ = ("children", "freq", "prompt", "prompt_total")

    def __init__(self) -> None:
        self.children: dict[int, _Node] = {}
        self.freq = 0.0  # occurrences in generated outputs (decayed on pruning)
        self.prompt: dict[int, int] = {}  # active row -> occurrences in its prompt
        self.prompt_total = 0

    def score(self, row: int, own_weight: float) -> float:
        own = self.prompt.get(row, 0)
        return self.freq + self.prompt_total - own + own_weight * own


@contextmanager
def _collector_paused() -> Iterator[None]:
    """Counting a row creates thousands of trie nodes, and each few hundred allocations would start
    Python's cyclic collector over a heap that holds the model's modules, which would take most of
    the time of counting. Trie nodes form no cycles; reference counting frees pruned ones."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


class TokenTrie:
    """Counts of token substrings up to `depth` long; prompts counted per row, outputs globally."""

    def __init__(self, depth: int, max_nodes: int, decay: float = 0.5) -> None:
        self.depth = depth
        self.max_nodes = max_nodes
        self.decay = decay
        self.root = _Node()
        self.num_nodes = 0
        self._row_nodes: dict[int, list[_Node]] = {}

    def insert(self, tokens: Sequence[int], starts: range, row: int | None = None) -> None:
        """Count the substrings `tokens[s : s + depth]` (and their prefixes) for each start s.

        `row=None` counts output text; a row id counts that row's prompt until `release(row)`.
        """
        touched = self._row_nodes.setdefault(row, []) if row is not None else None
        with _collector_paused():
            self._count(tokens, starts, row, touched)
        if self.num_nodes > self.max_nodes:
            self.prune()

    def _count(self, tokens: Sequence[int], starts: range, row: int | None, touched: list[_Node] | None) -> None:
        for start in starts:
            node = self.root
            for token in tokens[start : start + self.depth]:
                child = node.children.get(token)
                if child is None:
                    child = node.children[token] = _Node()
                    self.num_nodes += 1
                node = child
                if row is None:
                    node.freq += 1.0
                else:
                    node.prompt[row] = node.prompt.get(row, 0) + 1
                    node.prompt_total += 1
                    touched.append(node)

    def release(self, row: int) -> None:
        """Drop the prompt counts of a finished row."""
        for node in self._row_nodes.pop(row, []):
            count = node.prompt.pop(row, 0)
            node.prompt_total -= count

    def find(self, suffix: Sequence[int]) -> _Node | None:
        node = self.root
        for token in suffix:
            node = node.children.get(token)
            if node is None:
                return None
        return node

    def prune(self) -> None:
        """Decay output counts and drop nodes no count keeps alive, until 10% under the cap (or only
        nodes of active prompts are left)."""
        target = int(self.max_nodes * 0.9)
        while self.num_nodes > target:
            before = self.num_nodes
            self._decay_and_drop(self.root)
            if self.num_nodes == before and not self._has_output_counts(self.root):
                break

    def _has_output_counts(self, node: _Node) -> bool:
        return any(child.freq > 0 or self._has_output_counts(child) for child in node.children.values())

    def _decay_and_drop(self, node: _Node) -> None:
        for token, child in list(node.children.items()):
            child.freq *= self.decay
            self._decay_and_drop(child)
            if not child.children and child.prompt_total == 0 and child.freq < 1.0:
                del node.children[token]
                self.num_nodes -= 1


def gather_tree(start: _Node, row: int, own_weight: float, max_nodes: int, max_depth: int, mode: str) -> Draft:
    """The best continuations below `start` as a draft tree, parents before children."""
    tokens: list[int] = []
    parents: list[int] = []
    if mode == "one":
        node = start
        while node.children and len(tokens) < min(max_nodes, max_depth):
            token, node = max(node.children.items(), key=lambda item: item[1].score(row, own_weight))
            parents.append(len(tokens) - 1)
            tokens.append(token)
        return Draft(tokens, parents)
    order = itertools.count()  # breaks score ties by insertion order: deterministic
    heap = [
        (-child.score(row, own_weight), next(order), token, child, -1, 1) for token, child in start.children.items()
    ]
    heapq.heapify(heap)
    while heap and len(tokens) < max_nodes:
        _, _, token, node, parent, depth = heapq.heappop(heap)
        index = len(tokens)
        tokens.append(token)
        parents.append(parent)
        if depth < max_depth:
            for child_token, child in node.children.items():
                heapq.heappush(heap, (-child.score(row, own_weight), next(order), child_token, child, index, depth + 1))
    return Draft(tokens, parents)


@dataclass
class _LookaheadRow:
    trie_row: int  # the row's id in the trie, under which its prompt is counted
    context: list[int]  # prompt and generated tokens, the pending one last
    counted_from: int  # first output substring not yet counted in the trie
    prompt_length: int  # the context's length when the row started: its prompt, counted per row
    prompt_counted: bool = False  # counted at the row's first proposal


class LookaheadProposer(Proposer[_LookaheadRow]):
    """Drafts trees from one `TokenTrie` per actor; it outlives batches, so it warms over a job.

    It counts nothing until it proposes: a row's prompt is counted at the first proposal the row
    takes part in, and the outputs of finished rows wait in `pending` until the next proposal. The
    trie a proposal reads is the same as if every count had been made at once, and an actor whose
    controller keeps Lookahead off (at batch 32 counting a row costs as much as decoding it) pays
    only for keeping the last `max_nodes` finished output tokens.
    """

    name = "lookahead"
    MODES = ("hier", "one")  # what it implements; `strategies.methods.lookahead` offers the same

    def __init__(
        self,
        decoding_length: int,
        branch_length: int,
        max_query_length: int,
        mode: str = "hier",
        max_nodes: int = 200_000,
        own_prompt_weight: float = 3.0,
        lookup: PromptLookupProposer | None = None,  # tried first for every row; None: the trie alone
    ) -> None:
        if mode not in self.MODES:
            raise ValueError(f"lookahead mode {mode!r} is unknown; available: {', '.join(self.MODES)}")
        self.decoding_length = decoding_length
        self.branch_length = branch_length
        self.max_query_length = max_query_length
        self.mode = mode
        self.own_prompt_weight = own_prompt_weight
        self.trie = TokenTrie(max_query_length + branch_length, max_nodes)
        self._next_row = itertools.count()
        self.pending: deque[list[int]] = deque()  # finished rows' outputs not counted yet, oldest first
        self._pending_tokens = 0
        self.lookup = lookup

    @property
    def drafts_trees(self) -> bool:
        """Mode `one` drafts a single branch: a chain, sized as chains are."""
        return self.mode != "one"

    def new_row_state(self, context: list[int]) -> _LookaheadRow:
        # The row's context when it starts counts as its prompt; outputs are counted from the first
        # substring that reaches past it.
        return _LookaheadRow(
            next(self._next_row), list(context), max(0, len(context) - self.trie.depth + 1), len(context)
        )

    def start(self, contexts: list[list[int]], params: GenerationParams, states: TargetStates | None) -> None:
        super().start(contexts, params, states)
        if self.lookup is not None:
            self.lookup.start(contexts, params, states)

    def add_rows(self, contexts: list[list[int]], states: TargetStates | None) -> None:
        super().add_rows(contexts, states)
        if self.lookup is not None:
            self.lookup.add_rows(contexts, states)

    def propose(self, context: ProposalContext) -> list[Draft]:
        began = time.perf_counter()
        counting = bool(self.pending) or not all(row.prompt_counted for row in self.rows)
        while self.pending:
            output = self.pending.popleft()
            self.trie.insert(output, range(len(output)))
        self._pending_tokens = 0
        for row in self.rows:
            if not row.prompt_counted:
                self.trie.insert(row.context[: row.prompt_length], range(row.prompt_length), row=row.trie_row)
                row.prompt_counted = True
        self.setup_s = time.perf_counter() - began if counting else 0.0  # once per row: outputs, prompts
        for row in self.rows:
            self._count_outputs(row)
        nodes = min(self.decoding_length, context.max_nodes)
        copied = self._copied(context, nodes)
        return [  # the trie is searched only where the chain leaves room in the node budget
            draft
            if len(draft.tokens) >= nodes
            else merge_drafts(draft, self._retrieve(row.trie_row, row.context, budget, nodes), nodes)
            for row, budget, draft in zip(self.rows, context.budgets, copied, strict=True)
        ]

    def _copied(self, context: ProposalContext, nodes: int) -> list[Draft]:
        """Per row, prompt lookup's chain (empty where it finds none worth drafting), within the row's
        budget and the tree's node limit."""
        if self.lookup is None:
            return [Draft.empty() for _ in self.rows]
        budgets = [min(budget, nodes, self.branch_length) for budget in context.budgets]
        return self.lookup.propose(dataclasses.replace(context, budgets=budgets))

    def _count_outputs(self, row: _LookaheadRow) -> None:
        """Count the row's whole output substrings (`depth` long) not counted yet; the rest wait for
        more tokens, or for the row's end (`_finish`)."""
        end = len(row.context) - self.trie.depth + 1
        if end > row.counted_from:
            self.trie.insert(row.context, range(row.counted_from, end))
            row.counted_from = end

    def _retrieve(self, row: int, ctx: list[int], budget: int, nodes: int) -> Draft:
        if budget <= 0:
            return Draft.empty()
        for m in range(min(self.max_query_length, len(ctx)), 0, -1):
            node = self.trie.find(ctx[len(ctx) - m :])
            if node is not None and node.children:
                depth = min(self.branch_length, budget)
                return gather_tree(node, row, self.own_prompt_weight, nodes, depth, self.mode)
        return Draft.empty()

    def emitted(self, emitted: list[list[int]], states: TargetStates | None) -> None:
        for row, tokens in zip(self.rows, emitted, strict=True):
            row.context.extend(tokens)
        if self.lookup is not None:
            self.lookup.emitted(emitted, states)

    def keep_rows(self, rows: list[int]) -> None:
        kept = set(rows)
        for i, row in enumerate(self.rows):
            if i not in kept:  # finished: its output substrings wait for the next proposal; its prompt goes
                self._finish(row)
        super().keep_rows(rows)
        if self.lookup is not None:
            self.lookup.keep_rows(rows)

    def _finish(self, row: _LookaheadRow) -> None:
        output = row.context[row.counted_from :]
        if output:
            self.pending.append(output)
            self._pending_tokens += len(output)
        while self._pending_tokens > self.trie.max_nodes and len(self.pending) > 1:
            self._pending_tokens -= len(self.pending.popleft())
        self.trie.release(row.trie_row)

    def stats(self) -> dict[str, float]:
        return {"trie_nodes": self.trie.num_nodes}
