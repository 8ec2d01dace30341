"""Metrics: TensorBoard scalars per role, throughput meters, and the learner's ``result.json``.

Each process writes its own event files under ``<run dir>/tb/<role>`` (``actor_3``, ``eval``,
``learner``, ``replay``, ``params``; ``rundir.tensorboard_dir``), so many actors never share a
file. Metric names are stable and namespaced (``actor/episode_return``, ``learner/updates_per_s``,
``replay/size``; docs/monitoring.md lists them). The writer uses tensorboard's event-file writer
directly, so roles that do not need torch (replay, params) do not import it.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.summary.writer.event_file_writer import EventFileWriter


class MetricsWriter:
    """Scalars to TensorBoard event files; ``close`` flushes."""

    def __init__(self, logdir: str | Path, flush_secs: float = 5.0) -> None:
        Path(logdir).mkdir(parents=True, exist_ok=True)
        self._writer = EventFileWriter(str(logdir), flush_secs=flush_secs)

    def scalar(self, name: str, value: float, step: int) -> None:
        summary = summary_pb2.Summary(
            value=[summary_pb2.Summary.Value(tag=name, simple_value=float(value))]
        )
        self._writer.add_event(
            event_pb2.Event(wall_time=time.time(), step=int(step), summary=summary)
        )

    def scalars(self, values: dict[str, float], step: int) -> None:
        for name, value in values.items():
            self.scalar(name, value, step)

    def text(self, name: str, text: str, step: int = 0) -> None:
        """A text summary (the resolved config, as CleanRL shows it)."""
        from tensorboard.compat.proto import tensor_pb2, tensor_shape_pb2

        tensor = tensor_pb2.TensorProto(
            dtype=7,  # DT_STRING
            string_val=[text.encode()],
            tensor_shape=tensor_shape_pb2.TensorShapeProto(
                dim=[tensor_shape_pb2.TensorShapeProto.Dim(size=1)]
            ),
        )
        metadata = summary_pb2.SummaryMetadata(
            plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="text")
        )
        summary = summary_pb2.Summary(
            value=[summary_pb2.Summary.Value(tag=name, metadata=metadata, tensor=tensor)]
        )
        self._writer.add_event(event_pb2.Event(wall_time=time.time(), step=step, summary=summary))

    def flush(self) -> None:
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


class RateMeter:
    """Counts events and reports their rate per second since the previous ``rate()`` call."""

    def __init__(self) -> None:
        self.total = 0
        self._last_total = 0
        self._last_time = time.monotonic()

    def add(self, n: int = 1) -> None:
        self.total += n

    def rate(self) -> float:
        now = time.monotonic()
        elapsed = max(now - self._last_time, 1e-9)
        value = (self.total - self._last_total) / elapsed
        self._last_total, self._last_time = self.total, now
        return value


EARLY_INTERVAL_S = 0.1  # the report interval at a process's start ...
EARLY_GROWTH = 1 / 20  # ... growing by this share of the time since, up to the configured one


def early_interval(interval_s: float, elapsed_s: float) -> float:
    """The report interval ``elapsed_s`` into a run (or an actor's life): ``interval_s``, or less
    early on (0.1 s at the start, 1.1 s after 20 s, 3.1 s after a minute), so that a run solved
    in seconds still leaves a curve of records and returns."""
    return min(interval_s, EARLY_INTERVAL_S + EARLY_GROWTH * max(elapsed_s, 0.0))


def append_result(path: str | Path, record: dict[str, float | int | bool | str | None]) -> None:
    """Append one JSON object as a line (RLlib's ``result.json`` convention)."""
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")
