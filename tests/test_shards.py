"""Input listing, checks before any work, and unit planning — on literal Parquet files."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.errors import JobError
from pipeline.shards import check_columns, check_ids, list_shards, plan_units
from workers.common.contract import part_name, unit_id


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
        (unit_id(0, 0), (0, 1), 0, 6),
        (unit_id(0, 2), (2, 3), 6, 4),
        (unit_id(1, 0), (0,), 0, 1),
    ]
    assert plan_units(list_shards(str(tmp_path), {}), rows_per_unit=6) == units


def test_names_starting_with_underscore_or_dot_are_not_data(tmp_path):
    root = tmp_path / "_chosen" / "in"  # the root itself may be named so: the user pointed at it
    for name in ["a.parquet", "sub/b.parquet", ".hidden.parquet", "_tmp.parquet", "_temporary/0/c.parquet"]:
        _write(root / name, ["x"])
    for name in [".spark-staging/d.parquet", "sub/_SUCCESS", "sub/.e.parquet.crc"]:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(b"not parquet")
    assert [s.name for s in list_shards(str(root), {})] == ["a.parquet", "sub/b.parquet"]
    assert [s.name for s in list_shards(str(root / "*" / "*.parquet"), {})] == ["sub/b.parquet"]
    assert [s.name for s in list_shards(str(root / "_tmp.parquet"), {})] == ["_tmp.parquet"]  # named explicitly


def test_the_output_folder_is_never_input(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _write(tmp_path / "data" / "a.parquet", ["x"])
    _write(tmp_path / "data" / "out" / part_name(unit_id(0, 0)), ["x"])  # the job's own output
    for url, output in [("data", "data/out"), ("data/", "data/out/"), (str(tmp_path / "data"), "data/out")]:
        assert [s.name for s in list_shards(url, {}, exclude=output)] == ["a.parquet"]
    assert [s.name for s in list_shards("data/**/*.parquet", {}, exclude="data/out")] == ["a.parquet"]
    assert len(list_shards("data", {}, exclude="s3://bucket/data/out")) == 2  # another filesystem
    for output in ["data", str(tmp_path)]:
        with pytest.raises(JobError, match=r"lies inside output\.url"):
            list_shards("data", {}, exclude=output)


def test_concurrent_footer_reads_plan_as_sequential_ones(tmp_path):
    for n in range(40):
        _write(
            tmp_path / f"s{n:02d}.parquet",
            [str(i) for i in range(n + 1)],
            row_group_size=1 + n % 4,
            id=list(range(100 * n, 100 * n + n + 1)),
        )
    # A footer larger than the first ranged read: many row groups of many columns.
    wide = {f"c{i}": list(range(300)) for i in range(20)}
    _write(tmp_path / "wide.parquet", [str(i) for i in range(300)], row_group_size=1, id=range(10_000, 10_300), **wide)
    assert pq.ParquetFile(tmp_path / "wide.parquet").metadata.serialized_size > 64 * 1024
    sequential = list_shards(str(tmp_path), {}, threads=1)
    concurrent = list_shards(str(tmp_path), {}, threads=16)
    assert concurrent == sequential and len(sequential) == 41
    assert sequential[-1].row_group_rows == (1,) * 300
    assert plan_units(concurrent, 5) == plan_units(sequential, 5)
    check_ids(concurrent, "id", {}, threads=16)
