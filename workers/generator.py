"""The generator: one loaded model decoding work units into staged output parts.

`Generator` is a plain class so it runs in-process in tests and benchmarks; the driver wraps it as
a Ray actor. It never publishes anything: it stages one part per attempt and returns a
`UnitResult`, and the driver alone commits (docs/design.md, "Data flow of one job").
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import socket
import threading
import time
from typing import Any, NamedTuple

import pyarrow as pa
import pyarrow.parquet as pq
import torch
from transformers.utils import logging as transformers_logging

from strategies import registry
from strategies.base import FINISH_LENGTH, Decoding, GenerationParams, RowOutput, RowRequest, Strategy
from strategies.control.controller import AdaptiveController, Learned
from strategies.control.cost_model import FORWARD_SAMPLES
from strategies.runtime import linear
from strategies.runtime.heap import freeze_loaded
from strategies.runtime.runner import ModelRunner, synthetic_contexts
from strategies.runtime.sampling import SamplingParams, row_key, seeded_key
from workers.common import contract, faults
from workers.common.contract import (
    FINISH_ERROR,
    OUTPUT_SCHEMA,
    SCORE_COLUMNS,
    derived_row_id,
    row_ids_of_id_column,
)
from workers.common.controller_stats import StatsKey
from workers.common.output_formats import encode_part
from workers.common.row_settings import RowSettings, row_settings
from workers.common.spec import UnitInputError, UnitResult, WorkerSpec, WorkUnit, add_up, tally_faults
from workers.common.storage import filesystem, write_bytes
from workers.engine import DecodeEngine, Pending, SegmentRecord
from workers.json_input import ROW_ID, as_read, chat_rows, read_json_unit, response_context, row_problems
from workers.model_loading import load_models, resolve_dtype
from workers.prompt_texts import encode, unit_prompts
from workers.rows import (
    StopStrings,
    as_text,
    completion_text,
    repetition_rate,
    too_long_message,
)

# The forwards an actor times before its first batch for its controller (`timed_forwards`): new tokens
# per row, as the cost bench's grid (a draft's verify is 1 + its nodes wide: 5 to 17 by the defaults),
# over this many cached tokens per row.
TIMED_WIDTHS = (1, 2, 4, 8, 16)
TIMED_CONTEXT = 64


def device_identity(device: torch.device) -> str:
    """The device as step costs see it: the GPU's name, or the CPU threads torch decodes with."""
    if device.type == "cuda":
        return f"cuda ({torch.cuda.get_device_name(device)})"
    return f"{device.type} ({torch.get_num_threads()} threads)"


class Decoded(NamedTuple):
    columns: dict[str, list]  # output columns, the contract's and the job's extra ones
    records: list[dict]  # throughput records
    tokens_by_option: dict[str, int]  # drafting rows: tokens each option emitted


class Generator:
    """Loads the tokenizer and model once, then decodes units on request."""

    def __init__(self, spec: WorkerSpec, actor_name: str = "") -> None:
        # When the constructor began (epoch): before it, the process started and imported this module.
        self.init_began = time.time()
        self.spec = spec = as_read(spec)
        self.actor = actor_name or f"{socket.gethostname()}:{os.getpid()}"
        # Ray sets OMP_NUM_THREADS to the actor's CPU reservation; the decode speed wants the cores.
        torch.set_num_threads(spec.workers.torch_threads if spec.workers.torch_threads > 0 else os.cpu_count() or 1)
        transformers_logging.disable_progress_bar()  # one progress bar per job, the driver's
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self.dtype = resolve_dtype(spec.model.dtype, self.device)
        loaded = load_models(
            spec.model.target,
            self.dtype,
            self.device,
            spec.models,
            cache_dir=spec.model.cache_dir,
            trust_remote_code=spec.model.trust_remote_code,
            storage_options=spec.model.storage_options,
            lazy=True,  # optional models load when a strategy that uses them is first created
        )
        self.tokenizer, self.models, self.target_load_s = loaded.tokenizer, loaded.models, loaded.target_load_s
        if spec.input.messages_column and not self.tokenizer.chat_template:
            raise ValueError(
                f"input.messages_column is set but the tokenizer of {spec.model.target} has no chat template"
            )
        self.runner = self.models.target
        linear.set_packing(spec.model.pack_weights)
        if spec.model.compile:
            self.runner.compile()
        else:
            self.runner.warm_up(spec.workers.batch_size)
        self.controller = AdaptiveController() if spec.strategy.adaptive else None
        self.stats_key = StatsKey(
            spec.target_sha256, device_identity(self.device), str(self.dtype).removeprefix("torch.")
        )
        if self.controller is not None:
            if self.stats_key in spec.controller_stats:
                self.controller.warm_start(spec.controller_stats[self.stats_key])
            # After the warm start: loading an earlier job's forward times replaces those of the same keys,
            # and these are this job's own, the freshest.
            self.controller.time_forwards(spec.workers.batch_size, timed_forwards(self.runner, spec.workers.batch_size))
        # The output path's first call loads modules (pyarrow imports pandas at its first array built from
        # Python values, about 0.5 s of CPU): paid here, and not by the first unit's part while the next
        # batch decodes beside it, which the two threads' shared GIL would stall for as long.
        encode_part(pa.table({name: [] for name in OUTPUT_SCHEMA.names}, schema=OUTPUT_SCHEMA), "parquet")
        self._strategies: dict[str, Strategy] = {}
        self._strategy(spec.strategy.name)  # fail at start, not at the first unit
        g = spec.generation
        self.params = GenerationParams(
            max_new_tokens=g.max_new_tokens,
            sampling=SamplingParams(g.temperature, g.top_k, g.top_p, g.seed),
            eos_token_ids=frozenset(_eos_ids(loaded.target, self.tokenizer)),
            ignore_eos=g.ignore_eos,
            logprobs=spec.scores,
        )
        self.job_settings = RowSettings(g.max_new_tokens, g.temperature, g.top_p, tuple(g.stop), g.seed)
        self._stops: dict[tuple[str, ...], StopStrings] = {}
        self.faults = faults.plan()
        self._lock = threading.Lock()
        self._rows_done = 0
        self._generated = 0
        self.engine = DecodeEngine(
            self._open_decoding,
            spec.workers.batch_size,
            spec.workers.max_batch_tokens,
            self._before_join,
            self._row_done,
        )
        freeze_loaded()  # last: the modules, models and the strategy loaded above are never scanned again

    def _strategy(self, name: str) -> Strategy:
        """The actor's instance of a strategy (it keeps state across batches, e.g. a Lookahead trie)."""
        if name not in self._strategies:
            options = dataclasses.replace(self.spec.strategy, name=name)
            self._strategies[name] = registry.create(options, self.models, self.controller)
        return self._strategies[name]

    def ready(self, job_id: str | None = None) -> dict[str, Any]:
        """The actor's device, and its own account of its start-up for the job's phases: when its
        constructor began (epoch seconds) and how long each model it loaded so far took (the target at
        start; the optional ones when a strategy first used them, so a later call may list more).

        `job_id`: the job's id for the batch records. Actors start before the driver has planned the
        input, which the id is a hash of; the driver names it with every `ready()`."""
        if job_id is not None:
            self.spec = dataclasses.replace(self.spec, job_id=job_id)
        return {
            "actor": self.actor,
            "device": str(self.device),
            "dtype": str(self.dtype).removeprefix("torch."),
            "torch_threads": torch.get_num_threads(),
            "packed_bytes": self.runner.packed_weight_bytes,
            "init_began": self.init_began,
            "load_s": {"target": self.target_load_s, **self.models.load_s},
        }

    def controller_statistics(self) -> tuple[StatsKey, Learned] | None:
        """What the controller learned, under the key the next job's actors look it up by (None: no
        controller, or no target hash to key it by)."""
        if self.controller is None or not self.spec.target_sha256:
            return None
        return self.stats_key, self.controller.learned()

    def progress(self) -> tuple[int, int]:
        """(rows finished, tokens generated) since the actor started, including failed attempts."""
        with self._lock:
            return self._rows_done, self._generated

    def run_unit(
        self, unit: WorkUnit, attempt: int, staged_url: str, log_url: str, error_rows: dict[int, str]
    ) -> UnitResult:
        """Decode a unit and stage its part. `error_rows` (row index -> message) are not decoded: they
        become error rows (rows found to crash the actor)."""
        started = time.perf_counter()
        table = self._read_unit(unit)
        columns, records, by_option = self.decode_table(table, unit, attempt, error_rows)
        out = pa.table(columns, schema=output_schema(self.spec, table))
        data = encode_part(out, self.spec.output.format, response_context(self.spec, table))
        _write(staged_url, data, self.spec.output.storage_options)
        _write(log_url, "".join(json.dumps(r) + "\n" for r in records).encode(), self.spec.output.storage_options)
        faults.after_upload(self.faults, unit.unit_id, attempt)
        by_strategy = add_up(
            {name: n}
            for name, n in zip(columns["strategy"], columns["num_generated_tokens"], strict=True)
            if name is not None
        )
        return UnitResult(
            unit_id=unit.unit_id,
            attempt=attempt,
            staged_url=staged_url,
            num_rows=out.num_rows,
            num_errors=columns["finish_reason"].count(FINISH_ERROR),
            sha256=hashlib.sha256(data).hexdigest(),
            num_bytes=len(data),
            prompt_tokens=sum(n or 0 for n in columns["num_prompt_tokens"]),
            generated_tokens=sum(n or 0 for n in columns["num_generated_tokens"]),
            wall_s=time.perf_counter() - started,
            actor=self.actor,
            device=str(self.device),
            tokens_by_strategy=by_strategy,
            tokens_by_option=by_option,
            drafter_faults=tally_faults({d: (len(m), m[0]) for d, m in r.get("faults", {}).items()} for r in records),
            first_record_end=min((r["time"] for r in records), default=None),
            exploring=add_up(r["exploring"] for r in records),
        )

    def probe_rows(self, unit: WorkUnit, rows: list[int]) -> bool:
        """Decode only `rows` of the unit and keep nothing: the driver's search for a row that
        crashes the actor. Returns True when the rows decoded (a crash never returns)."""
        table = self._read_unit(unit)
        skip = {i: "not probed" for i in range(table.num_rows) if i not in set(rows)}
        self.decode_table(table, unit, attempt=0, error_rows=skip)
        return True

    def _read_unit(self, unit: WorkUnit) -> pa.Table:
        spec = self.spec
        if unit.input_format != "parquet":
            return read_json_unit(unit, spec)
        wanted = [
            spec.input.messages_column or spec.input.prompt_column,
            *([spec.input.id_column] if spec.input.id_column else []),
            *([spec.input.strategy_column] if spec.input.strategy_column else []),
            *spec.input.params_columns.values(),
            *spec.input.keep_columns,
        ]
        try:
            fs, path = filesystem(unit.shard_url, spec.input.storage_options)
            with fs.open(path, "rb") as f:
                table = pq.ParquetFile(f).read_row_groups(list(unit.row_groups), columns=list(dict.fromkeys(wanted)))
        except Exception as exc:
            raise UnitInputError(
                f"cannot read row groups {list(unit.row_groups)} of {unit.shard_url}: {exc}; "
                "fix or replace the file and run the same command again to resume"
            ) from exc
        if table.num_rows != unit.num_rows:
            raise UnitInputError(
                f"{unit.shard_url}: row groups {list(unit.row_groups)} hold {table.num_rows} rows, the footer "
                f"said {unit.num_rows}; the file changed during the job: start a new job for the new input"
            )
        return table

    def decode_table(self, table: pa.Table, unit: WorkUnit, attempt: int, error_rows: dict[int, str]) -> Decoded:
        """Output columns, `generation.n` rows per input row (input order, then sample index), the
        throughput records closed meanwhile, and tokens per drafting option."""
        spec = self.spec
        n, samples = table.num_rows, spec.generation.n
        row_ids = self._row_ids(table, unit)
        errors = {**row_problems(table), **error_rows}  # input row -> why it is not decoded
        token_ids, prompt_tokens = self._tokenize(table, errors)
        settings = self._row_settings(table, row_ids, token_ids, errors)
        groups = self._groups(table, token_ids, settings, errors)

        def each(values: list) -> list:  # an input row's value on each of its samples
            return [v for v in values for _ in range(samples)]

        columns: dict[str, list] = {name: [None] * (n * samples) for name in OUTPUT_SCHEMA.names}
        columns["row_id"], columns["sample_index"] = each(row_ids), list(range(samples)) * n
        columns["finish_reason"] = [FINISH_ERROR] * (n * samples)
        columns["error"] = each([errors.get(i) for i in range(n)])
        columns["num_prompt_tokens"] = each([prompt_tokens.get(i) for i in range(n)])
        for name in score_columns(spec):
            columns[name] = [None] * (n * samples)
        for name in spec.input.keep_columns:
            columns[name] = each(table.column(name).to_pylist())
        with self._lock:
            self._rows_done += len(errors) * samples
        items = self._items(groups, token_ids)
        requests = [
            RowRequest(
                token_ids[i],
                seeded_key(row_key(row_ids[i], sample), settings[i].seed, spec.generation.seed),
                self._stop_strings(settings[i].stop).for_row(),
            )
            for _, (i, sample) in items
        ]
        rows = [
            (group, request, len(request.prompt) + group[1][0])
            for (group, _), request in zip(items, requests, strict=True)
        ]
        ticket = self.engine.submit(unit.unit_id, attempt, rows, (unit, [item for _, item in items], row_ids))
        outputs = ticket.wait()
        for ((name, _), (i, sample)), row in zip(items, outputs, strict=True):
            self._fill(columns, i * samples + sample, row, name, settings[i].stop)
        by_option = add_up(row.tokens_by_option or {} for row in outputs)
        return Decoded(columns, [self._record(r) for r in ticket.records], by_option)

    def _row_ids(self, table: pa.Table, unit: WorkUnit) -> list[str]:
        if ROW_ID in table.column_names:  # a JSON Lines unit's, read with its rows
            return table.column(ROW_ID).to_pylist()
        if self.spec.input.id_column:
            return row_ids_of_id_column(table.column(self.spec.input.id_column)).to_pylist()
        return [derived_row_id(unit.shard_name, unit.first_row + i) for i in range(table.num_rows)]

    def _tokenize(self, table: pa.Table, errors: dict[int, str]) -> tuple[dict[int, list[int]], dict[int, int]]:
        """Token ids of the rows to decode, and every tokenized row's prompt length, by row index: plain
        prompts, or chat messages rendered by the tokenizer's template. A bad prompt, or one too long
        for the model, goes into `errors`."""
        chat = chat_rows(table, self.spec.input)
        prompts, problems = unit_prompts(self.tokenizer, table, self.spec.input, chat)
        for i, problem in enumerate(problems):
            if problem and i not in errors:
                errors[i] = problem
        decodable = [i for i in range(len(prompts)) if i not in errors]
        encoded = encode(self.tokenizer, {i: as_text(prompts[i]) for i in decodable}, chat)
        prompt_tokens: dict[int, int] = {}
        token_ids: dict[int, list[int]] = {}
        for i in decodable:
            ids = encoded[i]
            prompt_tokens[i] = len(ids)
            if len(ids) >= self.runner.max_context:
                errors[i] = too_long_message(len(ids), self.runner.max_context)
            else:
                token_ids[i] = ids
        return token_ids, prompt_tokens

    def _fill(self, columns: dict[str, list], o: int, row: RowOutput, strategy: str, stop: tuple[str, ...]) -> None:
        """Output row `o`'s columns from its decoded `row`, which `strategy` decoded unless it says."""
        columns["completion"][o] = completion_text(self.tokenizer, row.tokens, list(stop))
        columns["finish_reason"][o] = row.finish_reason
        columns["num_generated_tokens"][o] = len(row.tokens)
        columns["strategy"][o] = row.strategy or strategy
        for name, value in row.columns.items():
            columns[name][o] = value
        _fill_scores(columns, o, row)

    def _open_decoding(self, group: tuple[str, tuple], requests: list[RowRequest]) -> Decoding:
        name, key = group
        return self._strategy(name).open(requests, self._batch_params(key))

    def _before_join(self, rows: list[Pending]) -> None:
        """The fault plan's hook, per unit of the rows about to join a batch."""
        by_ticket: dict[int, list[Pending]] = {}
        for row in rows:
            by_ticket.setdefault(id(row.ticket), []).append(row)
        for joining in by_ticket.values():
            ticket = joining[0].ticket
            unit, items, row_ids = ticket.context
            indices = [items[p.place][0] for p in joining]
            faults.before_batch(self.faults, unit.unit_id, ticket.attempt, indices, [row_ids[i] for i in indices])

    def _row_done(self, row: RowOutput) -> None:
        with self._lock:
            self._rows_done += 1
            self._generated += len(row.tokens)

    def _record(self, record: SegmentRecord) -> dict[str, Any]:
        """A throughput record of the actor's decoding (`engine.SegmentRecord`) for the job's `_logs/`."""
        name, _ = record.group
        segment, rows = record.segment, record.finished
        generated = segment.generated_tokens
        return {
            "job_id": self.spec.job_id,
            "units": record.units,
            "actor": self.actor,
            "device": str(self.device),
            "strategy": name,
            "batch_size": record.batch_size,
            "prompt_tokens": record.prompt_tokens,
            "generated_tokens": generated,
            "target_forwards": segment.target_forwards,
            "rows_finished": len(rows),
            "rows_at_length": sum(r.finish_reason == FINISH_LENGTH for r in rows),
            "repetition_rate": round(sum(repetition_rate(r.tokens) for r in rows) / len(rows), 4) if rows else None,
            "wall_s": round(record.wall_s, 6),
            "tokens_per_s": round(generated / record.wall_s, 3) if record.wall_s > 0 else None,
            "time": record.time,
            **segment.stats,
            "switches": self.controller.drain_events() if self.controller is not None else [],
            "exploring": self.controller.drain_exploring() if self.controller is not None else {},
        }

    def _row_settings(
        self, table: pa.Table, row_ids: list[str], token_ids: dict[int, list[int]], errors: dict[int, str]
    ) -> dict[int, RowSettings]:
        """Each decodable row's settings: the job's, overridden by `input.params_columns`. A row with a
        value that cannot be used, or at temperature 0 when it is to be sampled several times, becomes
        an error row (in `errors`, out of `token_ids`)."""
        named, samples = self.spec.input.params_columns, self.spec.generation.n
        values = {setting: table.column(column).to_pylist() for setting, column in named.items()}
        settings = {}
        for i in list(token_ids):
            found = row_settings(self.job_settings, {k: v[i] for k, v in values.items()}, named, row_ids[i])
            if not isinstance(found, str) and samples > 1 and found.temperature == 0:
                column = named.get("temperature")
                found = (
                    f"row {row_ids[i]}: generation.n={samples} samples at temperature 0 would be {samples} "
                    "copies of one greedy completion: give the row a temperature > 0"
                    + (f" in input column {column!r}" if column else "")
                )
            if isinstance(found, str):
                errors[i] = found
                del token_ids[i]
            else:
                settings[i] = found
        return settings

    def _groups(
        self,
        table: pa.Table,
        token_ids: dict[int, list[int]],
        settings: dict[int, RowSettings],
        errors: dict[int, str],
    ) -> dict[tuple[str, tuple], list[tuple[int, int]]]:
        """(row, sample index) pairs to decode, grouped by strategy (`input.strategy_column` where given,
        else the job's) and by the settings a batch shares (`RowSettings.batch_key`).

        A row naming an unknown strategy, one whose model is missing, or one that cannot decode with the
        row's settings becomes an error row.
        """
        default = self.spec.strategy.name
        wanted = table.column(self.spec.input.strategy_column).to_pylist() if self.spec.input.strategy_column else None
        groups: dict[tuple[str, tuple], list[tuple[int, int]]] = {}
        for i in list(token_ids):
            name = (wanted[i] if wanted else None) or default
            try:
                self._strategy(name)
                problem = self._refusal(name, greedy=settings[i].temperature == 0)
            except (KeyError, ValueError) as exc:
                problem = exc.args[0]
            if problem:
                errors[i] = f"{self.spec.input.strategy_column}: {problem}" if wanted else problem
                del token_ids[i]
                continue
            groups.setdefault((name, settings[i].batch_key()), []).extend((i, s) for s in range(self.spec.generation.n))
        return groups

    def _refusal(self, name: str, greedy: bool) -> str | None:
        """Why strategy `name` cannot decode a row at these settings (a strategy column or a row's own
        temperature may ask for what the job's checks did not see), or None."""
        options = dataclasses.replace(self.spec.strategy, name=name)
        return "; ".join(registry.problems(options, greedy, self.params.logprobs is not None)) or None

    def _batch_params(self, key: tuple[int, float, float]) -> GenerationParams:
        """The parameters of a batch of rows sharing `key` (`RowSettings.batch_key`)."""
        max_new_tokens, temperature, top_p = key
        sampling = SamplingParams(temperature, self.spec.generation.top_k, top_p, self.spec.generation.seed)
        return dataclasses.replace(self.params, max_new_tokens=max_new_tokens, sampling=sampling)

    def _stop_strings(self, stops: tuple[str, ...]) -> StopStrings:
        if stops not in self._stops:
            self._stops[stops] = StopStrings(self.tokenizer, list(stops))
        return self._stops[stops]

    @staticmethod
    def _items(
        groups: dict[tuple[str, tuple], list[tuple[int, int]]], token_ids: dict[int, list[int]]
    ) -> list[tuple[tuple[str, tuple], tuple[int, int]]]:
        """(group, (row, sample index)) in the order they join batches: group by group, rows of similar
        prompt length together (a batch opened on them pads little), a row's samples next to each other
        (they share its prefill, `batch.start_batch`)."""
        return [
            (group, item)
            for group, rows in groups.items()
            for item in sorted(rows, key=lambda item: len(token_ids[item[0]]))  # stable: samples stay together
        ]


def _fill_scores(columns: dict[str, list], i: int, row: RowOutput) -> None:
    """Row `i`'s token ids and log-probabilities, in those of `SCORE_COLUMNS` the job asked for."""
    if "token_ids" in columns:
        columns["token_ids"][i] = list(row.tokens)
    if "logprobs" in columns:
        columns["logprobs"][i] = [s.logprob for s in row.logprobs]
    if "top_logprobs" in columns:
        columns["top_logprobs"][i] = [
            [{"token_id": t, "logprob": v} for t, v in zip(s.top_ids, s.top_logprobs, strict=True)]
            for s in row.logprobs
        ]


def _write(url: str, data: bytes, storage_options: dict[str, Any]) -> None:
    write_bytes(*filesystem(url, storage_options), data)


def _eos_ids(model: torch.nn.Module, tokenizer: Any) -> set[int]:
    """EOS ids from the generation config (may be a list) and the tokenizer."""
    ids: set[int] = set()
    for source in (getattr(model, "generation_config", None), model.config, tokenizer):
        value = getattr(source, "eos_token_id", None)
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, list | tuple):
            ids.update(v for v in value if isinstance(v, int))
    return ids


def score_columns(spec: WorkerSpec) -> list[str]:
    """The columns of `SCORE_COLUMNS` the job asked for."""
    asked = {
        "token_ids": spec.output.token_ids,
        "logprobs": spec.output.logprobs,
        "top_logprobs": spec.output.top_logprobs > 0,
    }
    return [name for name in SCORE_COLUMNS.names if asked[name]]


def output_schema(spec: WorkerSpec, table: pa.Table) -> pa.Schema:
    """The output columns of `table`'s rows under this job's settings (`contract.output_schema`)."""
    return contract.output_schema(score_columns(spec), [table.schema.field(name) for name in spec.input.keep_columns])


def timed_forwards(runner: ModelRunner, batch_size: int) -> dict[int, list[float]]:
    """The forwards a controller is told of before the first batch (`AdaptiveController.time_forwards`:
    an actor's, and the in-process bench's as an actor's): `FORWARD_SAMPLES` of each of `TIMED_WIDTHS`
    over `batch_size` rows of `TIMED_CONTEXT` cached tokens (fewer where the model's positions end
    sooner; none where they cannot hold the widest)."""
    context = min(TIMED_CONTEXT, runner.max_context - max(TIMED_WIDTHS))
    if context < 1:
        return {}
    contexts = synthetic_contexts(batch_size, context, runner.vocab_size)
    return runner.forward_seconds(contexts, TIMED_WIDTHS, FORWARD_SAMPLES)
