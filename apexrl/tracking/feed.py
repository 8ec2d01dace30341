"""The learner's trackers fed from a thread: the reporting step hands each ``result.json`` record
to ``TrackerFeed.record``, which never blocks; a thread sends it to every tracker, with the
evaluation videos that appeared since, and at the end the final checkpoint. A tracker that is
slow or unreachable never slows training: records wait in a bounded queue, and what could not be
sent is said once in the log and stays in ``result.json``."""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
from pathlib import Path

from apexrl.runtime import lifecycle, rundir
from apexrl.tracking.backends import Tracker
from apexrl.tracking.records import RunInfo, metrics_of, step_of

log = logging.getLogger("apexrl.tracking")

QUEUE_RECORDS = 1000  # records waiting for a slow tracker before new ones are dropped
FINISH_TIMEOUT_S = 30.0  # how long a stopping learner waits for the trackers' last calls
WAIT_STEP_S = 0.1  # how often that wait looks whether the learner was asked to stop


class TrackerFeed:
    """Sends records, videos and the final checkpoint to ``trackers`` from a thread of its own;
    the trackers' run ids go to ``<run dir>/tracking.json``, so a resumed run logs on into the
    same tracker runs."""

    def __init__(self, trackers: list[Tracker], info: RunInfo, capacity: int = QUEUE_RECORDS):
        self.trackers, self.info = trackers, info
        self.queue: queue.Queue = queue.Queue(maxsize=capacity)
        self.dropped = 0
        self.failures: dict[str, int] = {}  # tracker -> calls that raised
        self.live: list[Tracker] = []
        self.videos_sent: set[Path] = set()
        self.thread = threading.Thread(target=self._run, name="trackers", daemon=True)
        self.thread.start()

    def record(self, record: dict) -> None:
        """Queue one record for the trackers; a full queue drops it (said once)."""
        try:
            self.queue.put_nowait(("record", record))
        except queue.Full:
            self.dropped += 1
            if self.dropped == 1:
                log.warning(
                    "the trackers are behind by %d records: newer ones are not sent to them "
                    "(they are in result.json)",
                    self.queue.maxsize,
                )

    def close(
        self,
        checkpoint: Path | None,
        ok: bool,
        timeout_s: float = FINISH_TIMEOUT_S,
        stop: threading.Event | None = None,
    ) -> None:
        """Send what is queued, the videos and ``checkpoint``, end the tracker runs; wait up to
        ``timeout_s`` for it, or until ``stop`` is set (the process was asked to stop)."""
        deadline = time.monotonic() + timeout_s
        finish = ("finish", (checkpoint, ok))
        while not _waited(deadline, stop):
            try:
                self.queue.put(finish, timeout=WAIT_STEP_S)
                break
            except queue.Full:
                continue
        while self.thread.is_alive() and not _waited(deadline, stop):
            self.thread.join(WAIT_STEP_S)
        if self.thread.is_alive():
            log.warning(
                "the trackers did not finish within %.0f s (or the learner was asked to stop): "
                "what they did not take is in result.json",
                timeout_s,
            )

    # -- the thread ----------------------------------------------------------------------------

    def _run(self) -> None:
        ids = read_ids(self.info.run_dir)
        for tracker in self.trackers:
            try:
                ids[tracker.name] = tracker.start(self.info, ids.get(tracker.name))
                self.live.append(tracker)
            except Exception as exc:
                log.warning(
                    "tracker %s could not start (%s: %s): this run's records stay in result.json "
                    "(`apexrl track RUN_DIR --to %s` sends them later)",
                    tracker.name, type(exc).__name__, exc, tracker.name,
                )  # fmt: skip
        if self.live:
            lifecycle.write_atomic(rundir.tracking_path(self.info.run_dir), json.dumps(ids))
        while True:
            kind, item = self.queue.get()
            if kind == "record":
                metrics, step = metrics_of(item), step_of(item)
                for tracker in self.live:
                    self._call(tracker, tracker.log, metrics, step)
                self._send_new_videos()
                continue
            checkpoint, ok = item
            self._send_new_videos()
            for tracker in self.live:
                if checkpoint is not None and Path(checkpoint).exists():
                    self._call(tracker, tracker.artifact, Path(checkpoint), "checkpoint")
                self._call(tracker, tracker.finish, ok)
            self._say_what_was_lost()
            return

    def _send_new_videos(self) -> None:
        for video in rundir.finished_videos(self.info.run_dir):
            if video not in self.videos_sent:
                self.videos_sent.add(video)
                for tracker in self.live:
                    self._call(tracker, tracker.artifact, video, "video")

    def _call(self, tracker: Tracker, call, *args) -> None:
        try:
            call(*args)
        except Exception as exc:
            self.failures[tracker.name] = self.failures.get(tracker.name, 0) + 1
            if self.failures[tracker.name] == 1:
                log.warning(
                    "tracker %s: %s: %s (said once; what it does not take stays in result.json)",
                    tracker.name, type(exc).__name__, exc,
                )  # fmt: skip

    def _say_what_was_lost(self) -> None:
        for name, count in self.failures.items():
            log.warning("tracker %s: %d calls failed; result.json has every record", name, count)
        if self.dropped:
            log.warning("%d records were not sent to the trackers (queue full)", self.dropped)


def read_ids(run_dir: Path) -> dict[str, str]:
    """The tracker run ids of an earlier session of the run (``tracking.json``); {} when none."""
    try:
        ids = json.loads(rundir.tracking_path(run_dir).read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): str(v) for k, v in ids.items()} if isinstance(ids, dict) else {}


def _waited(deadline: float, stop: threading.Event | None) -> bool:
    return time.monotonic() >= deadline or (stop is not None and stop.is_set())
