"""The generator: one loaded model decoding work units into staged output parts.

`Generator` is a plain class so it runs in-process in tests and benchmarks; the driver wraps it as
a Ray actor (`workers.actor`). It never publishes anything: it stages one part per attempt and returns
a `UnitResult`, and the driver alone commits (docs/design.md, "Data flow of one job"). Its start is
`workers.warm_up`, its rows' preparation `workers.unit_rows`, its part `workers.output_part`, and its
one decoding loop, shared by every unit in flight, `workers.engine`.
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
import torch
from transformers.utils import logging as transformers_logging

from strategies import registry
from strategies.base import Decoding, GenerationParams, RowOutput, RowRequest, Strategy, logit_controls
from strategies.constraints.formats import FormatError
from strategies.constraints.grammars import Grammar, GrammarCache
from strategies.control.controller import Learned
from strategies.runtime.heap import freeze_loaded
from strategies.runtime.sampling import SamplingParams, row_key, seeded_key
from workers import unit_rows
from workers.common import faults
from workers.common.contract import FINISH_ERROR
from workers.common.controller_stats import StatsKey
from workers.common.dtype_choice import bf16_matrix_flags
from workers.common.output_formats import encode_part
from workers.common.row_settings import RowSettings, job_row_settings, sets_controls
from workers.common.spec import UnitResult, WorkerSpec, WorkUnit, add_up, tally_faults
from workers.engine import DecodeEngine, Pending
from workers.json_input import as_read, response_context, row_problems
from workers.model_loading import DTYPE_NAMES, LoadedModels, load_models, resolve_dtype
from workers.output_part import empty_columns, fill_row, output_schema, stage, throughput_record
from workers.rows import StopStrings, completion_text
from workers.warm_up import (
    decode_step_seconds,
    device_identity,
    load_output_modules,
    prepare_target,
    start_controller,
)


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
        self.faults = faults.plan()
        self._lock = threading.Lock()
        self._rows_done = 0
        self._generated = 0
        # Started first: every torch operation runs on its thread (`workers.engine`, on the CPU's threads).
        self.engine = DecodeEngine(
            self._open_decoding,
            spec.workers.batch_size,
            spec.workers.max_batch_tokens,
            self._before_join,
            self._row_done,
        )
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        # `model.dtype=auto` on CPU: a bfloat16 load measured for the driver's choice.
        self._candidate: LoadedModels | None = None
        # Where the job's dtype is still to be chosen by timing a step in each, only a plain step's kernels
        # are readied until then: readying every row count of both dtypes would cost the actor's start
        # twice what the dtype chosen needs (some 20 s for a 0.5B model on one core).
        self._choosing = self._auto_on_cpu() and not spec.auto_dtype and bool(bf16_matrix_flags())
        self.engine.run(self._load_target)
        load_output_modules()
        g = spec.generation
        self.params = GenerationParams(
            max_new_tokens=g.max_new_tokens,
            sampling=SamplingParams(g.temperature, g.top_k, g.top_p, g.seed),
            eos_token_ids=frozenset(_eos_ids(self._loaded.target, self.tokenizer)),
            ignore_eos=g.ignore_eos,
            logprobs=spec.scores,
        )
        self.job_settings = job_row_settings(g)
        self._grammars: GrammarCache | None = None  # built when a row first asks for a response_format
        self._job_grammar()
        self._stops: dict[tuple[str, ...], StopStrings] = {}
        freeze_loaded()  # last: the modules, models and the strategy loaded above are never scanned again

    def _load_target(self) -> None:
        """The target loaded, prepared (`prepare_target`) and started (`_start`), on the engine's thread."""
        spec = self.spec
        # Ray sets OMP_NUM_THREADS to the actor's CPU reservation; the decode speed wants the cores.
        torch.set_num_threads(spec.workers.torch_threads if spec.workers.torch_threads > 0 else os.cpu_count() or 1)
        loaded = self._load_models(resolve_dtype(spec.model.dtype, self.device, spec.auto_dtype))
        prepare_target(loaded.models.target, spec, plain_steps_only=self._choosing)
        self._start(loaded)

    def _start(self, loaded: LoadedModels) -> None:
        """Decode with `loaded`, its target prepared (`prepare_target`): its controller, its strategies."""
        self._loaded = loaded
        self.tokenizer, self.models, self.target_load_s = loaded.tokenizer, loaded.models, loaded.target_load_s
        self.runner = self.models.target
        self.dtype = self.runner.dtype
        spec = self.spec
        self.stats_key = StatsKey(
            spec.target_sha256, device_identity(self.device), str(self.dtype).removeprefix("torch.")
        )
        self.controller = start_controller(spec, self.runner, self.stats_key)
        self._strategies: dict[str, Strategy] = {}
        self._strategy(spec.strategy.name)  # fail at start, not at the first unit

    def _load_models(self, dtype: torch.dtype) -> LoadedModels:
        """The job's models on the actor's device in `dtype`, the optional ones left to load when a
        strategy that uses them is first created."""
        spec = self.spec
        transformers_logging.disable_progress_bar()  # one progress bar per job, the driver's
        loaded = load_models(
            spec.model.target,
            dtype,
            self.device,
            spec.models,
            cache_dir=spec.model.cache_dir,
            trust_remote_code=spec.model.trust_remote_code,
            storage_options=spec.model.storage_options,
            lazy=True,
            prefix_cache_mb=spec.model.prefix_cache_mb,
        )
        if spec.input.messages_column and not loaded.tokenizer.chat_template:
            raise ValueError(
                f"input.messages_column is set but the tokenizer of {spec.model.target} has no chat template"
            )
        return loaded

    def _strategy(self, name: str) -> Strategy:
        """The actor's instance of a strategy (it keeps state across batches, e.g. a Lookahead trie)."""
        if name not in self._strategies:
            options = dataclasses.replace(self.spec.strategy, name=name)
            self._strategies[name] = registry.create(options, self.models, self.controller)
        return self._strategies[name]

    def ready(
        self, job_id: str | None = None, auto_dtype: str | None = None, measure_dtypes: bool = False
    ) -> dict[str, Any]:
        """The actor's device, and its own account of its start-up for the job's phases: when its
        constructor began (epoch seconds) and how long each model it loaded so far took (the target at
        start; the optional ones when a strategy first used them, so a later call may list more).

        `job_id`: the job's id for the batch records. Actors start before the driver has planned the
        input, which the id is a hash of; the driver names it with every `ready()`. `model.dtype=auto`
        on CPU (`workers.common.dtype_choice`): `measure_dtypes` times a decode step in float32 and in
        bfloat16 first (`dtype_seconds`, beside the CPU's `bf16_flags`), for the driver to choose by;
        `auto_dtype` is the job's choice, which the actor decodes in from then on."""
        if job_id is not None:
            self.spec = dataclasses.replace(self.spec, job_id=job_id)
        measured = self.engine.run(self._measure_dtypes) if measure_dtypes else None
        if auto_dtype is not None:
            self.engine.run(lambda: self._use_auto_dtype(auto_dtype))
        return {
            "actor": self.actor,
            "device": str(self.device),
            "dtype": str(self.dtype).removeprefix("torch."),
            "torch_threads": torch.get_num_threads(),
            "packed_bytes": self.runner.packed_weight_bytes,
            "init_began": self.init_began,
            "load_s": {"target": self.target_load_s, **self.models.load_s},
            "bf16_flags": bf16_matrix_flags(),
            **({"dtype_seconds": measured} if measured else {}),
        }

    def _auto_on_cpu(self) -> bool:
        return self.spec.model.dtype == "auto" and self.device.type == "cpu"

    def _measure_dtypes(self) -> dict[str, float] | None:
        """A decode step timed in float32 (the models loaded) and in bfloat16 (a second load, kept until
        the driver chooses), each with its fastest kernel for a plain step, where `auto` may choose
        bfloat16: on CPU with bfloat16 matrix hardware."""
        if not self._choosing or self.dtype != torch.float32:
            return None
        batch_size = self.spec.workers.batch_size
        seconds = {"float32": decode_step_seconds(self.runner, batch_size)}
        candidate = self._load_models(torch.bfloat16)
        prepare_target(candidate.models.target, self.spec, plain_steps_only=True)
        seconds["bfloat16"] = decode_step_seconds(candidate.models.target, batch_size)
        self._candidate = candidate
        return seconds

    def _use_auto_dtype(self, name: str) -> None:
        """Decode in `name` from now on where `model.dtype=auto` on CPU leaves it to the job: the measured
        bfloat16 load where that is the choice, the actor's own models where they are in it, a new load
        otherwise; readied whole (`prepare_target`) where only a plain step's kernels were."""
        if not self._auto_on_cpu():
            return
        candidate, self._candidate = self._candidate, None
        dtype = DTYPE_NAMES[name]
        if dtype == self.dtype:
            loaded, readied = self._loaded, not self._choosing
        elif candidate is not None and candidate.models.target.dtype == dtype:
            loaded, readied = candidate, False  # its plain step's kernels only
        else:
            loaded, readied = self._load_models(dtype), False
        self._choosing = False
        if not readied:
            prepare_target(loaded.models.target, self.spec)
            self._start(loaded)

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
        table = unit_rows.read_unit(self.spec, unit)
        columns, records, by_option = self.decode_table(table, unit, attempt, error_rows)
        out = pa.table(columns, schema=output_schema(self.spec, table))
        data = encode_part(out, self.spec.output.format, response_context(self.spec, table))
        stage(staged_url, data, self.spec.output.storage_options)
        stage(log_url, "".join(json.dumps(r) + "\n" for r in records).encode(), self.spec.output.storage_options)
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
        table = unit_rows.read_unit(self.spec, unit)
        skip = {i: "not probed" for i in range(table.num_rows) if i not in set(rows)}
        self.decode_table(table, unit, attempt=0, error_rows=skip)
        return True

    def decode_table(self, table: pa.Table, unit: WorkUnit, attempt: int, error_rows: dict[int, str]) -> Decoded:
        """Output columns, `generation.n` rows per input row (input order, then sample index), the
        throughput records closed meanwhile, and tokens per drafting option."""
        spec = self.spec
        samples = spec.generation.n
        row_ids = unit_rows.row_ids(spec, table, unit)
        errors = {**row_problems(table), **error_rows}  # input row -> why it is not decoded
        token_ids, prompt_tokens = unit_rows.tokenize(spec, self.tokenizer, self.runner.max_context, table, errors)
        settings = unit_rows.settings_by_row(
            spec, self.job_settings, table, row_ids, token_ids, errors, self.runner.vocab_size
        )
        grammars = unit_rows.compile_formats(spec, self._grammar, settings, row_ids, token_ids, errors)
        groups = unit_rows.groups(spec, table, token_ids, settings, errors, self._refusal)
        columns = empty_columns(spec, table, row_ids, errors, prompt_tokens)
        with self._lock:
            self._rows_done += len(errors) * samples
        items = unit_rows.batch_order(groups, token_ids)
        requests = [
            RowRequest(
                token_ids[i],
                seeded_key(row_key(row_ids[i], sample), settings[i].seed, spec.generation.seed),
                self._stop_strings(settings[i].stop).for_row(),
                logit_controls(settings[i]),
                grammars.get(i),
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
            completion = completion_text(self.tokenizer, row.tokens, list(settings[i].stop))
            fill_row(columns, i * samples + sample, row, name, completion)
        by_option = add_up(row.tokens_by_option or {} for row in outputs)
        device = str(self.device)
        cache = self.runner.prefix_cache
        counts = cache.drain_counts if cache is not None else None
        records = [
            throughput_record(r, spec.job_id, self.actor, device, self.controller, counts) for r in ticket.records
        ]
        return Decoded(columns, records, by_option)

    def _refusal(self, name: str, settings: RowSettings) -> str | None:
        """Why strategy `name` cannot decode a row at these settings, or None: an unknown strategy, one
        whose model is missing, or one refusing the row's settings (a strategy column or a row's own
        temperature or controls may ask for what the job's checks did not see)."""
        try:
            self._strategy(name)
            options = dataclasses.replace(self.spec.strategy, name=name)
            greedy, scores = settings.temperature == 0, self.params.logprobs is not None
            formats = settings.response_format is not None
            return "; ".join(registry.problems(options, greedy, scores, sets_controls(settings), formats)) or None
        except (KeyError, ValueError) as exc:
            return exc.args[0]

    def _grammar(self, format_json: str) -> Grammar:
        """The compiled grammar of a canonical response_format (`strategies.constraints.grammars`)."""
        if self._grammars is None:
            self._grammars = GrammarCache(self.tokenizer, self.runner.vocab_size, self.params.eos_token_ids)
        return self._grammars.get(format_json)

    def _job_grammar(self) -> None:
        """Compile the job's response_format at start: one that cannot compile fails the job, not its rows."""
        job_format = self.job_settings.response_format
        if job_format is None:
            return
        try:
            self._grammar(job_format)
        except FormatError as exc:
            raise ValueError(f"generation.response_format {job_format} cannot be used: {exc}") from None

    def _open_decoding(self, group: unit_rows.Group, requests: list[RowRequest]) -> Decoding:
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

    def _batch_params(self, key: tuple[int, float, float]) -> GenerationParams:
        """The parameters of a batch of rows sharing `key` (`RowSettings.batch_key`)."""
        max_new_tokens, temperature, top_p = key
        sampling = SamplingParams(temperature, self.spec.generation.top_k, top_p, self.spec.generation.seed)
        return dataclasses.replace(self.params, max_new_tokens=max_new_tokens, sampling=sampling)

    def _stop_strings(self, stops: tuple[str, ...]) -> StopStrings:
        if stops not in self._stops:
            self._stops[stops] = StopStrings(self.tokenizer, list(stops))
        return self._stops[stops]


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
