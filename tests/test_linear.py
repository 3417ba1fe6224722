"""`linear`: float32 CPU inference through packed weights computes F.linear; everything else is F.linear."""

from __future__ import annotations

import gc

import pytest
import torch
import torch.nn.functional as F
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

from strategies.runtime import linear as packed
from strategies.runtime.linear import linear
from strategies.runtime.runner import ModelRunner

needs_onednn = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="torch is built without oneDNN")


@pytest.fixture(autouse=True)
def packing_on():
    before, by_rows = packed.packing(), dict(packed._by_rows)
    packed.set_packing(True)
    packed.pack_by_rows({})
    yield
    packed.set_packing(before)
    packed.pack_by_rows(by_rows)


def _weights(dtype=torch.float32):
    torch.manual_seed(0)
    return torch.randn(48, 32, dtype=dtype), torch.randn(48, dtype=dtype)


@needs_onednn
@pytest.mark.parametrize("rows", [0, 1, 3, 9, 40])
def test_packed_rows_of_any_count_equal_f_linear(rows):
    weight, bias = _weights()
    x = torch.randn(2, rows, 32)
    with torch.inference_mode():
        out = linear(x, weight, bias)
    assert out.shape == (2, rows, 48)
    assert torch.allclose(out, F.linear(x, weight, bias), atol=1e-5)
    assert (packed.ONEDNN, weight.data_ptr(), (48, 32), (32, 1)) in packed._packed


@needs_onednn
def test_a_weight_changed_in_place_is_packed_again():
    weight, _ = _weights()
    x = torch.randn(5, 32)
    with torch.no_grad():
        first = linear(x, weight)
        weight.mul_(2.0)
        second = linear(x, weight)
    assert torch.allclose(second, 2.0 * first, atol=1e-5)


@needs_onednn
def test_a_view_shares_its_weights_packed_copy_and_a_dead_weight_takes_its_copy_along():
    weight, _ = _weights()
    x = torch.randn(5, 32)
    with torch.no_grad():
        linear(x, weight)
        copy = packed._packed[(packed.ONEDNN, weight.data_ptr(), (48, 32), (32, 1))][2]
        linear(x, weight.detach())  # a view sharing the storage and its version: the same packed copy
        assert packed._packed[(packed.ONEDNN, weight.data_ptr(), (48, 32), (32, 1))][2] is copy
        key = (packed.ONEDNN, weight.data_ptr(), (48, 32), (32, 1))
        del weight
        gc.collect()
    assert key not in packed._packed


def test_float64_gradients_and_packing_off_are_f_linear_bit_for_bit():
    weight, bias = _weights(torch.float64)
    x = torch.randn(3, 32, dtype=torch.float64)
    assert torch.equal(linear(x, weight, bias), F.linear(x, weight, bias))
    weight32 = weight.float().requires_grad_()
    x32 = x.float()
    out = linear(x32, weight32)  # needs gradients: F.linear's autograd
    out.sum().backward()
    assert torch.equal(weight32.grad, x32.sum(0).expand(48, 32))
    packed.set_packing(False)
    with torch.no_grad():
        assert torch.equal(linear(x32, weight32), F.linear(x32, weight32))
    assert not packed._packed


@needs_onednn
def test_the_lean_forward_in_float32_packed_gives_the_logits_and_greedy_tokens_of_f_linear():
    """The packed path through a whole model: prefill and a 4-token step agree with F.linear's."""
    from test_llama_forward import SMALL

    torch.manual_seed(0)
    runner = ModelRunner(LlamaForCausalLM(LlamaConfig(**SMALL)).eval())
    prompts = [[3, 4, 5, 6, 7], [8, 9]]
    nodes = torch.tensor([[10, 11, 12, 13], [14, 15, 16, 17]])
    results = []
    for enabled in (True, False):
        packed.set_packing(enabled)
        with torch.inference_mode():
            kv = runner.new_kv(2)
            first = runner.prefill(kv, prompts).logits
            positions = kv.next_pos[:, None] + torch.arange(4)
            out = runner.forward(kv, nodes, positions, torch.ones_like(nodes, dtype=torch.bool))
        results.append((first, out.logits))
    (first, step), (first_ref, step_ref) = results
    assert torch.allclose(first, first_ref, atol=1e-4) and torch.allclose(step, step_ref, atol=1e-4)
    assert torch.equal(step.argmax(-1), step_ref.argmax(-1))


def test_code_being_compiled_runs_f_linear(monkeypatch):
    """Under `torch.compile` (`model.compile`) inductor chooses the kernels: nothing is packed there."""
    weight, bias = _weights()
    x = torch.randn(3, 32)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    with torch.no_grad():
        assert torch.equal(linear(x, weight, bias), F.linear(x, weight, bias))
    assert (packed.ONEDNN, weight.data_ptr(), (48, 32), (32, 1)) not in packed._packed


@needs_onednn
def test_a_slice_taken_at_each_call_keeps_its_packed_copy_while_the_sliced_weight_lives():
    """A CMLM head's rows are sliced anew at every call: the slice dies, the copy stays with the weight."""
    weight, _ = _weights()
    x = torch.randn(2, 32)
    with torch.inference_mode():
        out = linear(x, weight[8:40])
        key = (packed.ONEDNN, weight[8:40].data_ptr(), (32, 32), (32, 1))
        copy = packed._packed[key][2]
        linear(x, weight[8:40])
    assert packed._packed[key][2] is copy
    assert torch.allclose(out, F.linear(x, weight[8:40]), atol=1e-5)
    del weight
    gc.collect()
    assert key not in packed._packed


@needs_onednn
def test_a_runner_counts_the_weights_packed_for_it_only_where_its_forward_packs():
    """The actor's ready line reads this: the lean forward's model in float32, not another kind of model
    (its own `nn.Linear`s run `F.linear`), nor float64."""
    from test_llama_forward import SMALL

    llama = LlamaForCausalLM(LlamaConfig(**SMALL)).eval()
    size = sum(p.numel() * p.element_size() for p in llama.parameters())
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=97, n_embd=32, n_layer=2, n_head=4, n_positions=64)).eval()
    assert ModelRunner(llama).packed_weight_bytes == size
    assert ModelRunner(gpt2).packed_weight_bytes == 0
    assert ModelRunner(llama.double()).packed_weight_bytes == 0


@needs_onednn
def test_warm_up_runs_one_weight_of_each_shape_at_each_row_count_and_nothing_where_packing_is_off(monkeypatch):
    """oneDNN builds a kernel per shape and row count: one weight of each shape runs at each count asked for."""
    calls = []
    real = packed._packed_copy
    monkeypatch.setattr(packed, "_packed_copy", lambda w, k: calls.append((tuple(w.shape), k)) or real(w, k))
    monkeypatch.setattr(packed, "_mkl_ok", packed._mkl_ok)  # the check's verdict does not outlive the test
    square, wide, another_square = torch.randn(8, 8), torch.randn(24, 8), torch.randn(8, 8)
    packed.warm_up([square, wide, another_square], rows=[3, 1, 3])
    onednn = [shape for shape, kernel in calls if kernel == packed.ONEDNN]
    assert sorted(onednn) == [(8, 8), (8, 8), (24, 8), (24, 8)]  # two shapes x row counts 1 and 3
    if packed.MKL in packed.kernels():  # MKL's pack checked once per shape, over every row count
        assert sorted(shape for shape, kernel in calls if kernel == packed.MKL) == [(8, 8), (24, 8)]
    calls.clear()
    packed.warm_up([square.double()], rows=[1, 2])  # float64 is F.linear: nothing to build
    packed.set_packing(False)
    packed.warm_up([square], rows=[1, 2])
    assert calls == []


@needs_onednn
def test_a_runner_warms_its_lean_forwards_weights_at_the_row_counts_of_its_batch_size(monkeypatch):
    from test_llama_forward import SMALL

    from strategies.runtime.kernel_timing import WARM_WIDTHS, decode_row_counts

    assert WARM_WIDTHS == 17  # EAGLE's 16 nodes and the pending token, the widest default draft
    assert decode_row_counts(1) == list(range(1, 18))
    assert decode_row_counts(4) == sorted(set(range(1, 18)) | {4 * w for w in range(1, 18)})
    warmed = []
    monkeypatch.setattr(packed, "warm_up", lambda weights, rows: warmed.append((list(weights), list(rows))))
    llama = LlamaForCausalLM(LlamaConfig(**SMALL)).eval()
    prepacked = []
    monkeypatch.setattr(packed, "prepack", lambda weights: prepacked.append((list(weights), packed.choice())))
    ModelRunner(llama).warm_up(4)
    ((weights, rows),) = warmed
    # Last, under the choice made: the copies the first steps would make (before it, each timed kernel's).
    assert prepacked[-1] == (weights, packed.choice()) and packed.choice()
    assert rows == decode_row_counts(4)
    assert len(weights) == 1 + 4 * SMALL["num_hidden_layers"] and weights[0] is llama.lm_head.weight
    ModelRunner(llama.double()).warm_up(4)  # float64 does not pack: nothing to warm
    assert len(warmed) == 1


@needs_onednn
def test_prepack_makes_the_copies_of_the_packing_kernels_the_choice_runs_and_no_other(monkeypatch):
    """A weight's first matmul at a row count whose kernel packs would pack it there, on the step that
    meets it (a drafter's first, which the controller explores with): `prepack` makes them ahead."""
    weight, _ = _weights()
    made = []
    real = packed._packed_copy
    monkeypatch.setattr(packed, "_packed_copy", lambda w, k: made.append(k) or real(w, k))
    packed.pack_by_rows({1: packed.F_LINEAR})  # nothing packs: nothing to make
    packed.prepack([weight])
    assert made == []
    packing = packed.MKL if packed.MKL in packed.kernels() else packed.ONEDNN
    packed.pack_by_rows({1: packed.F_LINEAR, 8: packing})
    packed.prepack([weight, weight.double()])  # float64 never packs
    assert made == [packing]
    with torch.inference_mode():
        linear(torch.randn(9, 32), weight)  # the copy is there: looked up, not made again
    assert made == [packing, packing]
    assert len([key for key in packed._packed if key[0] == packing]) == 1


def test_a_row_count_takes_the_kernel_of_the_nearest_row_count_timed():
    f, dnn, mkl = packed.F_LINEAR, packed.ONEDNN, packed.MKL
    choices = ((1, f), (16, mkl), (256, dnn))
    assert [packed.kernel_nearest(choices, rows) for rows in (0, 1, 3, 5, 15, 40, 100, 4000)] == [
        f,
        f,
        f,  # 3 is nearer 1 than 16 by ratio
        mkl,
        mkl,
        mkl,
        dnn,
        dnn,
    ]
    assert packed.kernel_nearest(choices, 64) == dnn  # as near 16 as 256: the larger's
    assert packed.kernel_nearest((), 7) == dnn  # nothing timed: oneDNN, as before any choice


@needs_onednn
def test_a_linear_runs_the_kernel_its_row_count_was_given(monkeypatch):
    weight, bias = _weights()
    packs = []
    real = packed._packed_copy
    monkeypatch.setattr(packed, "_packed_copy", lambda w, k: packs.append(k) or real(w, k))
    packed.pack_by_rows({1: packed.F_LINEAR, 8: packed.ONEDNN})
    with torch.inference_mode():
        few = torch.randn(1, 2, 32)  # 2 rows: F.linear's, bit for bit
        assert torch.equal(linear(few, weight, bias), F.linear(few, weight, bias))
        assert packs == []
        many = torch.randn(2, 5, 32)  # 10 rows: packed
        assert torch.allclose(linear(many, weight, bias), F.linear(many, weight, bias), atol=1e-5)
        assert packs == [packed.ONEDNN]
        packed.pack_by_rows({})  # a new choice replaces the rows already looked up
        linear(few, weight, bias)
        assert packs == [packed.ONEDNN, packed.ONEDNN]
    assert packed._packed  # a row count still packs: the copies stay
    packed.pack_by_rows({1: packed.F_LINEAR, 8: packed.F_LINEAR})  # none does: the copies go, no memory counted
    assert not packed.packs_anywhere() and not packed._packed
    from test_llama_forward import SMALL

    assert ModelRunner(LlamaForCausalLM(LlamaConfig(**SMALL)).eval()).packed_weight_bytes == 0


needs_mkl = pytest.mark.skipif(packed.MKL not in packed.kernels(), reason="torch is built without MKL's packed sgemm")


@needs_onednn
@pytest.mark.parametrize("kernel", [pytest.param(packed.MKL, marks=needs_mkl), packed.TRANSPOSED])
@pytest.mark.parametrize("rows", [1, 2, 3, 8, 17, 40])
@pytest.mark.parametrize("with_bias", [True, False])
def test_a_packing_kernel_computes_f_linear_at_any_row_count_from_one_copy(kernel, rows, with_bias):
    """MKL's packed sgemm, and F.linear's sgemm over the weight transposed [K, N]."""
    weight, bias = _weights()
    bias = bias if with_bias else None
    packed.pack_by_rows({1: kernel})
    x = torch.randn(rows, 2, 32)
    with torch.inference_mode():
        out = linear(x, weight, bias)
    assert out.shape == (rows, 2, 48)
    assert torch.allclose(out, F.linear(x, weight, bias), atol=1e-5)
    assert list(packed._packed) == [(kernel, weight.data_ptr(), (48, 32), (32, 1))]  # one copy, any row count
    if kernel == packed.TRANSPOSED:
        copy = next(iter(packed._packed.values()))[2]
        assert copy.shape == (32, 48) and copy.is_contiguous()
    packed.pack_by_rows({1: packed.ONEDNN})
    assert not packed._packed  # no row count runs the kernel now: its copy goes


@needs_onednn
@needs_mkl
def test_mkl_is_never_chosen_where_its_one_copy_does_not_compute_f_linear(monkeypatch):
    weight, _ = _weights()
    monkeypatch.setattr(packed, "_mkl_ok", True)
    assert packed.mkl_agrees(weight, [1, 5, 16])
    real = torch.ops.mkl._mkl_linear

    def wrong_beyond_four_rows(x, copy, w, bias, rows):  # as a pack made for other dimensions might be
        return real(x, copy, w, bias, rows) + (rows > 4)

    monkeypatch.setattr(torch.ops.mkl, "_mkl_linear", wrong_beyond_four_rows)
    assert packed.mkl_agrees(weight, [1, 4])
    assert not packed.mkl_agrees(weight, [1, 5])
    packed.warm_up([weight], rows=[1, 8])  # a runner's warm-up finds it: MKL leaves the kernels timed
    assert packed.kernels() == (packed.F_LINEAR, packed.ONEDNN, packed.TRANSPOSED)


def test_a_runner_gives_each_row_count_the_kernel_whose_whole_forwards_ran_fastest(monkeypatch):
    """Timed as whole forwards with each kernel (scripted here: F.linear fastest below 4 rows, MKL's from
    4 to 32, oneDNN's beyond, the transposed copy's never; one noisy forward of a slower kernel does not
    make it win), over the batch and over one row, with a prefill-like width at one row; none wider over
    the batch than `PACKING_MAX_ROWS` rows."""
    from test_llama_forward import SMALL

    from strategies.runtime.kernel_timing import PACKING_MAX_ROWS, PACKING_ROUNDS, PACKING_WIDTHS

    f, dnn, mkl = packed.F_LINEAR, packed.ONEDNN, packed.MKL
    monkeypatch.setattr(packed, "_mkl_ok", True)
    llama = LlamaForCausalLM(LlamaConfig(**{**SMALL, "max_position_embeddings": 128})).eval()
    runner = ModelRunner(llama)
    calls = []

    def fastest(rows):
        return f if rows < 4 else mkl if rows <= 32 else dnn

    def scripted(contexts, widths, kernels, rounds):
        calls.append((len(contexts), tuple(widths), tuple(kernels), rounds))
        rows = len(contexts)
        # The fastest kernel's forwards take 1.0 s; another's 2.0, but for one lucky 1.5.
        return {(w, k): [1.0] * rounds if fastest(rows * w) == k else [2.0, 1.5] for w in widths for k in kernels}

    monkeypatch.setattr(runner, "kernel_seconds", scripted)
    choice = runner.pack_where_faster(4)
    timed_rows = {w for w in (*PACKING_WIDTHS, 64)} | {4 * w for w in PACKING_WIDTHS}
    assert choice == {rows: fastest(rows) for rows in timed_rows}
    assert calls == [
        (1, (*PACKING_WIDTHS, 64), packed.kernels(), PACKING_ROUNDS),
        (4, PACKING_WIDTHS, packed.kernels(), PACKING_ROUNDS),
    ]
    assert mkl in packed.kernels() and packed.TRANSPOSED in packed.kernels()
    calls.clear()
    monkeypatch.setattr(packed, "_mkl_ok", False)  # not built in, or found to differ: MKL is not timed
    wide = runner.pack_where_faster(PACKING_MAX_ROWS)  # only its one-token forward fits over the batch
    assert {kernel for _, _, kernels, _ in calls for kernel in kernels} == {f, dnn, packed.TRANSPOSED}
    assert [(rows, widths) for rows, widths, _, _ in calls] == [(1, (*PACKING_WIDTHS, 64)), (PACKING_MAX_ROWS, (1,))]
    assert PACKING_MAX_ROWS in wide and 4 * PACKING_MAX_ROWS not in wide and mkl not in wide.values()
    calls.clear()  # a plain step's kernel alone (`model.dtype=auto` timing a step in each dtype)
    monkeypatch.setattr(packed, "_mkl_ok", True)
    assert runner.pack_where_faster(4, plain_steps_only=True) == {4: fastest(4)}
    assert [(rows, widths) for rows, widths, _, _ in calls] == [(4, (1,))]


@needs_onednn
def test_kernels_timed_take_turns_with_one_kernels_copies_at_a_time(monkeypatch):
    """The machine drifts: a kernel timed after another in a block of its own would carry the drift. A
    kernel's first turn runs each width once untimed; its copies exist during its turns only (four
    kernels' copies of a large model's weights at once would not fit where one does), made before its
    forwards; the choice and the cache are as they were after."""
    from test_llama_forward import SMALL

    runner = ModelRunner(LlamaForCausalLM(LlamaConfig(**SMALL)).eval())
    packed.pack_by_rows({1: packed.F_LINEAR, 8: packed.ONEDNN})
    before = packed.choice()
    order = []
    real = runner._timed_forward

    def spy(kv, ids, positions, valid):
        kernel = packed.kernel_nearest(packed._by_rows, 1)
        copies = {key[0] for key in packed._packed}
        order.append((ids.shape[1], kernel, kv.num_slots, copies))
        return real(kv, ids, positions, valid)

    monkeypatch.setattr(runner, "_timed_forward", spy)
    kernels = (packed.F_LINEAR, packed.ONEDNN, packed.TRANSPOSED)
    seconds = runner.kernel_seconds([[1, 2, 3], [4, 5, 6]], [1, 3], kernels, rounds=2)
    assert sorted(seconds) == sorted((w, k) for w in (1, 3) for k in kernels)
    assert all(len(times) == 2 and min(times) > 0 for times in seconds.values())
    first = [(w, k) for k in kernels for w in (1, 3) for _ in range(2)]  # untimed, then timed
    assert [(width, kernel) for width, kernel, _, _ in order] == first + [(w, k) for k in kernels for w in (1, 3)]
    assert {slots for _, _, slots, _ in order} == {3}  # every forward over the prefilled cache alone
    assert all(copies == ({k} - {packed.F_LINEAR}) for _, k, _, copies in order)
    assert packed.choice() == before


@needs_onednn
def test_kernels_are_timed_for_one_round_only_once_the_timing_has_taken_its_budget(monkeypatch):
    """A model whose first round of forwards takes longer than `PACKING_BUDGET_S` is timed once per
    width and kernel; one within it, every round asked for."""
    from test_llama_forward import SMALL

    from strategies.runtime import kernel_timing

    runner = ModelRunner(LlamaForCausalLM(LlamaConfig(**SMALL)).eval())
    kernels = (packed.F_LINEAR, packed.ONEDNN)
    rounds = runner.kernel_seconds([[1, 2, 3]], [1, 2], kernels, rounds=3)
    assert all(len(times) == 3 for times in rounds.values())
    monkeypatch.setattr(kernel_timing, "PACKING_BUDGET_S", 0.0)
    once = runner.kernel_seconds([[1, 2, 3]], [1, 2], kernels, rounds=3)
    assert sorted(once) == sorted(rounds) and all(len(times) == 1 for times in once.values())


@pytest.fixture(scope="module")
def cmlm_dir(tiny_model_dir, tmp_path_factory):
    """An untrained CMLM of the tiny target, saved as `train cmlm` saves one."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from jobs.train.cmlm import cmlm_from_target, cmlm_tokenizer_and_config
    from strategies.artifacts.cmlm import write_config

    out = tmp_path_factory.mktemp("cmlm")
    tokenizer, config = cmlm_tokenizer_and_config(AutoTokenizer.from_pretrained(tiny_model_dir), 4)
    cmlm_from_target(AutoModelForCausalLM.from_pretrained(tiny_model_dir), 1, len(tokenizer), seed=0).save_pretrained(
        out
    )
    tokenizer.save_pretrained(out)
    write_config(out, config)
    return out


@needs_onednn
@pytest.mark.parametrize("kind", ["draft", "cmlm"])
def test_a_drafting_model_is_packed_as_it_loads_for_the_kernels_the_choice_runs(
    kind, tiny_model_dir, tiny_draft_dir, cmlm_dir
):
    """Packed on its first draft, a draft model's (or CMLM's) weights cost that step some 25 packs: the
    step the controller explores it with. Loaded for a strategy (after the target's warm-up chose the
    kernels), its lean forward's weights are packed already; in float64 it packs nothing."""
    from workers.model_loading import load_models

    packed.pack_by_rows({1: packed.F_LINEAR, 8: packed.ONEDNN})
    cpu, folder = torch.device("cpu"), {"draft": tiny_draft_dir, "cmlm": cmlm_dir}[kind]
    model = load_models(str(tiny_model_dir), torch.float32, cpu, {kind: str(folder)}).models.get(kind)
    runner = model if kind == "draft" else model.runner
    weights = runner._lean_weights()
    assert all((packed.ONEDNN, w.data_ptr(), tuple(w.shape), w.stride()) in packed._packed for w in weights)
    before = len(packed._packed)
    load_models(str(tiny_model_dir), torch.float64, cpu, {kind: str(folder)}).models.get(kind)
    assert len(packed._packed) == before
