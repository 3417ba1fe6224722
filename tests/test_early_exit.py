"""Early exit: a layer-range forward is the forward, self-speculation is greedy decoding faster (float64),
CALM with a threshold no layer reaches is greedy decoding, state propagation fills the skipped
layers' slots as a hand computation does, and calibration meets its agreement target."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import ray
import torch
from conftest import build_tiny_model
from drafted import assert_drafted
from job_config import job_config
from mixed_prompts import PROMPTS
from transformers import AutoModelForCausalLM
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from jobs.calibrate import CalibrateConfig, agreement, calibrate, decode, read_token_prompts
from jobs.calibrate import main as calibrate_main
from jobs.train.corpus import load_corpus
from jobs.train.tokenizer import encode_documents
from pipeline.config import load_config
from pipeline.driver import run_job
from pipeline.errors import JobError
from strategies import registry
from strategies.artifacts.exits import ExitHeads, load_exits, untrained_exits
from strategies.base import GenerationParams, RowRequest
from strategies.decoders.autoregressive import AutoregressiveStrategy
from strategies.decoders.calm import CalmStrategy, never_exiting_threshold, threshold_at
from strategies.methods.calm import CALM_MEASURES, CalmOptions
from strategies.options import StrategyOptions
from strategies.runtime.runner import ModelRunner
from strategies.runtime.sampling import SamplingParams
from workers.common.model_files import weights_sha256
from workers.model_loading import load_models

LAYERS = 4


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny-4-layers"), seed=2, layers=LAYERS)


@pytest.fixture(scope="module")
def model(model_dir):
    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float64)


@pytest.fixture(scope="module")
def target(model):
    return ModelRunner(model)


def trained_like_exits(model, classifier: bool = False) -> ExitHeads:
    """Exits at every inner layer with random (non-zero) adapters and classifiers, as training leaves them."""
    exits = untrained_exits(model, list(range(1, LAYERS)), adapter_rank=4, classifier=classifier)
    torch.manual_seed(0)
    with torch.no_grad():
        for module in exits.exits.values():
            torch.nn.init.normal_(module.up.weight, std=0.3)
    return exits.eval().requires_grad_(False)


def _params(n=12, **sampling):
    return GenerationParams(n, SamplingParams(**sampling), eos_token_ids=frozenset(), ignore_eos=True)


def _requests(prompts):
    return [RowRequest(prompt=list(p), key=i) for i, p in enumerate(prompts)]


def _tokens(strategy, prompts, params):
    return [r.tokens for r in strategy.generate(_requests(prompts), params).rows]


def _prefilled(runner, prompts):
    kv = runner.new_kv(len(prompts))
    runner.prefill(kv, prompts)
    return kv


def _chain(kv, tokens):
    """A chain of `tokens` [B, n] after each row's context: (ids, positions, valid)."""
    ids = torch.tensor(tokens)
    positions = kv.next_pos[:, None] + torch.arange(ids.shape[1])
    return ids, positions, torch.ones_like(ids, dtype=torch.bool)


def _same_cache(a, b):
    assert torch.equal(a.valid, b.valid) and torch.equal(a.next_pos, b.next_pos)
    for la, lb in zip(a.layers, b.layers, strict=True):
        assert la.length == lb.length == a.num_slots
        assert torch.allclose(la.keys, lb.keys, atol=1e-12) and torch.allclose(la.values, lb.values, atol=1e-12)


def test_a_forward_in_two_halves_equals_one_forward(target):
    prompts = PROMPTS[:3]
    whole, halves = _prefilled(target, prompts), _prefilled(target, prompts)
    ids, positions, valid = _chain(whole, [[40, 41, 42], [43, 44, 45], [46, 47, 48]])
    expected = target.forward(whole, ids, positions, valid).logits  # [B, 3, V]
    step = target.layer_pass(halves, ids, positions, valid)
    state = step.run(2).clone()
    step.x = state  # the remaining layers from a given state
    step.run(LAYERS)
    assert torch.allclose(step.head(), expected, atol=1e-12)
    step.finish()
    _same_cache(whole, halves)
    with pytest.raises(ValueError, match="in order"):
        target.layer_pass(halves, ids, positions, valid).run(LAYERS + 1)


def test_a_verify_reuses_the_drafts_early_layers(target):
    """Two draft columns through layers < 2, then a forward of three tokens: layers < 2 run only for
    the third, and logits and cache equal a plain forward's; a forward over other tokens drops them."""
    prompts = PROMPTS[:3]
    plain, drafted = _prefilled(target, prompts), _prefilled(target, prompts)
    ids, positions, valid = _chain(plain, [[40, 41, 42], [43, 44, 45], [46, 47, 48]])
    expected = target.forward(plain, ids, positions, valid).logits
    for column in range(2):
        target.forward_early(drafted, ids[:, column : column + 1], positions[:, column : column + 1], valid[:, :1], 2)
    assert drafted.provisional.count == 2 and drafted.layers[0].length == drafted.num_slots + 2
    assert drafted.layers[2].length == drafted.num_slots
    assert torch.allclose(target.forward(drafted, ids, positions, valid).logits, expected, atol=1e-12)
    assert drafted.provisional is None
    _same_cache(plain, drafted)
    # Columns for other tokens are not reused: the forward drops them and computes every layer.
    ids, positions, valid = _chain(plain, [[50], [51], [52]])
    expected = target.forward(plain, ids, positions, valid).logits
    target.forward_early(drafted, ids + 1, positions, valid, 2)
    assert torch.allclose(target.forward(drafted, ids, positions, valid).logits, expected, atol=1e-12)
    _same_cache(plain, drafted)
    # Rows leaving the batch drop provisional columns too: every layer keeps the shared slot count.
    target.forward_early(drafted, ids, positions, valid, 2)
    drafted.select_rows(torch.tensor([0, 2]))
    assert drafted.provisional is None and {layer.length for layer in drafted.layers} == {drafted.num_slots}


def test_state_propagation_writes_the_skipped_layers_slots(model, target):
    """Row 1 exits after layer 1: layers 1..3 write its keys and values projected from its layer-1 state,
    by hand: k = RoPE(W_k · RMSNorm_l(h)), v = W_v · RMSNorm_l(h); row 0 goes through every layer."""
    prompts = PROMPTS[:2]
    kv, full = _prefilled(target, prompts), _prefilled(target, prompts)
    ids, positions, valid = _chain(kv, [[40], [41]])
    expected = target.forward(full, ids, positions, valid).logits
    step = target.layer_pass(kv, ids, positions, valid)
    exit_state = step.run(1)[1].clone()  # [1, D] row 1 after layer 1
    step.run(LAYERS, rows=torch.tensor([0]))
    assert torch.equal(step.x[1], exit_state)
    assert torch.allclose(step.head(torch.tensor([0])), expected[:1], atol=1e-12)
    step.finish()
    inner, head_dim = model.model, model.config.hidden_size // model.config.num_attention_heads
    cos, sin = inner.rotary_emb(exit_state[None], positions[1:])
    for index in range(1, LAYERS):
        layer = inner.layers[index]
        normed = layer.input_layernorm(exit_state[None])  # [1, 1, D]
        k = layer.self_attn.k_proj(normed).view(1, 1, -1, head_dim).transpose(1, 2)  # [1, Hkv, 1, hd]
        v = layer.self_attn.v_proj(normed).view(1, 1, -1, head_dim).transpose(1, 2)
        k, _ = apply_rotary_pos_emb(k, k, cos, sin)
        assert torch.allclose(kv.layers[index].keys[1:, :, -1:], k, atol=1e-12)
        assert torch.allclose(kv.layers[index].values[1:, :, -1:], v, atol=1e-12)
        assert torch.allclose(kv.layers[index].keys[:1, :, -1:], full.layers[index].keys[:1, :, -1:], atol=1e-12)
    assert torch.allclose(kv.layers[0].keys, full.layers[0].keys, atol=1e-12)  # layer 0: every row went through
    assert kv.num_slots == full.num_slots and torch.equal(kv.valid, full.valid)


@pytest.mark.parametrize("prompts", [PROMPTS[:1], PROMPTS], ids=["batch1", "batch8"])
def test_self_speculative_equals_greedy(model, target, prompts):
    params = _params()
    reference = _tokens(AutoregressiveStrategy(target), prompts, params)
    models = registry.Models(target, exits=trained_like_exits(model))
    reused = []
    original = target._forward_reusing
    target._forward_reusing = lambda *args, **kwargs: reused.append(1) or original(*args, **kwargs)
    try:
        # This random model gives its tokens probabilities of a few percent: 0.02 stops some drafts early.
        for exit_layer, min_confidence in ((1, 0.0), (LAYERS - 1, 0.0), (2, 0.02)):
            options = StrategyOptions(name="self_speculative")
            options.self_speculative.exit_layer = exit_layer
            options.self_speculative.min_confidence = min_confidence
            out = registry.create(options, models).generate(_requests(prompts), params)
            assert [r.tokens for r in out.rows] == reference
            assert_drafted(out.stats, every_step=min_confidence == 0.0)
    finally:
        del target._forward_reusing
    assert len(reused) >= out.target_forwards  # every verify reused the draft's early layers


def test_sampled_self_speculation_runs_to_length(model, target):
    models = registry.Models(target, exits=trained_like_exits(model))
    strategy = registry.create(StrategyOptions(name="self_speculative"), models)
    out = strategy.generate(_requests(PROMPTS), _params(12, temperature=0.8, top_k=40, seed=1))
    assert all(len(r.tokens) == 12 for r in out.rows)
    assert_drafted(out.stats, every_step=True)
    assert registry.lossy_reason("self_speculative", StrategyOptions()) is None


@pytest.mark.parametrize("measure", CALM_MEASURES)
def test_calm_with_a_threshold_no_layer_reaches_equals_greedy(model, target, measure):
    params = _params()
    reference = _tokens(AutoregressiveStrategy(target), PROMPTS, params)
    exits = trained_like_exits(model, classifier=True)
    options = CalmOptions(threshold=never_exiting_threshold(CalmOptions().decay_tau), measure=measure)
    out = CalmStrategy(target, exits, options).generate(_requests(PROMPTS), params)
    assert [r.tokens for r in out.rows] == reference
    assert {r.columns["mean_exit_layer"] for r in out.rows} == {float(LAYERS)}


def test_the_thresholds_that_never_exit_are_the_ones_the_help_names():
    """Confidence can be exactly 1, and a token exits when it reaches λ_t: λ never exits when λ_t > 1
    for every token t < N of every length N, i.e. λ ≥ 1/(0.9 + 0.1·exp(−τ)); just above 1 late tokens exit."""
    help_text = next(f for f in dataclasses.fields(CalmOptions) if f.name == "threshold").metadata["help"]
    assert CalmOptions().decay_tau == 4.0 and f"{never_exiting_threshold(4.0):.4f} at τ = 4" in help_text
    assert never_exiting_threshold(0.0) == 1.0 and "1 at τ = 0" in help_text
    for n in (2, 64, 4096):
        tokens = torch.arange(1, n)  # the prefill chooses token 0 with the full model
        assert float(threshold_at(never_exiting_threshold(4.0), 4.0, tokens, n).min()) > 1.0
    late = threshold_at(1.05, 4.0, torch.arange(1, 64), 64)
    assert float(late[0]) > 1.0 and float(late[-1]) < 1.0  # a confidence of exactly 1 exits late tokens


def test_calm_rows_exit_at_their_own_layers(model, target):
    exits = trained_like_exits(model)
    params = _params()
    rows = CalmStrategy(target, exits, CalmOptions(threshold=0.995, measure="state")).generate(
        _requests(PROMPTS), params
    )
    depths = [r.columns["mean_exit_layer"] for r in rows.rows]
    assert len(set(depths)) > 1 and min(depths) < LAYERS
    # The reference's rule: the batch exits together, so no row exits earlier than under the row rule.
    together = CalmStrategy(target, exits, CalmOptions(threshold=0.995, measure="state", batch_exit="batch"))
    assert together.generate(_requests(PROMPTS), params).stats["mean_exit_layer"] >= rows.stats["mean_exit_layer"]
    # A threshold every exit reaches: each token after the prefill's exits after layer 1, whatever the measure.
    for measure in ("softmax", "gap", "classifier"):
        calm = CalmStrategy(target, trained_like_exits(model, classifier=True), CalmOptions(1e-9, measure))
        out = calm.generate(_requests(PROMPTS[:3]), params)
        assert all(r.columns["mean_exit_layer"] == (LAYERS + len(r.tokens) - 1) / len(r.tokens) for r in out.rows)
    assert registry.lossy_reason("calm", StrategyOptions(name="calm")) is not None
    assert "calm" not in registry.auto_candidates(StrategyOptions(name="auto"), {"exits"})
    assert "self_speculative" in registry.auto_candidates(StrategyOptions(name="auto"), {"exits"})
    with pytest.raises(ValueError, match="classifier"):
        CalmStrategy(target, exits, CalmOptions(measure="classifier"))


def test_calibration_meets_its_agreement_target(model, target):
    exits = trained_like_exits(model)
    prompts = PROMPTS[:4]
    result = calibrate(target, exits, CalmOptions(measure="state"), prompts, 16, [0.9, 0.99, 0.999, 2.0], 0.95, 4)
    assert [p.threshold for p in result.points] == [0.9, 0.99, 0.999, 2.0]
    assert [p.threshold for p in result.held_out] == [0.9, 0.99, 0.999, 2.0]
    assert result.points[-1].agreement == 1.0 and result.points[-1].mean_exit_layer == LAYERS
    chosen = result.chosen
    assert chosen is not None and chosen.agreement >= 0.95
    assert all(p.agreement < 0.95 or p.mean_exit_layer >= chosen.mean_exit_layer for p in result.points)
    # Chosen on prompts 0 and 2, reported on prompts 1 and 3: each half's agreement is its own.
    strategy = CalmStrategy(target, exits, CalmOptions(threshold=chosen.threshold, measure="state"))
    for half, point in ((prompts[0::2], chosen), (prompts[1::2], result.chosen_held_out)):
        outputs, _, _ = decode(strategy, half, _params(16), 4)
        assert agreement(target, half, outputs, 4) == point.agreement and point.threshold == chosen.threshold
    with pytest.raises(JobError, match="at least 2 prompts"):
        calibrate(target, exits, CalmOptions(measure="state"), prompts[:1], 16, [0.9], 0.95, 4)


def test_calibrate_command_prints_the_curve_and_its_choice(tmp_path, model_dir, model, capsys):
    exits = trained_like_exits(model)
    exits.config.target_path, exits.config.target_weights_sha256 = str(model_dir), weights_sha256(model_dir)
    exits.save(tmp_path / "exits")
    pq.write_table(pa.table({"prompt": ["def f(x):", "import os", "class A:"]}), tmp_path / "prompts.parquet")
    args = [
        "calm",
        f"prompts={tmp_path / 'prompts.parquet'}",
        f"model={model_dir}",
        f"exits={tmp_path / 'exits'}",
        "max_new_tokens=8",
        "thresholds=[0.9,2.0]",
        "calm.measure=state",
        f"report={tmp_path / 'curve.json'}",
    ]
    assert calibrate_main(args) == 0
    out = capsys.readouterr().out
    assert "chosen: strategy.calm.threshold=" in out and "on the calibration half" in out and "held out)" in out
    assert "calibration half (prompts 0, 2, 4…: chooses)" in out and "held-out half (prompts 1, 3, 5…: reports)" in out
    report = json.loads((tmp_path / "curve.json").read_text())
    assert [p["threshold"] for p in report["points"]] == [0.9, 2.0] and report["chosen"]["agreement"] >= 0.95
    assert [p["threshold"] for p in report["held_out"]] == [0.9, 2.0]
    assert report["chosen_held_out"]["threshold"] == report["chosen"]["threshold"]


def test_calibrate_command_takes_training_prompts_from_the_corpus(tmp_path, model_dir, model, capsys):
    exits = trained_like_exits(model, classifier=True)
    exits.config.target_path, exits.config.target_weights_sha256 = str(model_dir), weights_sha256(model_dir)
    exits.save(tmp_path / "exits")
    corpus_keys = ["corpus.max_files=20", "corpus.heldout_percent=25"]
    config = load_config(
        CalibrateConfig(), None, ["prompts=corpus", "num_prompts=4", "max_prompt_tokens=12", "seed=3", *corpus_keys]
    )
    tokenizer = load_models(str(model_dir), torch.float64, torch.device("cpu"), {}).tokenizer
    prompts = read_token_prompts(config, tokenizer)
    corpus = load_corpus(config.corpus)
    assert corpus.heldout, "the test's corpus must hold files out, or it cannot tell the splits apart"
    train = encode_documents(tokenizer, corpus.train).tolist()
    assert len(prompts) == 4 and all(len(p) == 12 for p in prompts) and len({tuple(p) for p in prompts}) == 4
    # Each prompt is a window of the train split's token stream.
    assert all(any(train[s : s + 12] == p for s in range(len(train) - 11)) for p in prompts)
    args = [
        "calm",
        "prompts=corpus",
        *corpus_keys,
        "num_prompts=4",
        "max_prompt_tokens=12",
        f"model={model_dir}",
        f"exits={tmp_path / 'exits'}",
        "max_new_tokens=6",
        "measures=[state,classifier]",
        "thresholds=[0.9,2.0]",
        f"report={tmp_path / 'out' / 'curve.json'}",
    ]
    assert calibrate_main(args) == 0
    out = capsys.readouterr().out
    assert "calm (state, classifier;" in out and "strategy.calm.measure=" in out
    report = json.loads((tmp_path / "out" / "curve.json").read_text())
    settings = [(p["measure"], p["threshold"]) for p in report["points"]]
    assert settings == [("state", 0.9), ("state", 2.0), ("classifier", 0.9), ("classifier", 2.0)]
    assert [(p["measure"], p["threshold"]) for p in report["held_out"]] == settings
    never_exits = [p for p in report["points"] if p["threshold"] == 2.0]
    assert all(p["agreement"] == 1.0 and p["mean_exit_layer"] == LAYERS for p in never_exits)
    chosen = report["chosen"]
    assert chosen["agreement"] >= 0.95
    assert all(p["agreement"] < 0.95 or p["mean_exit_layer"] >= chosen["mean_exit_layer"] for p in report["points"])
    with pytest.raises(JobError, match=r"measures=\['entropy'\]: \['entropy'\] are not CALM measures"):
        calibrate_main(["calm", "measures=[entropy]", f"model={model_dir}", f"exits={tmp_path / 'exits'}"])
    plain_exits = trained_like_exits(model)
    plain_exits.config.target_path, plain_exits.config.target_weights_sha256 = str(model_dir), weights_sha256(model_dir)
    plain_exits.save(tmp_path / "plain-exits")
    with pytest.raises(JobError, match="have no classifier"):
        calibrate_main(
            ["calm", "measures=[state,classifier]", f"model={model_dir}", f"exits={tmp_path / 'plain-exits'}"]
        )


def test_shipped_calm_default_is_a_setting_its_calibration_run_chose_among():
    run = load_config(CalibrateConfig(), str(Path(__file__).parents[1] / "jobs/configs/calibrate_calm.yaml"), [])
    default = CalmOptions()
    assert run.prompts == "corpus" and run.target_agreement >= 0.95
    assert default.measure in run.measures and default.threshold in run.thresholds
    assert default.decay_tau == run.calm.decay_tau and default.min_layer == run.calm.min_layer
    assert default.batch_exit == run.calm.batch_exit


def test_other_architectures_refuse_early_exit(model_dir, model):
    runner = ModelRunner(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float64))
    runner._fast = None  # what any model outside the lean forward's families gets
    models = registry.Models(runner, exits=trained_like_exits(model))
    for name in ("self_speculative", "calm"):
        with pytest.raises(ValueError, match="lean Llama-family forward"):
            registry.create(StrategyOptions(name=name), models)
    with pytest.raises(ValueError, match=r"set model\.exits"):
        registry.create(StrategyOptions(name="calm"), registry.Models(ModelRunner(model)))
    bad = StrategyOptions(name="calm")
    bad.calm.measure = "entropy"
    assert any("strategy.calm" in p for p in registry.problems(bad, greedy=True))


def test_exits_folder_round_trip_and_refusal(tmp_path, model_dir, model, tiny_model_dir):
    exits = trained_like_exits(model)
    exits.config.target_path = str(model_dir)
    exits.config.target_weights_sha256 = weights_sha256(model_dir)
    exits.save(tmp_path / "exits")
    loaded = load_exits(tmp_path / "exits", torch.float64, torch.device("cpu"))
    loaded.use_lm_head(model.lm_head.weight)
    hidden = torch.randn(3, model.config.hidden_size, dtype=torch.float64)
    assert torch.allclose(loaded.logits(2, hidden), exits.logits(2, hidden))
    assert "lm_head" not in loaded.state_dict()
    models = load_models(str(model_dir), torch.float64, torch.device("cpu"), {"exits": str(tmp_path / "exits")})
    assert models.models.get("exits").layers == [1, 2, 3]
    with pytest.raises(ValueError, match=f"trained for the target at {model_dir}"):
        load_models(str(tiny_model_dir), torch.float64, torch.device("cpu"), {"exits": str(tmp_path / "exits")})


def test_calm_job_is_recorded_lossy_with_each_rows_exit_layer(tmp_path, model_dir, model):
    exits = trained_like_exits(model)
    exits.config.target_path, exits.config.target_weights_sha256 = str(model_dir), weights_sha256(model_dir)
    exits.save(tmp_path / "exits")
    (tmp_path / "in").mkdir()
    pq.write_table(pa.table({"prompt": ["def f(x):", "import os", "class A:"]}), tmp_path / "in" / "a.parquet")
    common = ["model.dtype=float64", "generation.max_new_tokens=8", "generation.ignore_eos=true"]
    calm = [*common, "strategy.name=calm", "strategy.calm.measure=state", f"model.exits={tmp_path / 'exits'}"]
    try:
        assert run_job(job_config(tmp_path, model_dir, *calm)).status == "succeeded"
        rows = pq.read_table(tmp_path / "out").to_pylist()
        assert {r["strategy"] for r in rows} == {"calm"}
        assert all(1 <= r["mean_exit_layer"] <= LAYERS for r in rows)
        manifest = json.loads((tmp_path / "out" / "_manifest.json").read_text())
        assert "CALM" in manifest["lossy"]["calm"] and "exits" in manifest["identity"]["model"]["weights_sha256"]
        with pytest.raises(JobError, match="exit heads trained on the target"):
            run_job(job_config(tmp_path, model_dir, "strategy.name=self_speculative"))
    finally:
        ray.shutdown()
