"""Continuous batching across work units: the actor's one decoding loop.

Units arrive as tickets (`Ticket`): their rows, grouped by what a batch must share (strategy, and
the settings that shape the loop: `RowSettings.batch_key`). One thread decodes: it opens a batch of
the oldest waiting group and, whenever rows finish, lets waiting rows of the same group join between
steps (`Decoding.admit`), whichever unit they come from, up to `batch_size` rows and `max_batch_tokens`
prompt-plus-new tokens decoding at once. Rows join in arrival order, and a group's run stops taking
rows at the first waiting row of another group, so no group waits behind a stream of another's.

Every torch operation of the actor runs on this thread: its start (loading and readying the models)
and the dtype measurement are handed to it (`run`) like rows. The CPU's OpenMP runtime (libgomp) keeps
a pool of worker threads for each thread that has run a parallel region; while another thread's pool
lives, this thread's workers stop spinning between the forward's many short parallel regions and sleep
instead, and every region then waits for them to wake. Measured on a 2-core CPU, one-row bfloat16
matmuls of a 0.5B model's shapes took 25-35% longer on a thread other than the one that made the
weights, and as long as there when no other thread had run torch.

A unit's rows are done as soon as its last row finishes: its ticket wakes the thread that submitted
it, which stages the unit's part while the others decode on. Exactly-once commits are unchanged: a
part still holds exactly one unit's rows. A fault in a batch fails the tickets of every row decoding
in it (their units are retried; the driver retries a unit alone, so a row that kills its batch is
found without neighbours).

Throughput records (`SegmentRecord`) cover the decoding between two points where something ended
(a ticket complete, a batch drained, or `SEGMENT_S` passed), so their decode times add up to the
actor's. Each lands in exactly one unit's log: the records closed so far go to the next ticket to
complete (`Ticket.records`), handed over by the decoding thread itself, so which unit logs a record
does not depend on which submitting thread wakes first.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Hashable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, TypeVar

from strategies.base import Decoding, RowOutput, RowRequest, Segment

SEGMENT_S = 2.0  # a throughput record closes at the first step boundary after this long
# A batch that would open with room waits this long for more rows: an actor's units arrive together
# but are read and tokenized one by one, and a batch opened on the first unit alone would decode
# below `batch_size` until its rows finish.
GATHER_S = 0.2


@dataclass
class Ticket:
    """A unit's rows in the engine; `wait` returns their outputs, in the order they were submitted."""

    unit_id: str
    attempt: int
    outputs: list[RowOutput | None]
    remaining: int
    context: Any = None  # the submitter's, for its hooks (which input row each place is)
    done: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None
    records: list[SegmentRecord] = field(default_factory=list)  # closed since the previous ticket completed

    def wait(self) -> list[RowOutput]:
        self.done.wait()
        if self.error is not None:
            raise self.error
        return self.outputs  # type: ignore[return-value]  # every place is filled once done


@dataclass
class Pending:
    """One row to decode: its ticket, its place there, its group and what it costs in a batch."""

    ticket: Ticket
    place: int
    group: Hashable
    request: RowRequest
    cost: int  # prompt tokens plus the most new tokens it may take


@dataclass
class SegmentRecord:
    """The decoding between two record points: a throughput record's numbers."""

    group: Hashable
    units: list[str]  # units with rows decoding in it
    batch_size: int  # rows decoding, on average over the steps
    prompt_tokens: int  # of the rows that joined in it
    finished: list[RowOutput]  # rows that ended in it
    segment: Segment
    wall_s: float
    time: float  # when it closed (epoch seconds)


Opener = Callable[[Hashable, list[RowRequest]], Decoding]
T = TypeVar("T")
Hook = Callable[[list[Pending]], None]  # rows about to join (fault injection)


class DecodeEngine:
    """The actor's decoding loop: tickets in, finished rows out, one batch at a time per group."""

    def __init__(
        self,
        open_decoding: Opener,
        batch_size: int,
        max_batch_tokens: int,
        before_join: Hook | None = None,
        on_row: Callable[[RowOutput], None] | None = None,
    ) -> None:
        self.open_decoding = open_decoding
        self.batch_size = batch_size
        self.max_batch_tokens = max_batch_tokens
        self.before_join = before_join or (lambda rows: None)
        self.on_row = on_row or (lambda row: None)
        self._queue: deque[Pending] = deque()
        self._calls: deque[tuple[Callable[[], Any], Future]] = deque()  # `run`'s, taken before any row
        self._records: list[SegmentRecord] = []  # closed, for the next ticket to complete (decoding thread only)
        self._wake = threading.Condition()
        self._thread = threading.Thread(target=self._loop, name="decode", daemon=True)
        self._thread.start()

    def submit(
        self, unit_id: str, attempt: int, rows: list[tuple[Hashable, RowRequest, int]], context: Any = None
    ) -> Ticket:
        """Queue a unit's rows, each (group, request, cost); the ticket's places follow their order."""
        ticket = Ticket(unit_id, attempt, [None] * len(rows), len(rows), context)
        if not rows:
            ticket.done.set()
            return ticket
        with self._wake:
            self._queue.extend(Pending(ticket, i, g, r, c) for i, (g, r, c) in enumerate(rows))
            self._wake.notify()
        return ticket

    def run(self, fn: Callable[[], T]) -> T:
        """`fn()` on the decoding thread, between batches; its result, or its exception raised here."""
        done: Future = Future()
        with self._wake:
            self._calls.append((fn, done))
            self._wake.notify()
        return done.result()

    def _loop(self) -> None:
        while True:
            with self._wake:
                while not self._queue and not self._calls:
                    self._wake.wait()
                call = self._calls.popleft() if self._calls else None
            if call is not None:
                fn, done = call
                try:
                    done.set_result(fn())
                except BaseException as exc:  # handed to the caller, which raises it
                    done.set_exception(exc)
                continue
            with self._wake:
                group = self._queue[0].group
                deadline = time.monotonic() + GATHER_S
                while len(self._queue) < self.batch_size and (left := deadline - time.monotonic()) > 0:
                    self._wake.wait(left)
            first = self._take(group, self.batch_size, self.max_batch_tokens)
            if first:
                _OpenBatch(self, group).decode(first)

    def _take(self, group: Hashable, room: int, token_room: int) -> list[Pending]:
        """Waiting rows of `group`, in arrival order, while they fit and no other group's row is older.
        A row costlier than `max_batch_tokens` alone still gets a batch of its own."""
        taken: list[Pending] = []
        with self._wake:
            while self._queue and len(taken) < room and self._queue[0].group == group:
                row = self._queue[0]
                if row.ticket.error is not None:  # its unit failed with a batch of other rows
                    self._queue.popleft()
                    continue
                if row.cost > token_room and (taken or token_room < self.max_batch_tokens):
                    break
                taken.append(self._queue.popleft())
                token_room -= row.cost
        return taken

    def _fail(self, rows: list[Pending], exc: BaseException) -> None:
        for row in rows:
            if not row.ticket.done.is_set():
                row.ticket.error = exc
                row.ticket.done.set()


class _OpenBatch:
    """One batch of a group from its opening until no row of it decodes."""

    def __init__(self, engine: DecodeEngine, group: Hashable) -> None:
        self.engine = engine
        self.group = group
        self.admitted = 0  # rows admitted so far: the next one's request index in the decoding
        self.live: dict[int, Pending] = {}  # request index -> row, the rows decoding
        self.cost = 0  # the live rows' costs
        self._new_segment()

    def decode(self, first: list[Pending]) -> None:
        engine = self.engine
        try:
            self._join(first)
            decoding = engine.open_decoding(self.group, [p.request for p in first])
            self._deliver(decoding)  # rows that ended on their first token
            while decoding.active():
                self.sizes.append(decoding.active())
                decoding.step()
                self._deliver(decoding)
                if decoding.active() and time.perf_counter() - self.began >= SEGMENT_S:
                    self._close(decoding)
                room = engine.batch_size - decoding.active()
                if decoding.active() and room > 0:
                    more = engine._take(self.group, room, engine.max_batch_tokens - self.cost)
                    if more:
                        self._join(more)
                        decoding.admit([p.request for p in more])
                        self._deliver(decoding)
            self._close(decoding)
        except BaseException as exc:  # the units decoding here fail; the loop goes on with the next batch
            engine._fail(list(self.live.values()), exc)

    def _join(self, rows: list[Pending]) -> None:
        """Rows become members (so a fault from here on fails their units), then meet the fault hook."""
        for row in rows:
            self.live[self.admitted] = row
            self.admitted += 1
            self.cost += row.cost
        self.prompt_tokens += sum(len(p.request.prompt) for p in rows)
        self.units.update((p.ticket.unit_id, None) for p in rows)
        self.engine.before_join(rows)

    def _deliver(self, decoding: Decoding) -> None:
        """Hand finished rows to their tickets. A ticket completed closes the record before it wakes
        its unit, so the unit's log gets the decoding its last rows took: the first ticket completed
        takes every record closed since the last one was."""
        completed = []
        for index, row in decoding.finished():
            pending = self.live.pop(index)
            self.cost -= pending.cost
            self.finished.append(row)
            self.engine.on_row(row)
            ticket = pending.ticket
            ticket.outputs[pending.place] = row
            ticket.remaining -= 1
            if ticket.remaining == 0 and ticket.error is None:
                completed.append(ticket)
        if completed:
            self._close(decoding)
            completed[0].records, self.engine._records = self.engine._records, []
            for ticket in completed:
                ticket.done.set()

    def _close(self, decoding: Decoding) -> None:
        """Close the current record (if anything happened in it) and start the next."""
        segment = decoding.segment()
        if self.sizes or self.finished or segment.generated_tokens:
            record = SegmentRecord(
                group=self.group,
                units=list(self.units),
                batch_size=round(sum(self.sizes) / len(self.sizes)) if self.sizes else 0,
                prompt_tokens=self.prompt_tokens,
                finished=self.finished,
                segment=segment,
                wall_s=time.perf_counter() - self.began,
                time=time.time(),
            )
            self.engine._records.append(record)
        self._new_segment()

    def _new_segment(self) -> None:
        self.began = time.perf_counter()
        self.sizes: list[int] = []  # rows decoding at each step
        self.finished: list[RowOutput] = []
        self.prompt_tokens = 0  # of the rows that joined
        self.units = dict.fromkeys(p.ticket.unit_id for p in self.live.values())  # ordered, unique
