"""The output contract's formats, pinned once: every other test builds them with `workers.common.contract`."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from workers.common.contract import (
    OUTPUT_SCHEMA,
    derived_row_id,
    output_schema,
    parse_unit_id,
    part_name,
    row_ids_of_id_column,
    unit_id,
)


def test_unit_ids_are_built_and_parsed_in_one_format():
    assert unit_id(3, 12) == "00003-00012"
    assert part_name(unit_id(3, 12)) == "part-00003-00012.parquet"
    assert parse_unit_id(unit_id(3, 12)) == (3, 12)
    assert sorted([unit_id(10, 0), unit_id(2, 7), unit_id(2, 0)]) == [unit_id(2, 0), unit_id(2, 7), unit_id(10, 0)]
    for wrong in ("3-", "part-00003-00012.parquet", "00003_00012"):
        with pytest.raises(ValueError, match="is not a unit id"):
            parse_unit_id(wrong)


def test_row_ids_are_the_id_columns_text_or_the_shard_path_and_row_index():
    assert derived_row_id("sub/a.parquet", 7) == "sub/a.parquet#7"
    assert row_ids_of_id_column(pa.chunked_array([[7, 11]])).to_pylist() == ["7", "11"]
    assert row_ids_of_id_column(pa.chunked_array([["k1"]], pa.large_string())).to_pylist() == ["k1"]


def test_a_parts_schema_is_the_contract_then_the_scores_asked_for_then_the_kept_columns():
    schema = output_schema(["logprobs"], [pa.field("lang", pa.string())])
    assert schema.names == [*OUTPUT_SCHEMA.names, "logprobs", "lang"]


def test_the_design_document_names_every_output_column():
    design = (Path(__file__).parent.parent / "docs" / "design.md").read_text()
    contract = design[design.index("## Output contract") :].split("\n## ")[0]
    assert [name for name in OUTPUT_SCHEMA.names if f"`{name}`" not in contract] == []
