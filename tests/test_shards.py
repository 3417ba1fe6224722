"""Input listing, checks before any work, and unit planning — on literal Parquet files."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.errors import JobError
from pipeline.shards import check_columns, check_ids, list_shards, plan_units


def _write(path, prompts, row_group_size=None, **extra):
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"prompt": prompts, **extra}), path, row_group_size=row_group_size)


def test_listing_a_folder_a_glob_and_a_file(tmp_path):
    _write(tmp_path / "in" / "b.parquet", ["x"])
    _write(tmp_path / "in" / "sub" / "a.parquet", ["y", "z"])
    (tmp_path / "in" / "_SUCCESS").write_text("")
    shards = list_shards(str(tmp_path / "in"), {})
    assert [s.name for s in shards] == ["b.parquet", "sub/a.parquet"]
    assert [s.num_rows for s in shards] == [1, 2]
    assert [s.name for s in list_shards(str(tmp_path / "in" / "*.parquet"), {})] == ["b.parquet"]
    assert [s.name for s in list_shards(str(tmp_path / "in" / "b.parquet"), {})] == ["b.parquet"]
    with pytest.raises(JobError, match="does not exist"):
        list_shards(str(tmp_path / "nope"), {})


def test_unreadable_footer_names_the_file(tmp_path):
    (tmp_path / "bad.parquet").write_bytes(b"not parquet at all")
    with pytest.raises(JobError, match=r"bad\.parquet"):
        list_shards(str(tmp_path), {})


def test_column_checks(tmp_path):
    _write(tmp_path / "a.parquet", ["x"], id=[1])
    _write(tmp_path / "b.parquet", ["x"], id=["1"])
    shards = list_shards(str(tmp_path), {})
    with pytest.raises(JobError, match=r"schema of .*b\.parquet differs"):
        check_columns(shards, "prompt", None, [])
    with pytest.raises(JobError, match=r"input\.prompt_column: column 'text' is not in"):
        check_columns(shards[:1], "text", None, [])
    with pytest.raises(JobError, match="clash with output columns"):
        _write(tmp_path / "c" / "c.parquet", ["x"], row_id=["1"])
        check_columns(list_shards(str(tmp_path / "c"), {}), "prompt", None, ["row_id"])


def test_duplicate_and_null_ids_name_the_rows(tmp_path):
    _write(tmp_path / "a.parquet", ["x", "y"], id=["k1", "k2"])
    _write(tmp_path / "b.parquet", ["z", "w"], id=["k3", "k1"])
    with pytest.raises(JobError, match=r"'k1' at .*a\.parquet row 0, .*b\.parquet row 1"):
        check_ids(list_shards(str(tmp_path), {}), "id", {})
    _write(tmp_path / "b.parquet", ["z", "w"], id=["k3", None])
    with pytest.raises(JobError, match=r"null in .*b\.parquet row 1"):
        check_ids(list_shards(str(tmp_path), {}), "id", {})


def test_units_are_whole_row_groups(tmp_path):
    _write(tmp_path / "big.parquet", [str(i) for i in range(10)], row_group_size=3)  # groups of 3,3,3,1
    _write(tmp_path / "small.parquet", ["a"])
    units = plan_units(list_shards(str(tmp_path), {}), rows_per_unit=6)
    assert [(u.unit_id, u.row_groups, u.first_row, u.num_rows) for u in units] == [
        ("00000-00000", (0, 1), 0, 6),
        ("00000-00002", (2, 3), 6, 4),
        ("00001-00000", (0,), 0, 1),
    ]
    assert plan_units(list_shards(str(tmp_path), {}), rows_per_unit=6) == units
