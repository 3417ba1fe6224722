"""Structured outputs (`generation.response_format`): every token a constrained row emits is one its
grammar allows, chosen as plain decoding chooses among those tokens, and every lossless drafter emits
constrained plain decoding's tokens (float64, batch 1 and 8 of mixed prompt lengths and mixed formats,
some rows unconstrained)."""

from __future__ import annotations

import dataclasses
import json
import math

import jsonschema
import pyarrow as pa
import pytest
import test_logit_controls as controls
import torch
from job_config import job_config
from mixed_prompts import PROMPTS
from scripted_proposer import ScriptedProposer
from transformers import AutoTokenizer

from pipeline.checks import validate
from pipeline.driver import worker_spec
from pipeline.errors import JobError
from pipeline.fingerprint import LATER_KEYS
from strategies import registry
from strategies.base import GenerationParams, LogitControls, RowRequest
from strategies.constraints.drafts import kept_nodes, prune, reached_masks, slot_masks, with_forced
from strategies.constraints.formats import FormatError, canonical
from strategies.constraints.grammars import GrammarCache
from strategies.constraints.masks import apply, biases, constrain, new_bitmasks
from strategies.control.controller import AdaptiveController
from strategies.decoders.autoregressive import AutoregressiveStrategy
from strategies.options import StrategyOptions
from strategies.runtime.batch import ruled_logits
from strategies.runtime.logit_controls import next_token_logits
from strategies.runtime.sampling import SamplingParams, greedy_tokens
from strategies.verification.drafting import DraftingMethod
from strategies.verification.drafts import Draft
from strategies.verification.rules import ExactMatch
from strategies.verification.speculative import SpeculativeStrategy
from workers.common.contract import FINISH_ERROR
from workers.common.spec import WorkUnit
from workers.generator import Generator

EOS, NEW_TOKENS, LOSSLESS = controls.EOS, controls.NEW_TOKENS, controls.LOSSLESS
# The tiny float64 target and every optional model, as the sampling controls' equivalence tests build them.
model, target, models = controls.model, controls.target, controls.models
SCHEMA = {
    "type": "object",
    "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99}, "s": {"type": "string", "maxLength": 3}},
    "required": ["n", "s"],
    "additionalProperties": False,
}
FORMATS = {
    "regex": {"type": "regex", "pattern": "[a-f]{3,12}"},
    "choice": {"type": "choice", "choices": ["yes", "no", "maybe"]},
    "json_schema": {"type": "json_schema", "json_schema": {"name": "pair", "schema": SCHEMA}},
    "grammar": {"type": "grammar", "ebnf": 'start: "(" ITEM ("," ITEM)* ")"\nITEM: /[0-9]/'},
    "json_object": {"type": "json_object"},
}
# One batch: every format, and rows without any.
MIXED = [FORMATS["regex"], FORMATS["choice"], None, FORMATS["json_schema"], FORMATS["grammar"], None]
MIXED += [FORMATS["json_object"], {"type": "regex", "pattern": "(def|import) [a-z]+"}]


def unpacked(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[V] bool: the tokens one slot's bitmask [words] allows, bit by bit (bit j of word w: token 32w + j),
    a reference apart from the masks' own byte table."""
    words = bitmask.tolist()
    return torch.tensor([bool((words[t // 32] >> (t % 32)) & 1) for t in range(vocab_size)])


class TrieMatcher:
    """A grammar of literal token sequences, for tests on literal inputs: a path is allowed while it is a
    prefix of one of `sequences`."""

    ends = frozenset({EOS})

    def __init__(self, sequences: list[list[int]]) -> None:
        self.sequences, self.path = sequences, []

    def _next(self) -> set[int]:
        n = len(self.path)
        return {s[n] for s in self.sequences if len(s) > n and s[:n] == self.path}

    def accepts(self, token: int) -> bool:
        return token in self._next()

    def advance(self, token: int) -> None:
        self.path.append(token)

    def back(self, count: int) -> None:
        del self.path[len(self.path) - count :]

    def forced(self) -> list[int]:
        """The tokens that follow while exactly one may."""
        tokens = []
        while len(following := self._next_after(tokens)) == 1:
            tokens.append(following.pop())
        return tokens

    def _next_after(self, tokens: list[int]) -> set[int]:
        self.path += tokens
        following = self._next()
        self.back(len(tokens))
        return following

    def fill(self, bitmask: torch.Tensor) -> None:
        bitmask.zero_()
        for token in self._next():
            bitmask[token // 32] |= 1 << (token % 32)


def test_a_draft_keeps_the_nodes_the_grammar_allows():
    matcher = TrieMatcher([[1, 2, 3], [1, 4], [5]])
    # Tree: 1 (0) -> 2 (1) -> 3 (2), 1 -> 9 (3) -> 3 (4), 7 (5), 5 (6).
    tree = Draft([1, 2, 3, 9, 3, 7, 5], [-1, 0, 1, 0, 3, -1, -1])
    assert kept_nodes(matcher, tree) == [0, 1, 2, 6] and matcher.path == []
    pruned = prune([matcher, None], [tree, tree])
    assert (pruned[0].tokens, pruned[0].parents) == ([1, 2, 3, 5], [-1, 0, 1, -1]) and pruned[1] is tree
    chain = Draft.chain([1, 2, 7, 8])
    assert prune([matcher], [chain])[0].tokens == [1, 2]
    # Drawn with probabilities: the first refused node stays, a leaf, for the rule to reject.
    drawn = Draft.chain([1, 2, 7, 8], probs=torch.eye(10)[[1, 2, 7, 8]])
    kept = prune([matcher], [drawn])[0]
    assert kept.tokens == [1, 2, 7] and kept.probs.argmax(dim=1).tolist() == [1, 2, 7]


def test_a_row_whose_grammar_forces_its_next_tokens_drafts_them():
    """Forced tokens replace a draft that does not hold them from its root, cut to the row's limit; a
    draft holding them whole stays (it may guess beyond), as do rows with no format, no forced token,
    or a limit of 0."""
    forcing = TrieMatcher([[1, 2, 3, 4], [1, 2, 3, 5]])  # 1, 2, 3 forced; then 4 or 5
    free = TrieMatcher([[1, 2], [5]])  # nothing forced
    guess, holding = Draft.chain([1, 2]), Draft([1, 2, 3, 5, 4], [-1, 0, 1, 2, 2])
    out = with_forced([forcing, forcing, forcing, forcing, free, None], [guess] * 4 + [guess] * 2, [8, 2, 0, 8, 8, 8])
    assert [d.tokens for d in out] == [[1, 2, 3], [1, 2], [1, 2], [1, 2, 3], [1, 2], [1, 2]]
    assert out[0].parents == [-1, 0, 1] and out[1] is guess and out[2] is guess and out[4] is guess
    assert with_forced([forcing], [holding], [8])[0] is holding
    assert with_forced([None, None], [guess, guess], [8, 8]) == [guess, guess] and forcing.path == []


def test_a_drafts_main_path_goes_on_with_what_the_grammar_forces_after_it():
    """Below the leaf of the draft's main path (each node's first child from the root), the tokens the
    grammar forces after that path, cut to the row's limit; other branches and full-depth drafts stay."""
    matcher = TrieMatcher([[1, 2, 3, 4, 5], [6, 7]])  # nothing forced at the root; 3, 4, 5 after 1, 2
    tree = Draft([1, 6, 2], [-1, -1, 0])  # main path: 1 -> 2; a branch: 6
    (out,) = with_forced([matcher], [tree], [4])
    assert out.tokens == [1, 6, 2, 3, 4] and out.parents == [-1, -1, 0, 2, 3] and matcher.path == []
    assert with_forced([matcher], [tree], [2])[0] is tree
    assert with_forced([matcher], [Draft.chain([6, 7])], [4])[0].tokens == [6, 7]  # nothing forced after


def test_each_slot_is_masked_by_the_grammar_after_its_draft_path():
    matcher = TrieMatcher([[1, 2, 3], [1, 4], [5]])
    tree = Draft([1, 2, 9, 4], [-1, 0, 1, 0])  # 1 -> 2 -> 9 (refused), 1 -> 4
    bitmasks = new_bitmasks(1 + len(tree), 40)
    slot_masks(matcher, tree, bitmasks)
    ok = torch.isfinite(biases(bitmasks, 40, torch.float64, torch.device("cpu")))
    expected = [{1, 5}, {2, 4}, {3}, set(range(40)), set()]  # the refused node's slot: never reached
    assert [set(torch.nonzero(row).flatten().tolist()) for row in ok] == expected and matcher.path == []


def test_at_temperature_0_only_the_slots_acceptance_reaches_are_masked_where_their_argmax_is_refused():
    """From slot 0 down the children of each slot's choice: an allowed argmax is the choice unmasked, a
    refused one is masked and the best allowed token chosen; a slot off that path is never masked."""
    matcher = TrieMatcher([[1, 2, 3], [1, 4], [5]])
    tree = Draft([1, 2, 9, 4], [-1, 0, 1, 0])  # slot 1: 1; slot 2: 1 -> 2; slot 3: 1 -> 2 -> 9; slot 4: 1 -> 4

    def masked(best: list[int], second: dict[int, int] | None = None) -> dict[int, set[int]]:
        """Per masked slot, the tokens its masked logits keep (finite)."""
        logits = torch.zeros(1 + len(tree), 40, dtype=torch.float64)
        for slot, token in enumerate(best):
            logits[slot, token] = 5.0
        for slot, token in (second or {}).items():
            logits[slot, token] = 3.0
        rows = reached_masks(matcher, tree, logits, best)
        assert matcher.path == []
        for slot, row in rows.items():  # what is kept keeps its logit
            kept = torch.isfinite(row)
            assert torch.equal(row[kept], logits[slot][kept])
        return {slot: set(torch.nonzero(torch.isfinite(row)).flatten().tolist()) for slot, row in rows.items()}

    # 1 allowed -> slot 1; 4 allowed -> slot 4, where nothing is allowed: masked to the end token (EOS).
    assert masked([1, 4, 7, 0, 8]) == {4: {EOS}}
    # At slot 1, 9 is refused: masked, and the best allowed token, 2, leads to slot 2, whose argmax 3 is
    # allowed and drafted nowhere: the walk ends there; slot 4 is never reached.
    assert masked([1, 9, 3, 0, 8], {1: 2}) == {1: {2, 4}}


def test_greedy_rows_choose_as_a_full_mask_before_the_controls_would():
    """At temperature 0 the controls go first and a row is masked only where its argmax is refused
    (`ruled_logits`); it chooses what the grammar's full mask, then the controls, choose: refused
    argmaxes, biases pushing refused tokens up, min_tokens holding the end back, a grammar that allows
    nothing but the end."""
    generator = torch.Generator().manual_seed(3)
    params = _params()
    wanted = LogitControls(repetition_penalty=1.5, frequency_penalty=0.7, logit_bias=((9, 4.0), (3, 2.0)), min_tokens=3)
    refused = 0
    for trial in range(200):
        matchers = [TrieMatcher([[1, 2, 3], [1, 4, EOS], [5, 9]]) for _ in range(6)]
        for m, path in zip(matchers, ([], [1], [1, 2], [1, 4], [5], [1, 2, 3]), strict=True):
            m.path = list(path)
        matchers[trial % 6] = None  # one row unconstrained
        requests = [RowRequest([7, 9, 1], key=b, controls=wanted if (trial + b) % 2 else None) for b in range(6)]
        outputs = [[1, 9][: trial % 3] for _ in range(6)]
        logits = torch.randn(6, 16, dtype=torch.float64, generator=generator) * 3
        full = next_token_logits(constrain(logits, matchers), requests, outputs, params)
        chosen = greedy_tokens(ruled_logits(logits, matchers, requests, outputs, params))
        assert chosen.tolist() == greedy_tokens(full).tolist(), trial
        best = logits.argmax(-1).tolist()
        refused += sum(m is not None and not m.accepts(t) for m, t in zip(matchers, best, strict=True))
    assert refused > 100  # the lazy path was tested where it masks, not only where it need not


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="module")
def grammars(tokenizer, target):
    return GrammarCache(tokenizer, target.vocab_size, {EOS})


def _params(**sampling) -> GenerationParams:
    return GenerationParams(NEW_TOKENS, SamplingParams(**sampling), frozenset({EOS}))


def _requests(grammars, formats, prompts, controls=None):
    """Rows of `prompts` under `formats`; `controls`: every other row's (from the second on)."""
    return [
        RowRequest(list(p), i, controls=controls if i % 2 else None, grammar=f and grammars.get(canonical(f)))
        for i, (p, f) in enumerate(zip(prompts, formats, strict=True))
    ]


def _plain(target, grammars, formats, prompts=PROMPTS, params=None, controls=None) -> list[list[int]]:
    requests = _requests(grammars, formats, prompts, controls)
    return [r.tokens for r in AutoregressiveStrategy(target).generate(requests, params or _params()).rows]


def _drafted(name, models, grammars, formats, prompts=PROMPTS, params=None, controls=None) -> list[list[int]]:
    options = StrategyOptions(name=name, num_speculative_tokens=4, adaptive=name == "auto")
    options.self_speculative.exit_layer = 1  # the tiny target has two layers
    controller = AdaptiveController() if name == "auto" else None
    strategy = registry.create(options, models, controller)
    requests = _requests(grammars, formats, prompts, controls)
    return [r.tokens for r in strategy.generate(requests, params or _params()).rows]


def test_plain_decoding_chooses_the_best_token_the_grammar_allows(model, target, grammars, tokenizer):
    rows = _plain(target, grammars, MIXED)
    assert rows != _plain(target, grammars, [None] * len(PROMPTS))
    for prompt, fmt, row in zip(PROMPTS, MIXED, rows, strict=True):
        matcher = None if fmt is None else grammars.get(canonical(fmt)).matcher()
        output: list[int] = []
        for token in row:
            with torch.no_grad():
                logits = model(torch.tensor([prompt + output])).logits[0, -1]
            if matcher is not None:
                bitmask = new_bitmasks(1, len(logits))
                matcher.fill(bitmask[0])
                logits = logits.masked_fill(~unpacked(bitmask[0], len(logits)), -torch.inf)
                matcher.advance(token)
            assert token == int(logits.argmax())
            output.append(token)
    text = [tokenizer.decode(r, skip_special_tokens=True) for r in rows]
    assert text[1] in ("yes", "no", "maybe") and rows[1][-1] == EOS  # a complete format allows only the end
    assert len(text[0]) >= 3 and set(text[0]) <= set("abcdef")


@pytest.mark.parametrize("prompts", [PROMPTS[:1], PROMPTS], ids=["batch1", "batch8"])
def test_every_lossless_drafter_emits_constrained_plain_decodings_tokens(target, models, grammars, prompts):
    batches = [[f] for f in FORMATS.values()] if len(prompts) == 1 else [MIXED]
    for formats in batches:
        reference = _plain(target, grammars, formats, prompts)
        for name in LOSSLESS:
            assert _drafted(name, models, grammars, formats, prompts) == reference, (name, formats)


def test_every_lossless_drafter_keeps_formats_and_controls_together(target, models, grammars):
    """Greedy rows under a format and controls at once: the verify slots take plain steps' order (the
    controls, then a mask where the argmax is refused) and every lossless drafter emits plain decoding's
    tokens, which the controls change."""
    wanted = LogitControls(repetition_penalty=1.4, frequency_penalty=0.5, logit_bias=((EOS, -2.0),), min_tokens=4)
    reference = _plain(target, grammars, MIXED, controls=wanted)
    assert reference != _plain(target, grammars, MIXED)
    for name in LOSSLESS:
        assert _drafted(name, models, grammars, MIXED, controls=wanted) == reference, name


def test_drafts_of_the_constrained_continuation_are_accepted_whole(target, grammars):
    """Right drafts pass every slot only when slot j is masked after the draft's first j tokens."""
    reference = _plain(target, grammars, MIXED)
    for right in (True, False):  # wrong drafts: refused tokens, cut before the verify forward
        proposer = ScriptedProposer(reference, target.vocab_size, right=right)
        strategy = SpeculativeStrategy("scripted", target, [DraftingMethod("scripted", proposer, 4, 4, ExactMatch())])
        out = strategy.generate(_requests(grammars, MIXED, PROMPTS), _params())
        assert [r.tokens for r in out.rows] == reference
        if right:
            assert out.stats["accepted_tokens"] == out.stats["draft_tokens"] > 0


def test_a_drafter_that_guesses_nothing_right_still_drafts_a_formats_forced_tokens(target, grammars):
    """Under a JSON schema, a drafter whose every guess the grammar refuses still has tokens accepted:
    the keys and punctuation the grammar forces, drafted in its place; the tokens stay plain decoding's."""
    formats = [FORMATS["json_schema"]] * len(PROMPTS)
    reference = _plain(target, grammars, formats)
    proposer = ScriptedProposer(reference, target.vocab_size, right=False)
    strategy = SpeculativeStrategy("scripted", target, [DraftingMethod("scripted", proposer, 4, 4, ExactMatch())])
    out = strategy.generate(_requests(grammars, formats, PROMPTS), _params())
    assert [r.tokens for r in out.rows] == reference
    assert out.stats["accepted_tokens"] > 0


def test_a_closed_format_drafts_its_end(grammars, tokenizer):
    """Where the grammar allows nothing but its end after its forced tokens (a closed JSON object, a
    choice written whole), the forced tokens end with the end token; elsewhere they hold none. The
    matcher stays where it stood."""
    record = grammars.get(canonical(FORMATS["json_schema"])).matcher()
    assert EOS not in record.forced()
    for token in tokenizer('{"n": 5, "s": "ab"', add_special_tokens=False)["input_ids"]:
        record.advance(token)
    forced = record.forced()
    assert tokenizer.decode(forced[:-1]) == "}" and forced[-1] == EOS
    assert record.forced() == forced and not record.accepts(EOS)
    choice = grammars.get(canonical(FORMATS["choice"])).matcher()
    for token in tokenizer("maybe", add_special_tokens=False)["input_ids"]:
        choice.advance(token)
    assert choice.forced() == [EOS]


def test_sampled_rows_keep_their_keyed_samples_under_formats(target, models, grammars):
    params = _params(temperature=0.8, seed=5)
    reference = _plain(target, grammars, MIXED, params=params)
    for name in ("prompt_lookup", "eagle", "auto"):  # exact matching of keyed samples
        assert _drafted(name, models, grammars, MIXED, params=params) == reference, name


def test_a_finished_json_schema_row_validates(target, grammars, tokenizer):
    params = GenerationParams(48, SamplingParams(), frozenset({EOS}))
    rows = _plain(target, grammars, [FORMATS["json_schema"]] * len(PROMPTS), params=params)
    finished = [r for r in rows if r[-1] == EOS]
    assert len(finished) == len(rows)
    for row in finished:
        jsonschema.validate(json.loads(tokenizer.decode(row, skip_special_tokens=True)), SCHEMA)


def test_json_is_written_in_the_schemas_key_order_as_json_dumps_writes_it(target, grammars, tokenizer):
    """Properties come in the order the schema declares them (not sorted by the canonical form), with
    Python's `json.dumps` separators: the spelling of JSON a model has read most."""
    declared = {**SCHEMA, "properties": dict(reversed(SCHEMA["properties"].items())), "required": ["s", "n"]}
    fmt = {"type": "json_schema", "json_schema": {"name": "pair", "schema": declared}}
    assert list(json.loads(canonical(fmt))["json_schema"]["schema"]["properties"]) == ["s", "n"]
    params = GenerationParams(48, SamplingParams(), frozenset({EOS}))
    rows = _plain(target, grammars, [fmt] * len(PROMPTS), params=params)
    texts = [tokenizer.decode(row, skip_special_tokens=True) for row in rows if row[-1] == EOS]
    assert texts
    for text in texts:
        assert list(json.loads(text)) == ["s", "n"] and text == json.dumps(json.loads(text))


def test_formats_are_canonical_and_bad_ones_say_why(grammars):
    schema = FORMATS["json_schema"]
    assert canonical(schema) == canonical(json.dumps({**schema, "json_schema": {"schema": SCHEMA, "strict": True}}))
    assert canonical(canonical(schema)) == canonical(schema) and canonical({"type": "text"}) is None
    for bad, why in (
        ({"type": "xml"}, "type 'xml'"),
        ({"type": "choice", "choices": []}, "choice needs"),
        ({"type": "regex"}, "regex needs"),
        ("{", "not JSON"),
    ):
        with pytest.raises(FormatError, match=why):
            canonical(bad)
    for bad in ({"type": "regex", "pattern": "("}, {"type": "grammar", "ebnf": "start: nothing"}):
        with pytest.raises(FormatError, match="cannot be compiled"):
            grammars.get(canonical(bad))


def test_lossy_strategies_refuse_constrained_rows():
    for name, lossy in (("calm", {}), ("mask_predict", {}), ("blockwise", {"top_k": 2})):
        options = StrategyOptions(name=name)
        for key, value in lossy.items():
            setattr(getattr(options, name), key, value)
        found = registry.problems(options, greedy=True, formats=True)
        assert any("cannot keep rows inside a response_format" in p for p in found), (name, found)
    for name in (*LOSSLESS, "autoregressive"):
        assert registry.format_refusal(StrategyOptions(name=name)) is None, name


def test_a_default_format_leaves_the_job_identity_alone():
    assert "response_format" in LATER_KEYS["generation"]


def test_the_job_and_its_rows_formats(tmp_path, tiny_model_dir, tokenizer):
    """A row's format column overrides the job's; a row's format that cannot compile is an error row and
    the others decode; a job-wide one that cannot compile stops the actor at start, naming the key."""
    fmt = json.dumps(FORMATS["choice"])
    overrides = ["input.params_columns={response_format: fmt}", f"generation.response_format={fmt}"]
    config = job_config(tmp_path, tiny_model_dir, *overrides)
    validate(config)
    generator = Generator(worker_spec(config, "job"))
    column = [None, json.dumps(FORMATS["regex"]), '{"type": "regex", "pattern": "("}', '{"type": "text"}']
    table = pa.table({"prompt": ["def add", "import os", "x", "y"], "fmt": column})
    columns = generator.decode_table(table, WorkUnit("u", "s", "s.parquet", (0,), 0, 4), 1, {}).columns
    assert columns["finish_reason"][2] == FINISH_ERROR and "unclosed group" in columns["error"][2]
    assert "input column 'fmt' (response_format)" in columns["error"][2]
    assert columns["completion"][0] in ("yes", "no", "maybe")
    assert set(columns["completion"][1]) <= set("abcdef") and columns["completion"][3] is not None
    bad = job_config(tmp_path, tiny_model_dir, 'generation.response_format={"type": "regex", "pattern": "("}')
    with pytest.raises(ValueError, match=r"generation\.response_format"):
        Generator(worker_spec(bad, "job"))
    with pytest.raises(JobError, match=r"generation\.response_format"):
        validate(job_config(tmp_path, tiny_model_dir, 'generation.response_format={"type": "xml"}'))


def test_the_synthesis_bench_reports_its_aims_on_a_tiny_model(tmp_path, tiny_model_dir):
    """`accelgen bench structured=true` runs end to end (its numbers on a tiny random model mean nothing)."""
    from jobs.bench import structured
    from jobs.bench.grammar_engines import RECORDS
    from jobs.bench.settings import BenchConfig
    from jobs.bench.structured_set import SCHEMAS, synthesis_rows
    from pipeline.config import load_config

    for name, schema in SCHEMAS.items():
        jsonschema.validate(RECORDS[name], schema)  # the engines' walk is a valid record of each schema
    assert [name for _, name in synthesis_rows(8)] == list(SCHEMAS) * 2
    keys = [f"model={tiny_model_dir}", "num_prompts=4", "batch_sizes=[2]", "repeats=1", "max_new_tokens=8"]
    config = load_config(BenchConfig(), None, [*keys, "strategy.candidates=[prompt_lookup]", "structured=true"])
    bench = structured.Bench(dataclasses.replace(config, strategies=["autoregressive", "auto"]))
    report = structured.measure(bench)
    assert report["rows"] == 4 and report["auto_tokens_equal_autoregressive"]
    # Constrained and unconstrained rows are two jobs: each `auto` contender has its own controller.
    assert set(structured.KINDS) <= {key[-1] for key in bench.controllers}
    assert report["tokens"]["autoregressive constrained"] == report["tokens"]["autoregressive unconstrained"]
    assert report["any_text_tokens_equal_unconstrained"] and report["grammar_cost_same_tokens"] > 0
    assert report["valid_share_of_finished"] in (None, 1.0)


def test_masks_unpack_every_bit_and_a_slot_allowing_nothing_allows_its_end_tokens():
    """Bits of each word's every byte, the sign bit included, are the tokens they name; a slot whose
    grammar allows nothing keeps its end tokens only (one at a sign bit), and a slot left out of
    `slots` stays as it was."""
    vocab = 70
    bitmasks = torch.zeros(2, 3, dtype=torch.int32)
    bitmasks[0, 0] = -(1 << 31) | 1 | (1 << 9)  # tokens 31, 0 and 9
    bitmasks[0, 2] = 1 << 5  # token 69
    assert torch.nonzero(unpacked(bitmasks[0], vocab)).flatten().tolist() == [0, 9, 31, 69]
    bias = biases(bitmasks, vocab, torch.float32, torch.device("cpu"))
    assert torch.equal(torch.isfinite(bias), torch.stack([unpacked(row, vocab) for row in bitmasks]))
    assert set(bias.unique().tolist()) == {0.0, -math.inf}
    logits = torch.zeros(3, vocab, dtype=torch.float64)
    out = apply(logits, [0, 2], bitmasks, [frozenset({1}), frozenset({63, 2})])
    assert torch.isfinite(out[0]).nonzero().flatten().tolist() == [0, 9, 31, 69]
    assert torch.equal(out[1], logits[1])
    assert torch.isfinite(out[2]).nonzero().flatten().tolist() == [2, 63]
    every = apply(logits[:2], [0, 1], bitmasks, [frozenset({1}), frozenset({63})])  # all rows: no gather
    assert torch.isfinite(every[1]).nonzero().flatten().tolist() == [63]
