"""The champion rule on live traffic on the bus: every settlement the joiner
makes or reads back goes to the referee (``svc_monitor.champion``), and each
decision it reaches is published once on the decisions topic, keyed by model.

A PROMOTE or ROLLBACK enters the registry: the chosen version's event is
published again on the models topic with the decision's labels
(``shared.objective``: ``DECISION_LABEL``, ``DECISION_SEQUENCE_LABEL``,
``DECISION_NEWEST_LABEL``), so that the model server, batch scoring, the
command and this monitor, all reading the registry through
``shared.model_registry``, agree on what serves. The version goes first and
the decision after it: a restart that finds the decision missing decides
again (the settlements are read back in the same order, so the decision is
the same), finds the version already labelled, and publishes the decision
alone.
"""

from __future__ import annotations

from shared.bus.consumer import messages_to_end
from shared.bus.loop import Publisher
from shared.contracts.aistack.v1 import models_pb2, monitoring_pb2, predictions_pb2
from shared.errors import NotFound
from shared.log import get_logger
from shared.model_registry import Registry
from shared.objective import (
    DECISION_LABEL,
    DECISION_NEWEST_LABEL,
    DECISION_SEQUENCE_LABEL,
    decision_sequence,
)
from svc_monitor.champion import Referee
from svc_monitor.metrics import MonitorMetrics
from svc_monitor.settings import MonitorSettings

log = get_logger("svc_monitor")

_CHANGES = (monitoring_pb2.DECISION_KIND_PROMOTE, monitoring_pb2.DECISION_KIND_ROLLBACK)


class Deciding:
    def __init__(
        self,
        settings: MonitorSettings,
        publisher: Publisher,
        models: Registry,
        metrics: MonitorMetrics,
    ) -> None:
        self.settings = settings
        self.referee = Referee(settings.rule(), self._lookup)
        self._publisher = publisher
        self._models = models
        self._metrics = metrics
        self._published: set[str] = set()

    def remember(self, timeout: float) -> int:
        """Read the decisions topic to its end: those it holds are not
        published again. Returns how many it held."""
        decisions = messages_to_end(
            self.settings.kafka,
            self.settings.decisions_topic,
            monitoring_pb2.ChampionDecision,
            timeout,
            reader="svc_monitor.decisions",
        )
        for decision in decisions:
            self.recall(decision)
        return len(decisions)

    def recall(self, decision: monitoring_pb2.ChampionDecision) -> None:
        """A decision published before: not published again."""
        self._published.add(decision.decision_id)

    def add(self, joined: predictions_pb2.PredictionJoined) -> None:
        """One settlement; the decisions it completes published (the caller flushes)."""
        for decision in self.referee.add(joined):
            if decision.kind in _CHANGES:
                self._enter(decision)
            if decision.decision_id in self._published:
                continue
            self._publisher.publish(
                self.settings.decisions_topic,
                decision,
                key=decision.model_name,
                event_id=decision.decision_id,
            )
            self._published.add(decision.decision_id)
            kind = monitoring_pb2.DecisionKind.Name(decision.kind).removeprefix("DECISION_KIND_")
            self._metrics.decisions.labels(decision.model_name, kind.lower()).inc()
            log.info(
                "champion.decided",
                model=decision.model_name,
                kind=kind,
                champion=decision.champion_version,
                challenger=decision.challenger_version,
                chosen=decision.chosen_version,
                pairs=decision.pairs,
                p_value=round(decision.p_value, 6),
                reason=decision.reason,
            )

    def _enter(self, decision: monitoring_pb2.ChampionDecision) -> None:
        """The chosen version again on the models topic, labelled, unless it
        already is, or a later decision already entered."""
        name, version = decision.model_name, decision.chosen_version
        try:
            event = self._models.version(name, version)
        except NotFound:
            log.warning("champion.unknown_version", model=name, version=version)
            return
        if event.labels.get(DECISION_LABEL) == decision.decision_id:
            return
        if max(decision_sequence(e) for e in self._models.versions(name)) >= decision.sequence:
            return
        chosen = models_pb2.ModelReady()
        chosen.CopyFrom(event)
        chosen.labels[DECISION_LABEL] = decision.decision_id
        chosen.labels[DECISION_SEQUENCE_LABEL] = str(decision.sequence)
        chosen.labels[DECISION_NEWEST_LABEL] = decision.newest_version
        self._publisher.publish(self.settings.models_topic, chosen, key=f"{name}/{version}")
        # The follower reads it back too; the referee must not wait for that.
        self._models.add(chosen)

    def _lookup(self, name: str, version: str) -> models_pb2.ModelReady | None:
        try:
            return self._models.version(name, version)
        except NotFound:
            return None
