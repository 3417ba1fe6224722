"""The output folder and its commit protocol: staged parts, one committer, manifest and `_SUCCESS` last.

Layout of `output.url`:

    _job.json                       identity of the job that owns the folder (written first)
    part-<unit_id>.parquet          one committed part per work unit (deterministic name; .jsonl
                                    when output.format is jsonl or openai_batch)
    _commits/<unit_id>.json         commit record of a part: rows, sha256, bytes (written after it)
    _staging/<unit_id>/<attempt>    parts staged by actors, never read by users
    _logs/batches/<unit_id>/…jsonl  per-batch throughput records (at least once; attempt in each)
    _logs/controller_stats.json     what the actors' controllers learned (workers/common/controller_stats.py)
    _manifest.json                  every part with rows and checksum, config, versions (written last
    _SUCCESS                        but one, then this)

Actors only stage; the driver alone publishes, one unit at a time, so a stale attempt can never
overwrite a committed part. A unit counts as committed when its commit record exists and its part
has the recorded size: a crash between publishing a part and recording it just reruns the unit,
which republishes the same name.
"""

from __future__ import annotations

import json
import posixpath
import time
import uuid
from typing import Any

from pipeline import markers
from pipeline.errors import JobError
from pipeline.fingerprint import changed_shards, difference
from workers.common.contract import parse_unit_id, part_name
from workers.common.spec import UnitResult
from workers.common.storage import filesystem, join, protocol_prefix, write_bytes

JOB_FILE = "_job.json"
MANIFEST_FILE = "_manifest.json"


def commit_record_name(unit: str) -> str:
    """Where a unit's commit record lies, relative to the output folder."""
    return f"_commits/{unit}.json"


class OutputFolder:
    def __init__(self, url: str, storage_options: dict[str, Any], part_suffix: str = ".parquet") -> None:
        self.url = url.rstrip("/")
        self.part_suffix = part_suffix  # the parts' format's (`output_formats.part_suffix`)
        self.fs, self.path = filesystem(self.url, storage_options)
        self.prefix = protocol_prefix(self.fs)
        self.publish_s = 0.0  # time spent in `publish`: the job's commits phase

    def _p(self, *parts: str) -> str:
        return join(self.path, *parts)

    def staged_url(self, unit_id: str) -> str:
        """A fresh staging name per attempt: attempts of different runs never collide."""
        return self.prefix + self._p("_staging", unit_id, f"{uuid.uuid4().hex}{self.part_suffix}")

    def batch_log_url(self, unit_id: str, attempt: int) -> str:
        return self.prefix + self._p("_logs", "batches", unit_id, f"attempt-{attempt}-{uuid.uuid4().hex[:8]}.jsonl")

    def finished(self) -> bool:
        """Whether the folder holds a finished job (`_SUCCESS`): one that no run can add units to."""
        return markers.finished(self.fs, self.path)

    def read_json(self, name: str) -> dict[str, Any] | None:
        try:
            return json.loads(self.fs.cat_file(self._p(name)))
        except FileNotFoundError:
            return None

    def write_json(self, name: str, data: dict[str, Any]) -> None:
        write_bytes(self.fs, self._p(name), (json.dumps(data, indent=1, sort_keys=True) + "\n").encode())

    def claim(self, fingerprint: str, job_record: dict[str, Any]) -> bool:
        """Make the folder this job's, or fail if it holds something else. True if the job already finished.

        The one accepted difference: input shards that changed but have no committed unit yet
        (`fingerprint.changed_shards`); the folder then takes the new identity.
        """
        self.fs.invalidate_cache()  # object-store listings are cached; this run must see what is there now
        existing = self.read_json(JOB_FILE)
        if existing is None:
            if self.fs.exists(self.path) and self.fs.ls(self.path, detail=False):
                raise JobError(
                    f"output.url {self.url} is not empty and holds no accelgen job ({JOB_FILE} missing): "
                    "choose a new or empty folder"
                )
            self.fs.makedirs(self.path, exist_ok=True)
            self.write_json(JOB_FILE, job_record)
            return False
        if existing.get("fingerprint") != fingerprint:
            changed = changed_shards(existing.get("identity", {}), job_record["identity"])
            committed_shards = {parse_unit_id(unit)[0] for unit in self.committed()}
            if changed is not None and not changed & committed_shards and not self.finished():
                self.write_json(JOB_FILE, job_record)
                return False
            raise JobError(
                f"output.url {self.url} holds the results of a different job (fingerprint "
                f"{existing.get('fingerprint', '?')[:12]}, this job {fingerprint[:12]}): "
                f"{difference(existing.get('identity', {}), job_record['identity'])}. A job resumes only over the "
                "same shards, where just shards with no committed unit may change. Choose a new output.url, or "
                "delete the folder to redo it"
            )
        return self.finished()

    def committed(self) -> dict[str, dict[str, Any]]:
        """Commit records of the units whose parts are in place, by unit id.

        One listing of the folder gives every part's size, and the records are fetched together
        (concurrently on object stores): a resume over thousands of units costs a few requests'
        latency, not two round trips per unit.
        """
        self.fs.invalidate_cache()
        try:
            names = self.fs.ls(self._p("_commits"), detail=False)
        except FileNotFoundError:
            return {}
        sizes = {posixpath.basename(info["name"]): info["size"] for info in self.fs.ls(self.path, detail=True)}
        records = {}
        for data in self.fs.cat(names, on_error="omit").values():
            record = json.loads(data)
            if sizes.get(record["part"]) == record["bytes"]:
                records[record["unit_id"]] = record
        return records

    def publish(self, result: UnitResult) -> dict[str, Any]:
        """Move a staged part to its final name, then record the commit. Returns the record."""
        began = time.perf_counter()
        name = part_name(result.unit_id, self.part_suffix)
        staged = result.staged_url.removeprefix(self.prefix)
        if self.prefix:
            # Object stores have no atomic rename: copy to the final key (one atomic object write), then drop.
            self.fs.copy(staged, self._p(name))
            self.fs.rm(staged)
        else:
            self.fs.mv(staged, self._p(name))
        record = {
            "unit_id": result.unit_id,
            "part": name,
            "rows": result.num_rows,
            "error_rows": result.num_errors,
            "sha256": result.sha256,
            "bytes": result.num_bytes,
            "attempt": result.attempt,
            "strategies": sorted(result.tokens_by_strategy),  # what decoded its rows: the manifest's `lossy`
        }
        self.write_json(commit_record_name(result.unit_id), record)
        self.publish_s += time.perf_counter() - began
        return record

    def _abort_incomplete_uploads(self) -> None:
        """S3 keeps the parts of a multipart upload a crash left unfinished (and bills them): abort
        those under this output's prefix, and only those."""
        if not hasattr(self.fs, "list_multipart_uploads"):
            return
        bucket, _, prefix = self.path.partition("/")
        for upload in self.fs.list_multipart_uploads(bucket):
            if upload["Key"].startswith(prefix + "/"):
                self.fs.call_s3("abort_multipart_upload", Bucket=bucket, Key=upload["Key"], UploadId=upload["UploadId"])

    def finish(self, manifest: dict[str, Any]) -> None:
        """Write the manifest, drop leftover staging, then `_SUCCESS` — the last write of a job."""
        self.write_json(MANIFEST_FILE, manifest)
        self.fs.invalidate_cache()
        if self.fs.exists(self._p("_staging")):
            self.fs.rm(self._p("_staging"), recursive=True)
        self._abort_incomplete_uploads()
        write_bytes(self.fs, self._p(markers.SUCCESS_FILE), b"")
