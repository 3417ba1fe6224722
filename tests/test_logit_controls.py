"""Sampling controls (presence, frequency and repetition penalties, min_p, min_tokens, stop token ids,
logit bias): each does to the logits what its definition says, plain decoding follows it, and every
lossless drafter emits plain decoding's tokens under it (float64), since each verify slot's logits are
controlled with the draft path before it as plain decoding's would be."""

from __future__ import annotations

import math

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import ray
import torch
from job_config import job_config
from mixed_prompts import PROMPTS
from scripted_proposer import ScriptedProposer
from test_config import REQUIRED
from test_eagle import tiny_eagle
from test_medusa import tiny_heads
from transformers import AutoModelForCausalLM, AutoTokenizer

from jobs.shipped import default_job_config
from pipeline.checks import validate
from pipeline.config import load_config
from pipeline.driver import run_job
from pipeline.errors import JobError
from strategies import registry
from strategies.artifacts.exits import untrained_exits
from strategies.base import GenerationParams, LogitControls, RowRequest
from strategies.control.controller import AdaptiveController
from strategies.decoders.autoregressive import AutoregressiveStrategy
from strategies.options import StrategyOptions
from strategies.runtime.logit_controls import RowSlots, control_logits
from strategies.runtime.runner import ModelRunner
from strategies.runtime.sampling import SamplingParams, row_key
from strategies.verification.draft_controls import DraftControls, slot_paths
from strategies.verification.drafting import DraftingMethod
from strategies.verification.drafts import Draft
from strategies.verification.rules import ExactMatch, RejectionSampling
from strategies.verification.speculative import SpeculativeStrategy
from workers.common.contract import derived_row_id, part_name, unit_id
from workers.common.openai_batch import parse_request
from workers.common.row_settings import CONTROLS as CONTROL_SETTINGS
from workers.common.row_settings import RowSettings, column_value, row_settings, sets_controls

EOS = 0
NEW_TOKENS = 16
LOSSLESS = [
    "speculative",
    "prompt_lookup",
    "lookahead",
    "medusa",
    "blockwise",
    "eagle",
    "jacobi",
    "self_speculative",
    "auto",
]


@pytest.fixture(scope="module", autouse=True)
def embedded_ray():
    yield
    ray.shutdown()


def _row(values: list[float]) -> torch.Tensor:
    return torch.tensor([values], dtype=torch.float64)


def _controlled(values, controls, prompt=(), output=(), ends=frozenset(), temperature=0.0) -> list[float]:
    row = RowSlots(controls, list(prompt), list(output), 0, [()])
    return control_logits(_row(values), [row], ends, temperature)[0].tolist()


def test_each_control_on_literal_logits():
    logits = [2.0, -1.0, 0.5, -0.5, 1.0]
    assert _controlled(logits, LogitControls(presence_penalty=0.5), output=[0, 0, 3]) == [1.5, -1.0, 0.5, -1.0, 1.0]
    assert _controlled(logits, LogitControls(frequency_penalty=0.5), output=[0, 0, 3]) == [1.0, -1.0, 0.5, -1.0, 1.0]
    both = LogitControls(presence_penalty=-1.0, frequency_penalty=0.25)
    assert _controlled(logits, both, output=[4, 4, 4]) == [2.0, -1.0, 0.5, -0.5, 1.25]
    # Repetition: prompt and output tokens alike, positive logits divided, negative multiplied, once each.
    rep = LogitControls(repetition_penalty=2.0)
    assert _controlled(logits, rep, prompt=[0, 1], output=[1, 2]) == [1.0, -2.0, 0.25, -0.5, 1.0]
    assert _controlled(logits, LogitControls(logit_bias=((1, 3.0), (4, -100.0)))) == [2.0, 2.0, 0.5, -0.5, -99.0]
    held = LogitControls(min_tokens=2, stop_token_ids=(3,))
    inf = -math.inf
    assert _controlled(logits, held, output=[2], ends=frozenset({0})) == [inf, -1.0, 0.5, inf, 1.0]
    assert _controlled(logits, held, output=[2, 2], ends=frozenset({0})) == logits  # two generated: free
    # min_p at temperature T: keep p(x) >= min_p * p_max, i.e. logit >= max + T ln(min_p).
    for temperature, expected in ((1.0, [True, False, True, False, True]), (0.5, [True, False, False, False, True])):
        probs = torch.tensor(logits, dtype=torch.float64).div(temperature).softmax(-1)
        kept = (probs >= 0.1 * probs.max()).tolist()
        at = _controlled(logits, LogitControls(min_p=0.1), temperature=temperature)
        assert [v != inf for v in at] == kept == expected
        assert [v for v, k in zip(at, kept, strict=True) if k] == [v for v, k in zip(logits, kept, strict=True) if k]
    assert _controlled(logits, LogitControls(min_p=0.1), temperature=0.0) == logits  # greedy: the argmax stays
    assert control_logits(_row(logits), [], frozenset(), 0.0).tolist() == [logits]


def test_a_verify_slot_follows_the_output_and_its_draft_path():
    tree = Draft(tokens=[7, 8, 9, 10], parents=[-1, 0, 0, 2])
    assert slot_paths(tree) == [[], [7], [7, 8], [7, 9], [7, 9, 10]]


def test_each_verify_slot_is_controlled_bit_for_bit_as_a_plain_step_after_its_path():
    """A row's slots are controlled at once from its shared history: each slot's logits must equal, bit
    for bit, what a plain step that had emitted the slot's path computes (float32, so a penalty applied
    in two parts, or counted from a part of the history, would show). Rows without controls, and the
    padding slots past a row's draft, stay as they are."""
    generator = torch.Generator().manual_seed(3)
    vocab, width = 64, 6
    controls = LogitControls(0.4, 0.7, 1.3, 0.05, 4, (5,), ((3, 1.5), (9, -2.0)))
    prompts, outputs = [[1, 2, 3, 2], [4, 4], [7]], [[2, 9, 9], [], [5, 6]]
    drafts = [Draft([9, 2, 9, 11], [-1, 0, 1, 0]), Draft.chain([4, 4, 4, 4, 4]), Draft.chain([3, 3])]
    requests = [RowRequest(p, key=i, controls=None if i == 2 else controls) for i, p in enumerate(prompts)]
    params = GenerationParams(8, SamplingParams(temperature=0.7), frozenset({0}))
    logits = torch.randn(len(prompts), width, vocab, generator=generator)
    verified = DraftControls(requests, outputs, params, [None] * 3).apply(logits, drafts)
    for r, (request, output, draft) in enumerate(zip(requests, outputs, drafts, strict=True)):
        for j, path in enumerate(slot_paths(draft)):
            plain = RowSlots(request.controls, request.prompt, [*output, *path], 0, [()]) if request.controls else None
            expected = control_logits(logits[r, j][None], [plain] if plain else [], frozenset({0}), 0.7)[0]
            assert torch.equal(verified[r, j], expected), (r, j)
        assert torch.equal(verified[r, len(draft) + 1 :], logits[r, len(draft) + 1 :])
    assert not torch.equal(verified[0], logits[0]) and torch.equal(verified[2], logits[2])


def _reference_controls(logits: torch.Tensor, c: LogitControls, prompt, output, ends) -> torch.Tensor:
    """The controls token by token, as their definitions read (vLLM's order)."""
    out = logits.clone()
    for token, bias in c.logit_bias:
        out[token] += bias
    if len(output) < c.min_tokens:
        for token in {*ends, *c.stop_token_ids}:
            out[token] = -math.inf
    for token in set(prompt) | set(output):
        out[token] = out[token] / c.repetition_penalty if out[token] > 0 else out[token] * c.repetition_penalty
    for token in set(output):
        out[token] -= c.frequency_penalty * output.count(token) + c.presence_penalty
    return out


@pytest.fixture(scope="module")
def model(tiny_model_dir):
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float64)


@pytest.fixture(scope="module")
def target(model):
    return ModelRunner(model)


def _params(**sampling) -> GenerationParams:
    return GenerationParams(NEW_TOKENS, SamplingParams(**sampling), frozenset({EOS}))


def _requests(controls, prompts=PROMPTS):
    per_row = controls if isinstance(controls, list) else [controls] * len(prompts)
    return [RowRequest(list(p), key=i, controls=c) for i, (p, c) in enumerate(zip(prompts, per_row, strict=True))]


def _plain(target, controls, prompts=PROMPTS, params=None) -> list[list[int]]:
    out = AutoregressiveStrategy(target).generate(_requests(controls, prompts), params or _params())
    return [r.tokens for r in out.rows]


# Each control alone, at values that change the tiny model's greedy output; then all of them at once.
CONTROLS = {
    "presence_penalty": LogitControls(presence_penalty=1.5),
    "frequency_penalty": LogitControls(frequency_penalty=0.6),
    "repetition_penalty": LogitControls(repetition_penalty=3.0),
    "logit_bias": LogitControls(logit_bias=((40, 2.0), (41, -100.0))),
    "min_tokens": LogitControls(min_tokens=5, logit_bias=((EOS, 100.0),)),  # EOS at once but for min_tokens
    "stop_token_ids": LogitControls(stop_token_ids=(12, 22, 25)),  # what rows 0, 3 and 5 repeat
    "all": LogitControls(0.5, 0.3, 1.5, 0.0, 3, (145, 280), ((40, 0.2), (EOS, -2.0))),
}


def test_plain_decoding_follows_each_controls_definition(model, target):
    uncontrolled = _plain(target, None)
    for name, c in CONTROLS.items():
        tokens = _plain(target, c)
        assert tokens != uncontrolled, name
        for prompt, row in zip(PROMPTS, tokens, strict=True):
            output: list[int] = []
            for token in row:
                with torch.no_grad():
                    logits = model(torch.tensor([prompt + output])).logits[0, -1]
                assert token == int(_reference_controls(logits, c, prompt, output, {EOS}).argmax()), name
                output.append(token)
            ended = row[-1] == EOS or row[-1] in c.stop_token_ids
            assert ended or len(row) == NEW_TOKENS, name
            assert EOS not in row[: c.min_tokens] and not set(c.stop_token_ids) & set(row[: c.min_tokens]), name
    assert [len(r) for r in _plain(target, CONTROLS["min_tokens"])] == [6] * len(PROMPTS)  # EOS the 6th
    assert [len(r) for r in _plain(target, CONTROLS["stop_token_ids"])] == [1, 16, 16, 1, 16, 1, 16, 16]


@pytest.fixture(scope="module")
def models(model, target, tiny_model_dir) -> registry.Models:
    """Every optional model: a draft that is the target itself (drafts accepted, several slots a
    verify), heads, an EAGLE head and exits of random weights."""
    exits = untrained_exits(model, [1], adapter_rank=4)
    same = ModelRunner(AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float64))
    return registry.Models(
        target,
        draft=same,
        heads=tiny_heads(target, tiny_model_dir),
        eagle=tiny_eagle(target, tiny_model_dir),
        exits=exits.double().eval().requires_grad_(False),
    )


def _drafted(name: str, models: registry.Models, controls, prompts, params=None):
    options = StrategyOptions(name=name, num_speculative_tokens=4, adaptive=name == "auto")
    options.self_speculative.exit_layer = 1  # the tiny target has two layers
    controller = AdaptiveController() if name == "auto" else None
    return registry.create(options, models, controller).generate(_requests(controls, prompts), params or _params())


@pytest.mark.parametrize("prompts", [PROMPTS[:1], PROMPTS], ids=["batch1", "batch8"])
def test_every_lossless_drafter_emits_plain_decodings_tokens_under_each_control(target, models, prompts):
    for control, c in CONTROLS.items():
        reference = _plain(target, c, prompts)
        for name in LOSSLESS:
            out = _drafted(name, models, c, prompts)
            assert [r.tokens for r in out.rows] == reference, (control, name)


def test_rows_of_one_batch_keep_their_own_controls(target, models):
    per_row = [*CONTROLS.values(), None]
    alone = [_plain(target, c, [p])[0] for c, p in zip(per_row, PROMPTS, strict=True)]
    assert _plain(target, per_row) == alone
    for name in ("speculative", "eagle", "auto"):
        assert [r.tokens for r in _drafted(name, models, per_row, PROMPTS).rows] == alone, name


def test_drafts_of_the_controlled_continuation_are_accepted_whole(target):
    """Drafts right about the controlled output pass every slot only when slot j is controlled with the
    draft's first j tokens as output: a slot controlled with the row's output alone would reject them."""
    c = CONTROLS["all"]
    reference = _plain(target, c)
    proposer = ScriptedProposer(reference, target.vocab_size)
    strategy = SpeculativeStrategy("scripted", target, [DraftingMethod("scripted", proposer, 4, 4, ExactMatch())])
    out = strategy.generate(_requests(c), _params())
    assert [r.tokens for r in out.rows] == reference
    assert out.stats["accepted_tokens"] == out.stats["draft_tokens"] > 0


def test_sampled_rows_keep_their_keyed_samples_under_controls(target, models):
    params = _params(temperature=0.5, seed=3)  # the tiny model's logits are flat: min_p drops tokens at 0.5
    for c in (LogitControls(min_p=0.6), CONTROLS["all"], LogitControls(min_p=0.3, repetition_penalty=2.0)):
        reference = _plain(target, c, params=params)
        assert reference != _plain(target, None, params=params)
        for name in ("prompt_lookup", "lookahead", "eagle", "auto"):  # exact matching of keyed samples
            assert [r.tokens for r in _drafted(name, models, c, PROMPTS, params).rows] == reference, name


def test_rejection_sampling_tests_drafts_against_the_controlled_target(target):
    """A draft token the controls all but force (bias +100) is accepted at every slot, one they ban is
    rejected at every slot: p is the controlled target's at each slot, q the drafter's (one-hot here)."""
    forced = LogitControls(logit_bias=((77, 100.0),), presence_penalty=0.5)
    params = _params(temperature=0.9, seed=1)
    reference = _plain(target, forced, params=params)
    assert reference == [[77] * NEW_TOKENS] * len(PROMPTS)
    for right in (True, False):
        proposer = ScriptedProposer(reference, target.vocab_size, right=right)
        drafter = DraftingMethod("scripted", proposer, 4, 4, RejectionSampling())
        out = SpeculativeStrategy("scripted", target, [drafter]).generate(_requests(forced), params)
        assert [r.tokens for r in out.rows] == reference
        assert out.stats["accepted_tokens"] == (out.stats["draft_tokens"] if right else 0) and out.stats["draft_tokens"]


SETTINGS_COLUMNS = {s: f"col_{s}" for s in CONTROL_SETTINGS}
JOB = RowSettings(max_new_tokens=6, temperature=0.0, top_p=1.0, stop=(), seed=0)


def test_row_values_of_the_controls_are_checked_and_bad_ones_name_the_column_and_the_bound():
    values = {
        "presence_penalty": -2,
        "frequency_penalty": 1.5,
        "repetition_penalty": 1.2,
        "min_p": 0.05,
        "min_tokens": 3.0,
        "stop_token_ids": [5, "6"],
        "logit_bias": '{"7": -100, "9": 2.5}',
    }
    got = row_settings(JOB, values, SETTINGS_COLUMNS, "r")
    assert got == RowSettings(6, 0.0, 1.0, (), 0, -2.0, 1.5, 1.2, 0.05, 3, (5, 6), ((7, -100.0), (9, 2.5)))
    assert row_settings(JOB, {"logit_bias": [(9, 2.5), (7, -100)]}, SETTINGS_COLUMNS, "r").logit_bias == got.logit_bias
    as_column = column_value(got, "logit_bias")  # JSON text, as a JSON input's table holds it
    assert row_settings(JOB, {"logit_bias": as_column}, SETTINGS_COLUMNS, "r").logit_bias == got.logit_bias
    bad = {
        "presence_penalty": (2.5, "[-2, 2]"),
        "frequency_penalty": (float("nan"), "[-2, 2]"),
        "repetition_penalty": (0, "> 0"),
        "min_p": (1.5, "[0, 1]"),
        "min_tokens": (-1, ">= 0"),
        "stop_token_ids": ([-3], "token ids"),
        "logit_bias": ({"7": 101}, "[-100, 100]"),
    }
    for setting, (value, bound) in bad.items():
        message = row_settings(JOB, {setting: value}, SETTINGS_COLUMNS, "row-7")
        assert message.startswith(f"row row-7: input column 'col_{setting}' ({setting}) is {value!r}: use "), setting
        assert bound in message and message.endswith(f"or null for the job's generation.{setting}"), setting
    assert "map<int64, double>" in row_settings(JOB, {"logit_bias": "{oops"}, SETTINGS_COLUMNS, "r")


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("generation.presence_penalty=2.5", r"generation.presence_penalty must be in \[-2, 2\] \(0: none\), got 2.5"),
        ("generation.frequency_penalty=-3", r"generation.frequency_penalty must be in \[-2, 2\]"),
        ("generation.repetition_penalty=0", r"generation.repetition_penalty must be > 0 \(1: none\), got 0"),
        ("generation.min_p=1.5", r"generation.min_p must be in \[0, 1\] \(0: none\), got 1.5"),
        ("generation.min_tokens=-1", r"generation.min_tokens must be >= 0, got -1"),
        ("generation.stop_token_ids=[3,-1]", r"generation.stop_token_ids\[1\] must be a token id >= 0, got -1"),
        ("generation.logit_bias={5: 200}", r"generation.logit_bias.5 must be a bias in \[-100, 100\]"),
        ("generation.logit_bias={-5: 1}", r"generation.logit_bias.-5 must be a bias .* under a token id"),
        ("generation.logit_bias={x: 1}", r"config key 'generation.logit_bias.x': Key x \(str\) is incompatible"),
    ],
)
def test_config_errors_name_the_key_and_the_bound(override, message):
    with pytest.raises(JobError, match=message):
        validate(load_config(default_job_config(), None, [*REQUIRED, override]))


def test_openai_batch_requests_set_the_controls():
    body = {
        "model": "m",
        "prompt": "x",
        "presence_penalty": 0.5,
        "frequency_penalty": -0.5,
        "logit_bias": {"50": -100, "7": 3},
        "repetition_penalty": 1.1,
        "min_p": 0.1,
        "min_tokens": 2,
        "stop_token_ids": [9],
    }
    request = parse_request({"custom_id": "a", "method": "POST", "url": "/v1/completions", "body": body}, samples=1)
    assert request.problem is None
    assert request.settings == {
        "presence_penalty": 0.5,
        "frequency_penalty": -0.5,
        "logit_bias": '{"7": 3.0, "50": -100.0}',
        "repetition_penalty": 1.1,
        "min_p": 0.1,
        "min_tokens": 2,
        "stop_token_ids": [9],
    }
    body["presence_penalty"] = 3
    request = parse_request({"custom_id": "a", "method": "POST", "url": "/v1/completions", "body": body}, samples=1)
    assert "'body.presence_penalty' (presence_penalty) is 3: use a number in [-2, 2]" in request.problem


def test_job_with_controls_in_params_columns(tmp_path, tiny_model_dir, target):
    prompts = [[5, 6, 7], [13], [14, 15, 16], [28]]
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    texts = [tokenizer.decode(p) for p in prompts]
    prompts = [tokenizer(t)["input_ids"] for t in texts]
    per_row = [
        LogitControls(presence_penalty=1.5),
        LogitControls(logit_bias=((40, 2.0),), stop_token_ids=(40,)),
        None,
        LogitControls(repetition_penalty=3.0, min_tokens=2),
    ]
    columns = {
        "prompt": texts,
        "pp": [1.5, None, None, None],
        "bias": pa.array([None, [(40, 2.0)], None, None], pa.map_(pa.int64(), pa.float64())),
        "stops": pa.array([None, [40], None, None], pa.list_(pa.int64())),
        "rp": [None, None, None, 3.0],
        "mt": [None, None, None, 2],
    }
    (tmp_path / "in").mkdir()
    pq.write_table(pa.table(columns), tmp_path / "in" / "a.parquet")
    params = (
        "input.params_columns={presence_penalty: pp, logit_bias: bias, stop_token_ids: stops, repetition_penalty: rp,"
        " min_tokens: mt}"
    )
    extra = ["model.dtype=float64", "generation.max_new_tokens=8", "output.token_ids=true", params]
    assert run_job(job_config(tmp_path, tiny_model_dir, *extra)).status == "succeeded"
    rows = pq.read_table(tmp_path / "out" / part_name(unit_id(0, 0))).to_pylist()
    ids = [derived_row_id("a.parquet", i) for i in range(len(prompts))]
    eos = frozenset({tokenizer.eos_token_id})
    for row_id, prompt, c in zip(ids, prompts, per_row, strict=True):
        request = RowRequest(prompt, row_key(row_id), controls=c)
        params = GenerationParams(8, SamplingParams(), eos)
        expected = AutoregressiveStrategy(target).generate([request], params).rows[0]
        row = next(r for r in rows if r["row_id"] == row_id)
        assert row["token_ids"] == expected.tokens and row["finish_reason"] == expected.finish_reason, row_id
    assert next(r for r in rows if r["row_id"] == ids[1])["finish_reason"] == "stop"


def test_a_strategy_that_never_reads_the_targets_logits_refuses_controls():
    options = StrategyOptions(name="mask_predict")
    assert not registry.problems(options, greedy=True)
    assert any("cannot apply sampling controls" in p for p in registry.problems(options, greedy=True, controls=True))
    assert not registry.problems(StrategyOptions(name="eagle"), greedy=True, controls=True)
    overrides = [*REQUIRED, "strategy.name=mask_predict", "generation.stop_token_ids=[3]"]
    with pytest.raises(JobError, match=r"mask_predict .* cannot apply sampling controls"):
        validate(load_config(default_job_config(), None, overrides))
    assert not sets_controls(RowSettings(1, 0.0, 1.0, (), 0))
    assert sets_controls(RowSettings(1, 0.0, 1.0, (), 0, min_tokens=1))
