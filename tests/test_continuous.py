"""Continuous batching: a row's output does not depend on when it joined a batch, or with whom.

Rows join open batches between steps (`Decoding.admit`) for every strategy: each is checked in
float64 against the same rows decoded alone (batch 1), and the lossless ones against greedy decoding.
The actor's engine is checked on literal scenarios: batches span units and refill, a unit completes
as soon as its rows do, a fault fails only the units decoding in its batch.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch
from mixed_prompts import PROMPTS
from test_medusa import tiny_heads
from transformers import AutoModelForCausalLM, AutoTokenizer

from jobs.train.cmlm import cmlm_from_target, cmlm_tokenizer_and_config
from strategies import registry
from strategies.artifacts.cmlm import write_config
from strategies.artifacts.exits import untrained_exits
from strategies.base import GenerationParams, RowOutput, RowRequest, Segment
from strategies.control.controller import AdaptiveController
from strategies.options import StrategyOptions
from strategies.runtime.kv_cache import RaggedKV
from strategies.runtime.sampling import SamplingParams
from workers.engine import DecodeEngine
from workers.model_loading import load_models

NEW_TOKENS = 18
LOSSY = {"specdec", "calm", "mask_predict"}  # compared with themselves alone, not with greedy decoding
STRATEGIES = [
    "autoregressive",
    "speculative",
    "speculative_cmlm",
    "specdec",
    "prompt_lookup",
    "lookahead",
    "medusa",
    "blockwise",
    "jacobi",
    "self_speculative",
    "auto",
    "calm",
    "mask_predict",
]


@pytest.fixture(scope="module")
def models(tiny_model_dir: Path, tiny_draft_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> registry.Models:
    """The tiny target with every optional model: a draft, random heads and exits, an untrained CMLM."""
    cmlm_dir = tmp_path_factory.mktemp("cmlm")
    tokenizer, config = cmlm_tokenizer_and_config(AutoTokenizer.from_pretrained(tiny_model_dir), 8)
    cmlm = cmlm_from_target(AutoModelForCausalLM.from_pretrained(tiny_model_dir), 1, len(tokenizer), seed=0)
    cmlm.save_pretrained(cmlm_dir)
    tokenizer.save_pretrained(cmlm_dir)
    write_config(cmlm_dir, config)
    cpu = torch.device("cpu")
    found = load_models(str(tiny_model_dir), torch.float64, cpu, {"draft": str(tiny_draft_dir), "cmlm": str(cmlm_dir)})
    exits = untrained_exits(found.target, [1], adapter_rank=4)
    torch.manual_seed(0)
    with torch.no_grad():
        for module in exits.exits.values():
            torch.nn.init.normal_(module.up.weight, std=0.3)
    heads = tiny_heads(found.models.target, tiny_model_dir)
    loaded = found.models
    return registry.Models(
        loaded.target,
        draft=loaded.get("draft"),
        cmlm=loaded.get("cmlm"),
        heads=heads,
        exits=exits.eval().requires_grad_(False),
    )


def _strategy(name: str, models: registry.Models):
    options = StrategyOptions(name="speculative" if name == "speculative_cmlm" else name)
    options.speculative.drafter = "cmlm" if name == "speculative_cmlm" else "draft_model"
    options.self_speculative.exit_layer = 1
    options.calm.min_layer = 1
    options.mask_predict.iterations = 3
    return registry.create(options, models, AdaptiveController() if name == "auto" else None)


def _params() -> GenerationParams:
    return GenerationParams(NEW_TOKENS, SamplingParams(), eos_token_ids=frozenset(), ignore_eos=True)


def _requests(prompts: list[list[int]], first_key: int = 0) -> list[RowRequest]:
    """Row i stops after 9 + i tokens (a stop condition of its own), so rows end one after another."""
    return [
        RowRequest(prompt=list(p), key=first_key + i, stop=lambda tokens, n=9 + first_key + i: len(tokens) >= n)
        for i, p in enumerate(prompts)
    ]


def _joined(strategy, prompts: list[list[int]]) -> tuple[list[list[int]], list[int]]:
    """Decode `prompts` in waves (`_joined_outputs`); returns each row's tokens and how many rows
    decoded at each step."""
    outputs, sizes = _joined_outputs(strategy, prompts)
    return [row.tokens for row in outputs], sizes


def _joined_outputs(strategy, prompts: list[list[int]]) -> tuple[list[RowOutput], list[int]]:
    """Decode `prompts` in waves: three open the batch, three join after a step, two after the next;
    returns each row's output and how many rows decoded at each step."""
    waves = [prompts[:3], prompts[3:6], prompts[6:]]
    decoding = strategy.open(_requests(waves[0]), _params())
    outputs: dict[int, RowOutput] = {}
    sizes = []
    joined = 1
    while True:
        outputs.update(decoding.finished())
        if not decoding.active():
            break
        sizes.append(decoding.active())
        decoding.step()
        if joined < len(waves) and decoding.active():
            decoding.admit(_requests(waves[joined], first_key=sum(len(w) for w in waves[:joined])))
            joined += 1
    assert joined == len(waves), "every wave joined while the batch still decoded"
    return [outputs[i] for i in range(len(prompts))], sizes


@pytest.mark.parametrize("name", STRATEGIES)
def test_a_row_decodes_the_same_joining_mid_batch_as_alone(name, models):
    strategy = _strategy(name, models)
    alone = [strategy.generate(_requests([p], first_key=i), _params()).rows[0].tokens for i, p in enumerate(PROMPTS)]
    joined, sizes = _joined(strategy, PROMPTS)
    assert joined == alone
    assert max(sizes) > 3  # rows that joined decoded beside rows already there
    if name not in LOSSY:
        greedy = registry.create(StrategyOptions(name="autoregressive"), models)
        assert joined == [r.tokens for r in greedy.generate(_requests(PROMPTS), _params()).rows]


def test_rows_joining_a_finished_batch_are_told_to_start_a_new_one(models):
    strategy = _strategy("prompt_lookup", models)
    decoding = strategy.open(_requests(PROMPTS[:1]), _params())
    while decoding.active():
        decoding.step()
    with pytest.raises(ValueError, match="whose rows have all finished; start a new batch"):
        decoding.admit(_requests(PROMPTS[1:2], first_key=1))


@pytest.mark.parametrize("name", ["calm", "mask_predict", "prompt_lookup", "auto"])
def test_what_a_strategy_counts_per_row_stays_with_its_row_as_rows_join_and_finish(name, models):
    """A row's own columns are what it had alone, and each of its tokens is counted once, under an
    option, in its own `tokens_by_option`: rows end one after another, so any count kept by batch
    position rather than with the row would land on a neighbour."""
    strategy = _strategy(name, models)
    alone = [strategy.generate(_requests([p], first_key=i), _params()).rows[0] for i, p in enumerate(PROMPTS)]
    joined, _ = _joined_outputs(strategy, PROMPTS)
    assert [r.columns for r in joined] == [r.columns for r in alone]
    for row in joined:
        assert (row.tokens_by_option is None) == (name in {"calm", "mask_predict"})
        if row.tokens_by_option is not None:
            assert sum(row.tokens_by_option.values()) == len(row.tokens)
            assert row.tokens_by_option["autoregressive"] >= 1  # the prefill's token at least


def test_caches_of_different_lengths_join_without_changing_a_row():
    """`RaggedKV.extend` on literal keys: the shorter side is left-padded with invalid slots."""
    a, b = RaggedKV(1, 1, torch.device("cpu")), RaggedKV(1, 2, torch.device("cpu"))
    a.layers[0].update(torch.ones(1, 1, 3, 1), torch.ones(1, 1, 3, 1))
    a.append(torch.tensor([[True, True, True]]))
    b.layers[0].update(torch.full((2, 1, 1, 1), 2.0), torch.full((2, 1, 1, 1), 2.0))
    b.append(torch.tensor([[True], [False]]))
    a.extend(b)
    assert a.valid.tolist() == [[True, True, True], [False, False, True], [False, False, False]]
    assert a.next_pos.tolist() == [3, 1, 0]
    assert a.layers[0].keys[:, 0, :, 0].tolist() == [[1, 1, 1], [0, 0, 2], [0, 0, 2]]


class _Counting:
    """A `Decoding` of literal rows: a row of prompt [n] finishes after n steps. It records the rows
    decoding at each step, breaks on a row of prompt [`fail_on`], and waits for `hold` from its second
    step on."""

    def __init__(self, requests, sizes, fail_on=None, hold=None):
        self.left, self.sizes, self.fail_on, self.hold, self.done, self.count = {}, sizes, fail_on, hold, [], 0
        self.admit(requests)

    def admit(self, requests):
        for r in requests:
            if r.prompt[0] == self.fail_on:
                raise RuntimeError("a row that breaks its batch")
            self.left[self.count] = r.prompt[0]
            self.count += 1

    def active(self):
        return len(self.left)

    def step(self):
        if self.hold is not None and self.sizes:
            self.hold.wait()
        self.sizes.append(len(self.left))
        for i in list(self.left):
            self.left[i] -= 1
            if self.left[i] == 0:
                self.done.append(i)
                del self.left[i]

    def finished(self):
        out, self.done = [(i, RowOutput([i], "length")) for i in self.done], []
        return out

    def segment(self):
        return Segment(0, 0)


def _engine(sizes, fail_on=None, hold=None):
    return DecodeEngine(lambda group, requests: _Counting(requests, sizes, fail_on, hold), 4, 10_000)


def _rows(*lengths, group="g"):
    return [(group, RowRequest([n], 0), 1) for n in lengths]


def test_batches_span_units_and_refill_as_rows_finish():
    sizes: list[int] = []
    engine = _engine(sizes)
    with engine._wake:  # both units wait before the first batch opens
        first = engine.submit("u0", 1, _rows(1, 5, 5))
        second = engine.submit("u1", 1, _rows(2, 2, 2))
    assert len(first.wait()) == 3 and len(second.wait()) == 3
    # u0's rows and one of u1's open the batch; u1's others join as rows finish: four decode at once.
    assert sizes[:3] == [4, 4, 4]
    # u1 completes first (step 3) and logs the records closed until then; u0 (step 5) the rest.
    assert [r.units for r in second.records] == [["u0", "u1"]]
    assert [r.units for r in first.records] == [["u0"]]
    assert sum(len(r.finished) for r in first.records + second.records) == 6


def test_a_unit_completes_when_its_rows_do_not_when_the_batch_does():
    hold = threading.Event()
    engine = _engine([], hold=hold)
    with engine._wake:
        quick = engine.submit("quick", 1, _rows(1))
        slow = engine.submit("slow", 1, _rows(3))
    quick.wait()  # its row finished at the first step; the second waits for `hold`
    assert not slow.done.is_set()
    hold.set()
    assert len(slow.wait()) == 1


def test_a_fault_fails_the_units_in_its_batch_and_the_engine_goes_on():
    engine = _engine([], fail_on=7)
    with engine._wake:
        bad = engine.submit("bad", 1, _rows(2, 7))
        other_group = engine.submit("other", 1, _rows(2, group="h"))
    with pytest.raises(RuntimeError, match="breaks its batch"):
        bad.wait()
    assert len(other_group.wait()) == 1
    assert len(engine.submit("later", 1, _rows(1)).wait()) == 1


def test_work_handed_to_the_engine_runs_on_its_decoding_thread_and_answers_the_caller():
    """`run` is how the actor's start readies its models on the thread that decodes (workers/engine.py:
    the CPU's OpenMP workers of another thread's parallel regions slow this one's): the result comes
    back, an exception is raised to the caller, and the engine decodes on after either."""
    engine = _engine([])
    assert engine.run(lambda: threading.current_thread().name) == "decode"

    def broken():
        raise ValueError("no such model")

    with pytest.raises(ValueError, match="no such model"):
        engine.run(broken)
    assert len(engine.submit("after", 1, _rows(1)).wait()) == 1
