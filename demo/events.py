"""Step 2 of ``aistack demo``: raw events in (some malformed, some repeated),
cleaned, dead-lettered and windowed, on whatever state earlier runs left.

Each run sends readings of the past (an hour, ending twenty minutes ago), which
svc_transform would drop as late after an earlier run left its watermark
ahead of them: such a run begins a fresh event-time epoch first
(``compose.transform_epoch``) and says so. While it waits it says what for,
and on a timeout why nothing came (rows dropped as late, a consumer that
does not move).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from compose.stack import ServiceStack
from demo.console import Console, Summary
from demo.loop import FIRST_SPAN_SECONDS, SHIFT_SPAN_SECONDS
from demo.topic_counts import NewRecords
from shared.metrics import scraped_sum
from shared.settings import KafkaSettings

if TYPE_CHECKING:
    from aistack.report import Flow
    from demo.run import DemoOptions

#: How the demo's raw events look: share of malformed and of repeated records.
BAD_FRACTION = 0.04
DUPLICATE_FRACTION = 0.04
#: How long the step waits for its events to be cleaned and windowed.
FLOW_TIMEOUT_SECONDS = 240.0


@dataclass
class EventsStep:
    stack: ServiceStack
    console: Console
    summary: Summary
    kafka: KafkaSettings
    #: ``wait(what, probe, timeout, show, diagnose)``: the demo's wait, which
    #: also watches the services.
    wait: Callable[..., Any]

    def run(self, args: DemoOptions) -> Flow:
        """Publish, wait for the flow to settle; its counts, for the report."""
        from aistack.report import Flow
        from loadgen.plan import generate
        from loadgen.publish import send
        from shared.bus.producer import BusProducer
        from shared.bus.topics import EVENTS_CLEAN, EVENTS_DLQ, EVENTS_RAW, FEATURES_WINDOWS

        self.console.step(
            2,
            f"publishing {args.sensor_events} sensor readings and {args.weblog_events} web log "
            f"lines ({BAD_FRACTION:.0%} malformed, {DUPLICATE_FRACTION:.0%} repeated)",
        )
        # Ending SHIFT_SPAN_SECONDS ago: step 7's shifted readings come after.
        first_end = datetime.now(UTC) - timedelta(seconds=SHIFT_SPAN_SECONDS)
        self._fresh_epoch_if_late(first_end - timedelta(seconds=FIRST_SPAN_SECONDS))
        topics = (EVENTS_RAW, EVENTS_CLEAN, EVENTS_DLQ, FEATURES_WINDOWS)
        # From the end as of now: a stack that ran before keeps its topics.
        counter = NewRecords(self.kafka, topics, reasons_of=EVENTS_DLQ)
        producer = BusProducer(
            self.kafka, source="aistack-demo", config={"message.max.bytes": 8 * 1024 * 1024}
        )
        sent = Counter[str]()
        # Fresh events each run: svc_ingest's dedup table remembers earlier
        # runs' event ids (and drops them, as it should).
        run_seed = int(time.time())
        for kind, count, seed in (
            ("sensors", args.sensor_events, run_seed),
            ("weblogs", args.weblog_events, run_seed + 1),
        ):
            records = generate(
                kind,  # type: ignore[arg-type]
                count,
                bad_fraction=BAD_FRACTION,
                duplicate_fraction=DUPLICATE_FRACTION,
                seed=seed,
                now=first_end,
                span_seconds=FIRST_SPAN_SECONDS,
            )
            outcome = send(records, producer, EVENTS_RAW, rate=0)
            sent.update(good=outcome.good, bad=outcome.bad, duplicate=outcome.duplicate)
        producer.close()
        self.console.line(
            f"  sent {sum(sent.values())} records: {sent['good']} good, {sent['bad']} "
            f"malformed, {sent['duplicate']} repeated"
        )
        last: list[tuple[int, ...]] = []
        late_before = self._late_rows()

        def flowing() -> bool | None:
            counts = counter.update()
            last.append(tuple(counts[t] for t in topics))
            settled = len(last) >= 6 and len(set(last[-6:])) == 1
            expected_clean = sent["good"] * 0.95
            return (
                True
                if settled and counts[FEATURES_WINDOWS] and (counts[EVENTS_CLEAN] >= expected_clean)
                else None
            )

        def show() -> str:
            counts = counter.counts
            return (
                f"raw {counts[EVENTS_RAW]:>6}   clean {counts[EVENTS_CLEAN]:>6}   "
                f"dead letters {counts[EVENTS_DLQ]:>5}   "
                f"feature windows {counts[FEATURES_WINDOWS]:>5}"
            )

        def diagnose() -> str:
            return self._why_not_flowing(counter.counts, sent["good"], late_before, last)

        try:
            self.wait(
                "events to be cleaned and aggregated",
                flowing,
                FLOW_TIMEOUT_SECONDS,
                show,
                diagnose,
            )
        finally:
            counter.close()
        counts, reasons = counter.counts, counter.reasons
        self.summary.add("events published", f"{sum(sent.values())} ({sent['good']} good)")
        self.summary.add("clean events", counts[EVENTS_CLEAN])
        top = ", ".join(f"{r} {n}" for r, n in reasons.most_common(6))
        self.summary.add("dead letters", f"{sum(reasons.values())}: {top}")
        # Repeated records are dropped by svc_ingest's dedup table, not
        # dead-lettered. Committed records only: the clean topic is written in
        # transactions, whose markers take offsets too.
        dropped = sent["good"] + sent["duplicate"] - counts[EVENTS_CLEAN]
        self.summary.add("repeated records not passed on", f"{dropped} of {sent['duplicate']} sent")
        self.summary.add("feature windows", counts[FEATURES_WINDOWS])
        return Flow(
            raw=counts[EVENTS_RAW],
            clean=counts[EVENTS_CLEAN],
            dead_letters=dict(reasons),
            windows=counts[FEATURES_WINDOWS],
            published=sum(sent.values()),
        )

    def _fresh_epoch_if_late(self, first_event: datetime) -> None:
        from compose.transform_epoch import begin_fresh_epoch, needs_fresh_epoch

        watermark = needs_fresh_epoch(self.stack, first_event)
        if watermark is None:
            return
        self.console.line(
            f"  svc_transform's watermark ({watermark:%H:%M:%S} UTC, left by an earlier run) is "
            f"past this run's first readings ({first_event:%H:%M:%S}): they would be dropped "
            "as late, so svc_transform starts a fresh event-time epoch from the clean topic's end"
        )
        epoch = begin_fresh_epoch(self.stack, self.kafka)
        self.console.line(f"  the earlier epoch's checkpoint and offline store: {epoch.archive}")
        self.summary.add("fresh event-time epoch", str(epoch.archive))

    def _late_rows(self) -> float:
        return scraped_sum(
            self.stack.settings.transform_metrics_port, "aistack_transform_late_rows_dropped_total"
        )

    def _why_not_flowing(
        self, counts: dict[str, int], good: int, late_before: float, seen: list[tuple[int, ...]]
    ) -> str:
        from shared.bus.topics import EVENTS_CLEAN, FEATURES_WINDOWS

        reasons = []
        late = self._late_rows() - late_before
        if late:
            reasons.append(
                f"svc_transform dropped {late:.0f} rows as late (older than its watermark; "
                "its log says late.dropped with the watermark)"
            )
        if counts[EVENTS_CLEAN] < good * 0.95:
            lag = scraped_sum(self.stack.settings.ingest_metrics_port, "aistack_consumer_lag")
            moved = len({row[0] for row in seen[-30:]}) > 1
            reasons.append(
                f"svc_ingest wrote {counts[EVENTS_CLEAN]} of ~{good} clean events "
                f"(its consumer lag {lag:.0f}; the raw count "
                f"{'is still moving' if moved else 'has not moved for 30 s'})"
            )
        if not counts[FEATURES_WINDOWS]:
            lag = scraped_sum(self.stack.settings.transform_metrics_port, "aistack_consumer_lag")
            reasons.append(f"no window came out (svc_transform's consumer lag {lag:.0f})")
        return "; ".join(reasons) or "the counts did not settle"
