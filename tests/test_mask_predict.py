"""Mask-Predict and the CMLM drafter: the decoding loop on literal probabilities, batching, the model folder.

The loop's specification is the paper's: pass 0 predicts every position, pass t re-masks the
⌊N·(T−t)/T⌋ least probable tokens, the length candidate of highest mean log-probability wins. As a
drafter the CMLM is verified by the target, so `speculative` with it is greedy decoding (float64).
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import ray
import torch
from drafted import assert_drafted
from transformers import AutoModelForCausalLM, AutoTokenizer

from jobs.bench.agreement import agreement, chrf, token_accuracy
from jobs.bench.decoding import Bench
from jobs.bench.settings import BenchConfig
from jobs.train.cmlm import cmlm_from_target, cmlm_tokenizer_and_config
from pipeline.config import load_config
from pipeline.driver import run_job
from pipeline.errors import JobError
from strategies import registry
from strategies.artifacts.cmlm import read_config, write_config
from strategies.base import GenerationParams, RowRequest
from strategies.decoders.autoregressive import AutoregressiveStrategy
from strategies.decoders.mask_predict import best_lanes, length_candidates, lowest, refine, remask_counts
from strategies.options import StrategyOptions
from strategies.runtime.sampling import SamplingParams
from tests.job_config import job_config
from tests.mixed_prompts import PROMPTS
from workers.model_loading import load_models

MASK = 99
BLOCK = 8  # the tiny CMLM's longest block


def test_the_number_remasked_follows_the_linear_schedule():
    sizes = torch.tensor([10, 4, 1])
    assert [remask_counts(sizes, t, 4).tolist() for t in (1, 2, 3)] == [[7, 3, 0], [5, 2, 0], [2, 1, 0]]
    assert remask_counts(torch.tensor([64]), 9, 10).tolist() == [6]


def test_lowest_picks_the_least_probable_valid_positions_earlier_first_on_ties():
    scores = torch.tensor([[-0.1, -2.0, -0.5, -2.0], [-3.0, -0.2, -9.0, -9.0]])
    valid = torch.tensor([[True, True, True, True], [True, True, False, False]])
    chosen = lowest(scores, valid, torch.tensor([2, 1]))
    assert chosen.tolist() == [[False, True, False, True], [True, False, False, False]]
    assert lowest(scores, valid, torch.tensor([0, 5])).tolist() == [[False] * 4, [True, True, False, False]]


class ScriptedCMLM:
    """A fake CMLM: at each pass, per lane and position, the log-probabilities of a literal table; it
    records the blocks it was shown (which positions were masked)."""

    def __init__(self, passes: list[torch.Tensor]) -> None:
        self.passes = passes  # per pass: [lanes, W, V] log-probabilities
        self.shown: list[list[list[int]]] = []

    def __call__(self, blocks: list[list[int]], masked: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.shown.append([list(b) for b in blocks])
        best, token = self.passes[len(self.shown) - 1].max(dim=-1)
        return best.masked_fill(~masked, 0.0), token.masked_fill(~masked, 0)


def _table(choices: list[list[tuple[int, float]]], vocab: int = 6) -> torch.Tensor:
    """[lanes, W, V] log-probabilities whose argmax at (lane, i) is choices[lane][i] = (token, prob)."""
    lanes, width = len(choices), max(len(c) for c in choices)
    probs = torch.full((lanes, width, vocab), 1e-3)
    for lane, row in enumerate(choices):
        for i, (token, p) in enumerate(row):
            probs[lane, i, token] = p
    return probs.log()


def test_each_pass_remasks_the_least_confident_tokens_and_predicts_only_them():
    first = _table([[(1, 0.9), (2, 0.2), (3, 0.6), (4, 0.3)]])
    second = _table([[(5, 0.95), (5, 0.8), (5, 0.9), (5, 0.7)]])
    third = _table([[(0, 0.99)] * 4])
    model = ScriptedCMLM([first, second, third])
    out = refine(model, [4], iterations=3, mask_id=MASK)
    # Pass 0 shows four masks; pass 1 re-masks ⌊4·2/3⌋ = 2 (positions 1 and 3: p 0.2, 0.3); pass 2 re-masks
    # ⌊4/3⌋ = 1: the lowest of 0.9, 0.8 (pos 1, new), 0.6 (pos 2, kept from pass 0), 0.7 (pos 3, new) is pos 2.
    assert model.shown == [[[MASK] * 4], [[1, MASK, 3, MASK]], [[1, 5, MASK, 5]]]
    assert out.tokens == [[1, 5, 0, 5]]
    assert out.passes == [3]
    expected = torch.tensor([0.9, 0.8, 0.99, 0.7]).log().mean()
    assert torch.isclose(out.scores[0], expected, atol=1e-5)


def test_lanes_of_different_sizes_stop_remasking_when_their_count_reaches_zero():
    first = _table([[(1, 0.5), (1, 0.4), (1, 0.3), (1, 0.2)], [(2, 0.1)]])
    second = _table([[(3, 0.9)] * 4, [(4, 0.9)]])
    model = ScriptedCMLM([first, second])
    out = refine(model, [4, 1], iterations=2, mask_id=MASK)
    # Pass 1 re-masks ⌊4/2⌋ = 2 of lane 0 and ⌊1/2⌋ = 0 of lane 1, which keeps its token.
    assert model.shown[1] == [[1, 1, MASK, MASK], [2]]
    assert out.tokens == [[1, 1, 3, 3], [2]]
    assert out.passes == [2, 1]


def test_the_length_beam_keeps_the_candidate_of_highest_mean_log_probability():
    lengths = torch.tensor([[-3.0, -0.1, -1.0, -0.5], [-0.2, -4.0, -0.3, -0.9]])  # log p(length = 1..4)
    assert length_candidates(lengths, caps=[4, 2], beam=2) == [[2, 4], [1, 2]]
    assert length_candidates(lengths, caps=[1, 4], beam=3) == [[1], [1, 3, 4]]
    scores = torch.tensor([-0.5, -0.2, -0.9, -0.9])
    assert best_lanes(scores, owners=[0, 0, 1, 1], rows=2) == [1, 2]  # a tie keeps the more likely length


@pytest.fixture(scope="module")
def cmlm_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An untrained CMLM of the tiny target (its one of two layers), saved as `train cmlm` saves one."""
    out = tmp_path_factory.mktemp("cmlm")
    target = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    tokenizer, config = cmlm_tokenizer_and_config(AutoTokenizer.from_pretrained(tiny_model_dir), BLOCK)
    torch.manual_seed(0)
    model = cmlm_from_target(target, 1, len(tokenizer), seed=0)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    write_config(out, config)
    return out


@pytest.fixture(scope="module")
def models(tiny_model_dir: Path, cmlm_dir: Path) -> registry.Models:
    return load_models(str(tiny_model_dir), torch.float64, torch.device("cpu"), {"cmlm": str(cmlm_dir)}).models


def _requests(prompts):
    return [RowRequest(prompt=list(p), key=i) for i, p in enumerate(prompts)]


def _mask_predict(models, iterations=4, length_beam=2):
    options = StrategyOptions(name="mask_predict")
    options.mask_predict.iterations, options.mask_predict.length_beam = iterations, length_beam
    return registry.create(options, models)


def test_rows_of_different_lengths_decode_the_same_alone_and_together(models):
    eos = frozenset({0})
    params = GenerationParams(20, SamplingParams(), eos_token_ids=eos)
    strategy = _mask_predict(models)
    together = strategy.generate(_requests(PROMPTS), params).rows
    alone = [strategy.generate(_requests([p]), params).rows[0] for p in PROMPTS]
    assert [r.tokens for r in together] == [r.tokens for r in alone]
    assert [r.columns["block_lengths"] for r in together] == [r.columns["block_lengths"] for r in alone]
    assert [r.columns["iterations"] for r in together] == [r.columns["iterations"] for r in alone]
    first_lengths = {r.columns["block_lengths"][0] for r in together}
    assert len(first_lengths) > 1, "the batch should mix block lengths"
    for row in together:  # a block shorter than asked for ends the row only at an EOS; else blocks go on
        assert sum(row.columns["block_lengths"]) >= len(row.tokens) and 1 <= row.columns["iterations"] <= 4 * len(
            row.columns["block_lengths"]
        )


def test_ignore_eos_fills_max_new_tokens_in_blocks_of_the_longest_length(models):
    params = GenerationParams(20, SamplingParams(), eos_token_ids=frozenset({0}), ignore_eos=True)
    rows = _mask_predict(models).generate(_requests(PROMPTS[:3]), params).rows
    assert all(len(r.tokens) == 20 and r.columns["block_lengths"] == [BLOCK, BLOCK, 4] for r in rows)


def test_the_folder_loads_with_plain_transformers_and_the_block_pass_is_a_4d_mask(cmlm_dir: Path, models):
    model = AutoModelForCausalLM.from_pretrained(cmlm_dir, dtype=torch.float64).eval()
    config = read_config(cmlm_dir)
    context, block = [5, 6, 7, 8], [config.mask_token_id, 40, config.mask_token_id]
    ids = torch.tensor([[*context, config.length_token_id, config.length_id(3), *block]])
    n = ids.shape[1]
    allowed = torch.ones(n, n, dtype=torch.bool).tril()
    allowed[len(context) + 1 :, len(context) + 1 :] = True
    mask = torch.zeros(1, 1, n, n, dtype=torch.float64).masked_fill(~allowed, torch.finfo(torch.float64).min)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask).logits[0]  # [n, V]
    plain = torch.log_softmax(logits[len(context) + 2 :, : config.content_vocab_size], dim=-1)
    cmlm = models.get("cmlm")
    kv = cmlm.new_kv(1)
    read = cmlm.token_logprobs(cmlm.read(kv, [context], [block]).states)
    assert kv.num_slots == len(context)  # the block's slots are dropped, the context stays
    assert torch.allclose(read[0].double(), plain, atol=1e-5)
    again = cmlm.token_logprobs(cmlm.read(kv, [[]], [block]).states)  # the cached context gives the same
    assert torch.allclose(again, read, atol=1e-6)


@pytest.mark.parametrize("prompts", [PROMPTS[:1], PROMPTS], ids=["batch1", "batch8"])
def test_speculative_with_the_cmlm_drafter_is_greedy_decoding(models, prompts):
    params = GenerationParams(20, SamplingParams(), eos_token_ids=frozenset(), ignore_eos=True)
    reference = [r.tokens for r in AutoregressiveStrategy(models.target).generate(_requests(prompts), params).rows]
    options = StrategyOptions(name="speculative", adaptive=False)
    options.speculative.drafter = "cmlm"
    out = registry.create(options, models).generate(_requests(prompts), params)
    assert [r.tokens for r in out.rows] == reference
    assert_drafted(out.stats, every_step=True)
    exact = StrategyOptions(name="specdec", adaptive=False)
    exact.specdec.drafter, exact.specdec.top_beta, exact.specdec.tolerance = "cmlm", 1, 0.0
    out = registry.create(exact, models).generate(_requests(prompts), params)
    assert [r.tokens for r in out.rows] == reference
    assert_drafted(out.stats, every_step=True)


def test_mask_predict_is_lossy_greedy_only_and_never_chosen_by_auto():
    options = StrategyOptions(name="mask_predict")
    assert registry.lossy_reason("mask_predict", options) is not None
    assert "mask_predict" not in registry.auto_candidates(StrategyOptions(name="auto"), {"cmlm", "draft"})
    assert any("temperature 0" in p for p in registry.problems(options, greedy=False))
    assert registry.needs_models("mask_predict", options) == {"cmlm"}
    options.specdec.drafter = "cmlm"
    assert registry.needs_models("specdec", options) == {"cmlm"}
    options.speculative.drafter = "nope"
    assert any("strategy.speculative.drafter" in p for p in registry.problems(options, greedy=True))


def test_agreement_measures_on_literal_rows():
    assert token_accuracy([1, 2, 3, 4], [1, 2, 9, 4]) == 0.75
    assert token_accuracy([1, 2], [1, 2, 3, 4]) == 0.5  # missing tokens count as wrong
    assert chrf("def f(x):", "def f(x):") == 100.0
    assert chrf("abc", "xyz") == 0.0
    shifted = chrf("return  x + 1", "return x+1")  # whitespace does not count
    assert shifted == 100.0
    partial = chrf("return x + 2", "return x + 1")
    assert 50.0 < partial < 100.0
    numbers = agreement([[1, 2], [3, 4]], [[1, 2], [3, 5]], ["ab", "cd"], ["ab", "ce"])
    assert numbers["exact_match"] == 0.5 and numbers["token_accuracy"] == 0.75 and 0 < numbers["chrf"] < 100


def test_bench_sweeps_mask_predict_passes_beside_the_target(tiny_model_dir: Path, cmlm_dir: Path, tmp_path: Path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("\n".join(json.dumps({"prompt": p}) for p in ["def f(x):", "import os", "class A:"]) + "\n")
    config = load_config(
        BenchConfig(),
        None,
        [
            f"prompts={prompts}",
            f"model={tiny_model_dir}",
            f"cmlm={cmlm_dir}",
            "strategies=[autoregressive,mask_predict,speculative]",
            "mask_predict_iterations=[1,3]",
            "drafters=[cmlm]",
            "transformers=[]",
            "batch_sizes=[2]",
            "num_prompts=3",
            "max_new_tokens=6",
            "repeats=1",
            "dtype=float64",
        ],
    )
    rows = {r["contender"]: r for r in Bench(config).run()}
    assert set(rows) == {"autoregressive", "mask_predict T=1", "mask_predict T=3", "speculative drafter=cmlm"}
    exact = {"exact_match": 1.0, "token_accuracy": 1.0, "chrf": 100.0}
    assert rows["autoregressive"]["agreement"] == exact == rows["speculative drafter=cmlm"]["agreement"]
    assert rows["speculative drafter=cmlm"]["tau"] >= 1.0
    assert all(0.0 <= rows[n]["agreement"]["token_accuracy"] < 1.0 for n in ("mask_predict T=1", "mask_predict T=3"))


def test_mask_predict_job_records_each_rows_passes_and_lengths_and_is_lossy(tiny_model_dir, cmlm_dir, tmp_path):
    (tmp_path / "in").mkdir()
    pq.write_table(pa.table({"prompt": ["def f(x):", "import os", "class A:"]}), tmp_path / "in" / "a.parquet")
    common = ["model.dtype=float64", "generation.max_new_tokens=10", f"model.cmlm={cmlm_dir}"]
    try:
        with pytest.raises(JobError, match="temperature 0"):
            run_job(
                job_config(tmp_path, tiny_model_dir, *common, "strategy.name=mask_predict", "generation.temperature=1")
            )
        with pytest.raises(JobError, match="conditional masked LM"):
            run_job(job_config(tmp_path, tiny_model_dir, "strategy.name=mask_predict"))
        config = job_config(
            tmp_path, tiny_model_dir, *common, "strategy.name=mask_predict", "strategy.mask_predict.iterations=3"
        )
        assert run_job(config).status == "succeeded"
        rows = pq.read_table(tmp_path / "out").to_pylist()
        assert {r["strategy"] for r in rows} == {"mask_predict"} and len(rows) == 3
        for r in rows:
            assert 1 <= r["iterations"] <= 3 * len(r["block_lengths"])
            assert r["num_generated_tokens"] <= sum(r["block_lengths"])
        manifest = json.loads((tmp_path / "out" / "_manifest.json").read_text())
        assert "Mask-Predict" in manifest["lossy"]["mask_predict"]
        assert "cmlm" in manifest["identity"]["model"]["weights_sha256"]
    finally:
        ray.shutdown()
