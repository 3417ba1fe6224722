"""The ragged slot cache: dropping rows, rolling back and compacting never change a row's logits."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from strategies.runtime.kv_cache import Provisional, RaggedKV, SlotLayer
from strategies.runtime.runner import ModelRunner

PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [12, 13], [14, 15, 16, 17]]


def _step(runner, kv, tokens):
    ids = torch.tensor(tokens)[:, None]
    return runner.forward(kv, ids, kv.next_pos[:, None], torch.ones_like(ids, dtype=torch.bool)).logits[:, -1]


def _reference(runner, prompt, extra):
    kv = runner.new_kv(1)
    runner.prefill(kv, [prompt])
    return _step(runner, kv, [extra])[0]


@pytest.mark.parametrize("forward", ["lean", "transformers"])
def test_select_rows_compact_and_rollback_keep_logits(tiny_model_dir, forward):
    """Through the lean Llama forward (on the layers) and through transformers' own (on `kv.cache`)."""
    runner = ModelRunner(AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float64))
    if forward == "transformers":
        runner._fast = None
    kv = runner.new_kv(3)
    runner.prefill(kv, PROMPTS)
    assert kv.next_pos.tolist() == [7, 2, 4] and kv.waste() > 0

    # Roll rows back after a two-token chain: row 0 keeps one token, row 1 none, row 2 both.
    chain = torch.tensor([[20, 21], [22, 23], [24, 25]])
    positions = kv.next_pos[:, None] + torch.arange(2)
    runner.forward(kv, chain, positions, torch.ones_like(chain, dtype=torch.bool))
    rejected = torch.zeros_like(kv.valid)
    rejected[0, -1] = True
    rejected[1, -2:] = True
    kv.invalidate(rejected)
    assert kv.next_pos.tolist() == [8, 2, 6]

    kv.select_rows(torch.tensor([1, 2]))  # row 0 finished
    kv.compact()
    assert kv.waste() < 0.5
    logits = _step(runner, kv, [30, 31])
    assert torch.allclose(logits[0], _reference(runner, PROMPTS[1], 30), atol=1e-12)
    assert torch.allclose(logits[1], _reference(runner, [*PROMPTS[2], 24, 25], 31), atol=1e-12)


def test_storage_grows_without_changing_contents(tiny_model_dir):
    runner = ModelRunner(AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float64))
    kv = runner.new_kv(1)
    runner.prefill(kv, [PROMPTS[0]])
    tokens = list(PROMPTS[0])
    for t in range(70):  # past the first capacity of 64 slots
        logits = _step(runner, kv, [40 + t % 50])
        tokens.append(40 + t % 50)
    full = runner.model(torch.tensor([tokens])).logits[0, -1]
    assert torch.allclose(logits[0], full, atol=1e-12)


# The bookkeeping on literal tensors, no model: a "forward" writes known numbers into every layer.

T, F = True, False


def _forward(kv: RaggedKV, codes: list[list[float]], valid: list[list[bool]] | None = None) -> None:
    """What a forward over `codes` [B, n] writes: in layer i, head h, row b's new slot j holds the key
    `codes[b][j] + 1000 i + 0.5 h` and the values (-key, 2 key); `valid` [B, n] (default: all valid)."""
    c = torch.tensor(codes, dtype=torch.float64)  # [B, n]
    for i, layer in enumerate(kv.layers):
        k = (c[:, None, :] + 1000 * i + torch.tensor([0.0, 0.5])[None, :, None])[..., None]  # [B, 2, n, 1]
        layer.update(k, torch.cat([-k, 2 * k], dim=-1))  # values [B, 2, n, 2]
    kv.append(torch.ones_like(c, dtype=torch.bool) if valid is None else torch.tensor(valid))


def _codes(kv: RaggedKV) -> list[list[float]]:
    """Every row's slot codes [B][S], after checking that every layer, head and value holds the same slots."""
    base = kv.layers[0].keys[:, 0, :, 0]  # [B, S]
    for i, layer in enumerate(kv.layers):
        assert layer.get_seq_length() == kv.num_slots
        expected = base[:, None, :] + 1000 * i + torch.tensor([0.0, 0.5])[None, :, None]  # [B, 2, S]
        pad = torch.tensor(_pad_rows(kv))  # where `extend` padded, all is zero
        expected = torch.where(pad[:, None, :], torch.zeros_like(expected), expected)
        assert torch.equal(layer.keys[..., 0], expected)
        assert torch.equal(layer.values, torch.stack([-layer.keys[..., 0], 2 * layer.keys[..., 0]], dim=-1))
    return base.tolist()


def _pad_rows(kv: RaggedKV) -> list[list[bool]]:
    return [[code == 0.0 for code in row] for row in kv.layers[0].keys[:, 0, :, 0].tolist()]


def test_a_layer_appends_in_place_and_grows_its_storage_by_doubling():
    layer = SlotLayer()
    k = torch.arange(6, dtype=torch.float64).reshape(1, 2, 3, 1)  # [B, H, 3, D]
    v = torch.arange(12, dtype=torch.float64).reshape(1, 2, 3, 2)  # values may be wider
    keys, values = layer.update(k, v)
    assert torch.equal(keys, k) and torch.equal(values, v) and layer.is_initialized
    assert layer.dtype == torch.float64 and layer.device == k.device
    assert layer._k.shape[2] == 64 and layer.get_mask_sizes(2) == (5, 0) and layer.get_max_length() == -1
    for step in range(61):  # fills the 64 slots exactly: no copy yet
        layer.update(k[:, :, :1] + step, v[:, :, :1] + step)
    assert layer._k.shape[2] == 64 and layer.get_seq_length() == 64
    layer.update(k, v)  # 67 slots: the storage doubles and keeps what it held
    assert layer._k.shape[2] == 128 and layer.length == 67
    assert torch.equal(layer.keys[:, :, :3], k) and torch.equal(layer.values[:, :, :3], v)
    assert torch.equal(layer.keys[:, :, 3:64, 0], (k[:, :, 0, 0, None] + torch.arange(61)).double())
    assert torch.equal(layer.values[:, :, 64:], v) and torch.equal(layer.keys[:, :, 64:], k)
    big = torch.zeros(1, 2, 300, 1, dtype=torch.float64)
    layer.update(big, torch.zeros(1, 2, 300, 2, dtype=torch.float64))  # more than double: exactly enough
    assert layer._k.shape[2] == 367 and torch.equal(layer.keys[:, :, :3], k)


def test_rollback_waste_and_compaction_on_literal_slots():
    kv = RaggedKV(num_layers=2, batch_size=2, device=torch.device("cpu"))
    assert kv.waste() == 0.0 and kv.num_slots == 0 and kv.next_pos.dtype == torch.long
    _forward(kv, [[1, 2, 3], [4, 5, 6]], valid=[[T, T, T], [F, T, T]])  # row 1 left-padded
    _forward(kv, [[7, 8], [9, 10]])
    assert kv.next_pos.tolist() == [5, 4] and kv.num_slots == 5 and kv.waste() == pytest.approx(0.1)
    # A slot already invalid does not move a row back twice.
    kv.invalidate(torch.tensor([[F, F, F, F, T], [T, F, F, T, F]]))
    assert kv.valid.tolist() == [[T, T, T, T, F], [F, T, T, F, T]] and kv.next_pos.tolist() == [4, 3]
    kv.invalidate(torch.tensor([[F, F, F, T, F], [F, F, T, F, F]]))
    assert kv.waste() == 0.5
    kv.compact_if_wasteful()  # at the threshold: nothing moves
    assert kv.num_slots == 5 and _codes(kv) == [[1, 2, 3, 7, 8], [4, 5, 6, 9, 10]]
    kv.invalidate(torch.tensor([[F, T, F, F, F], [F, F, F, F, F]]))
    kv.compact_if_wasteful()  # past it: each row's valid slots move left, in order
    assert _codes(kv) == [[1, 3], [5, 10]] and kv.valid.tolist() == [[T, T], [T, T]]
    assert kv.next_pos.tolist() == [2, 2] and kv.waste() == 0.0


def test_keeping_paths_moves_each_rows_kept_slots_to_the_front_of_the_block_and_cuts_it():
    kv = RaggedKV(num_layers=2, batch_size=2, device=torch.device("cpu"))
    _forward(kv, [[1, 2], [3, 4]])
    _forward(kv, [[10, 11, 12, 13], [20, 21, 22, 23]], valid=[[T, T, T, T], [T, T, F, F]])  # row 1: 1 node
    kv.keep_paths(2, [[0, 2, 3], [0]])  # row 0 kept a tree path through nodes 2 and 3; row 1 its pending token
    assert kv.num_slots == 5 and kv.next_pos.tolist() == [5, 3]
    assert kv.valid.tolist() == [[T, T, T, T, T], [T, T, T, F, F]]
    assert [row[:n] for row, n in zip(_codes(kv), (5, 3), strict=True)] == [[1, 2, 10, 12, 13], [3, 4, 20]]
    # Chains keep the block's first slots: a cut, and rows that kept all leave no dead slot.
    _forward(kv, [[30, 31, 32], [40, 41, 42]])
    kv.keep_paths(5, [[0, 1], [0, 1, 2]])
    assert kv.num_slots == 8 and kv.next_pos.tolist() == [7, 6]
    assert kv.valid.tolist() == [[T] * 7 + [F], [T, T, T, F, F, T, T, T]]
    assert [row[5:] for row in _codes(kv)] == [[30, 31, 32], [40, 41, 42]]
    for layer in kv.layers:
        assert layer.get_seq_length() == 8


def test_compaction_keeps_the_longest_row_and_pads_the_others():
    kv = RaggedKV(num_layers=2, batch_size=2, device=torch.device("cpu"))
    _forward(kv, [[1, 2, 3, 4], [5, 6, 7, 8]], valid=[[F, T, F, T], [T, T, F, T]])
    kv.compact()
    assert kv.valid.tolist() == [[T, T, F], [T, T, T]] and kv.next_pos.tolist() == [2, 3]
    assert _codes(kv)[1] == [5, 6, 8] and _codes(kv)[0][:2] == [2, 4]
    empty = RaggedKV(num_layers=1, batch_size=2, device=torch.device("cpu"))
    empty.compact()
    assert empty.valid.shape == (2, 0)
    finished = RaggedKV(num_layers=1, batch_size=0, device=torch.device("cpu"))  # every row done
    finished.compact()
    assert finished.valid.shape == (0, 0) and finished.waste() == 0.0


def test_selecting_rows_trims_the_slots_no_kept_row_uses():
    kv = RaggedKV(num_layers=2, batch_size=3, device=torch.device("cpu"))
    _forward(kv, [[1, 2, 3], [4, 5, 6], [7, 8, 9]], valid=[[F, F, T], [F, T, T], [T, T, T]])
    kv.select_rows(torch.tensor([1, 0]))
    assert _codes(kv) == [[5, 6], [2, 3]] and kv.valid.tolist() == [[T, T], [F, T]]
    assert kv.next_pos.tolist() == [2, 1]
    kv.select_rows(torch.tensor([1]))
    assert _codes(kv) == [[3]] and kv.next_pos.tolist() == [1]
    kv.invalidate(torch.tensor([[T]]))
    kv.select_rows(torch.tensor([0]))  # a row with nothing valid keeps no slot
    assert kv.num_slots == 0 and kv.layers[0].keys.shape == (1, 2, 0, 1) and kv.next_pos.tolist() == [0]
    full = RaggedKV(num_layers=1, batch_size=2, device=torch.device("cpu"))
    _forward(full, [[1, 2], [3, 4]], valid=[[T, T], [F, T]])
    full.select_rows(torch.tensor([1, 0]))  # the first slot is still used: nothing trimmed
    assert _codes(full) == [[3, 4], [1, 2]] and full.valid.tolist() == [[F, T], [T, T]]


def test_extend_pads_the_shorter_side_on_the_left():
    cpu = torch.device("cpu")
    kv = RaggedKV(num_layers=2, batch_size=2, device=cpu)
    _forward(kv, [[1, 2, 3], [4, 5, 6]], valid=[[T, T, T], [F, T, T]])
    joining = RaggedKV(num_layers=2, batch_size=1, device=cpu)
    _forward(joining, [[9]])
    kv.extend(joining)
    assert _codes(kv) == [[1, 2, 3], [4, 5, 6], [0, 0, 9]]
    assert kv.valid.tolist() == [[T, T, T], [F, T, T], [F, F, T]] and kv.next_pos.tolist() == [3, 2, 1]

    short = RaggedKV(num_layers=2, batch_size=1, device=cpu)
    _forward(short, [[7]])
    short.extend(kv)  # now this side is the shorter one
    assert _codes(short) == [[0, 0, 7], [1, 2, 3], [4, 5, 6], [0, 0, 9]]
    assert short.valid.tolist()[0] == [F, F, T] and short.next_pos.tolist() == [1, 3, 2, 1]

    fresh = RaggedKV(num_layers=2, batch_size=3, device=cpu)  # no forward yet: three rows of empty slots
    kv.extend(fresh)
    assert _codes(kv)[3:] == [[0, 0, 0]] * 3 and kv.valid.tolist()[3:] == [[F, F, F]] * 3
    assert kv.next_pos.tolist() == [3, 2, 1, 0, 0, 0]
    newcomer = RaggedKV(num_layers=2, batch_size=2, device=cpu)
    newcomer.extend(joining)  # and the other way round
    assert _codes(newcomer) == [[0], [0], [9]] and newcomer.valid.tolist() == [[F], [F], [T]]
    nothing = RaggedKV(num_layers=2, batch_size=1, device=cpu)
    nothing.extend(RaggedKV(num_layers=2, batch_size=2, device=cpu))
    assert nothing.valid.shape == (3, 0) and nothing.layers[0].length == 0
    with pytest.raises(ValueError):  # caches of different models never join
        kv.extend(RaggedKV(num_layers=3, batch_size=1, device=cpu))


def test_truncate_drops_the_slots_of_a_read_only_forward():
    kv = RaggedKV(num_layers=2, batch_size=2, device=torch.device("cpu"))
    _forward(kv, [[1, 2], [3, 4]], valid=[[T, T], [F, T]])
    _forward(kv, [[5, 6, 7], [8, 9, 10]], valid=[[T, T, F], [T, T, T]])
    kv.truncate(3)
    assert _codes(kv) == [[1, 2, 5], [3, 4, 8]] and kv.next_pos.tolist() == [3, 2]
    assert kv.valid.tolist() == [[T, T, T], [F, T, T]]


def _write_provisional(kv: RaggedKV, layers: int, ids: list[list[int]]) -> Provisional:
    """A draft through the first `layers` layers: columns past the slots, recorded as provisional."""
    t = torch.tensor(ids)  # [B, m]
    for layer in kv.layers[:layers]:
        k = t[:, None, :, None].double().expand(-1, 2, -1, -1)  # [B, 2, m, 1]
        layer.update(k, torch.cat([-k, 2 * k], dim=-1))
    columns = Provisional(layers, t, t + 100, t > 0, t[..., None].double().expand(-1, -1, 4))
    kv.add_provisional(columns)
    return columns


def test_provisional_columns_are_kept_per_count_and_dropped_by_every_other_change():
    kv = RaggedKV(num_layers=3, batch_size=2, device=torch.device("cpu"))
    _forward(kv, [[1, 2], [3, 4]])
    kv.keep_provisional(1)  # nothing provisional: nothing to keep
    assert kv.provisional is None and [layer.length for layer in kv.layers] == [2, 2, 2]
    first = _write_provisional(kv, 2, [[21], [0]])
    assert kv.provisional is first and first.count == 1
    _write_provisional(kv, 2, [[22, 23], [24, 25]])
    prov = kv.provisional
    assert prov.layers == 2 and prov.count == 3 and prov.ids.tolist() == [[21, 22, 23], [0, 24, 25]]
    assert prov.positions.tolist() == [[121, 122, 123], [100, 124, 125]]
    assert prov.valid.tolist() == [[T, T, T], [F, T, T]] and prov.hidden[:, :, 0].tolist() == prov.ids.tolist()
    assert [layer.length for layer in kv.layers] == [5, 5, 2]
    kv.keep_provisional(2)
    assert [layer.length for layer in kv.layers] == [4, 4, 2] and kv.provisional.ids.tolist() == [[21, 22], [0, 24]]
    assert kv.provisional.positions.tolist() == [[121, 122], [100, 124]] and kv.provisional.layers == 2
    assert kv.provisional.valid.tolist() == [[T, T], [F, T]] and kv.provisional.hidden.shape == (2, 2, 4)
    assert kv.layers[0].keys[:, 0, 2:, 0].tolist() == [[21, 22], [0, 24]]
    kv.drop_provisional()
    assert kv.provisional is None and [layer.length for layer in kv.layers] == [2, 2, 2]

    for change in (
        lambda: kv.truncate(2),
        lambda: kv.select_rows(torch.tensor([0, 1])),
        lambda: kv.compact(),
        lambda: kv.extend(RaggedKV(num_layers=3, batch_size=1, device=torch.device("cpu"))),
    ):
        _write_provisional(kv, 2, [[31, 32]] * len(kv.next_pos))
        change()
        assert kv.provisional is None and {layer.length for layer in kv.layers} == {kv.num_slots}
        assert _codes(kv)[:2] == [[1, 2], [3, 4]]
    joining = RaggedKV(num_layers=3, batch_size=1, device=torch.device("cpu"))
    _forward(joining, [[9]])
    _write_provisional(joining, 1, [[41]])
    kv.extend(joining)  # the joining side's provisional columns go too
    assert joining.provisional is None and _codes(kv)[-1] == [0, 9]


def test_finished_rows_leave_and_new_rows_join_in_the_storage_held():
    """A continuous batch: rows finish one by one and others join in their places. Neither copies the
    rows that stay into a new storage, and the next forward appends without growing it."""
    cpu = torch.device("cpu")
    kv = RaggedKV(num_layers=2, batch_size=4, device=cpu)
    _forward(kv, [[1, 2, 3], [4, 5, 6], [7, 8, 9], [10, 11, 12]])
    storage = [(layer._k.data_ptr(), layer._v.data_ptr()) for layer in kv.layers]
    kv.layers[0]._k[0, 0, 0, 0] = -1.0  # a row in place is not copied: a mark there stays
    kv.select_rows(torch.tensor([0, 2, 3]))  # row 1 finished: rows 2 and 3 move up a place each
    assert kv.layers[0]._k[0, 0, 0, 0] == -1.0
    kv.layers[0]._k[0, 0, 0, 0] = 1.0
    assert _codes(kv) == [[1, 2, 3], [7, 8, 9], [10, 11, 12]] and kv.next_pos.tolist() == [3, 3, 3]
    joining = RaggedKV(num_layers=2, batch_size=1, device=cpu)
    _forward(joining, [[20, 21]])
    kv.extend(joining)  # into the place row 3 left, after a zero pad: that place held row 3's slots
    assert _codes(kv) == [[1, 2, 3], [7, 8, 9], [10, 11, 12], [0, 20, 21]]
    assert kv.valid.tolist()[3] == [F, T, T] and kv.next_pos.tolist() == [3, 3, 3, 2]
    _forward(kv, [[30], [31], [32], [33]])
    assert [row[-1] for row in _codes(kv)] == [30, 31, 32, 33]
    assert [(layer._k.data_ptr(), layer._v.data_ptr()) for layer in kv.layers] == storage
    kv.select_rows(torch.tensor([3, 0]))  # out of order: gathered, still into the same storage
    assert _codes(kv) == [[0, 20, 21, 33], [1, 2, 3, 30]]
    assert [(layer._k.data_ptr(), layer._v.data_ptr()) for layer in kv.layers] == storage


def test_a_wider_joining_side_pads_the_rows_there_and_more_rows_than_held_get_a_new_storage():
    cpu = torch.device("cpu")
    kv = RaggedKV(num_layers=2, batch_size=1, device=cpu)
    _forward(kv, [[1]])
    wide = RaggedKV(num_layers=2, batch_size=1, device=cpu)
    _forward(wide, [[5, 6, 7]])
    kv.extend(wide)  # this side is the narrower: its row moves right behind two zero slots
    assert _codes(kv) == [[0, 0, 1], [5, 6, 7]] and kv.next_pos.tolist() == [1, 3]
    kv.select_rows(torch.tensor([1, 1, 0]))  # a row's lanes side by side: more rows than the storage held
    assert _codes(kv) == [[5, 6, 7], [5, 6, 7], [0, 0, 1]] and kv.layers[0]._k.shape[0] == 3
