"""The champion rule on live traffic: each model's settled predictions in,
its decisions out (``ChampionDecision``). Pure: no bus.

Settlements come in the order of the joined topic (one partition per model:
it is keyed by model name), so that a replay of the topic gives the same
decisions, numbers and ids included.

- A request served by the champion (role CHAMPION) and by a challenger in its
  shadow (role SHADOW), both joined with their truth, is a pair: the two
  |errors| on the same traffic.
- A challenger is judged against the champion each time its pairs reach a
  multiple of ``min_pairs``: the one-sided Wilcoxon signed-rank test on the
  differences |challenger| - |champion|. Significant at ``alpha`` with a
  lower mean: a challenger newer than the champion is promoted (PROMOTE); an
  older one (the previous champion) takes over only from a degraded champion
  (ROLLBACK). Otherwise the champion stays (KEEP).
- The champion's live error over its latest ``min_pairs`` joined predictions,
  judged at each multiple of ``min_pairs``, past its validation value by the
  margin (live > validation x (1 + margin)) is reported once (DEGRADED), and
  its older challengers are judged at once for a rollback. Judged only where
  the version's objective measures what the live error does (``val_mae``
  against "mae", ``val_error`` against "error", minimized).
- A reign is one champion's time: every decision that changes the champion
  starts a new one, with fresh pairs; so does a change the validation rule
  made (the first champion prediction of another version). Pairs still in
  flight for a champion a decision displaced are not counted.
"""

from __future__ import annotations

import hashlib
import math
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from shared.contracts.aistack.v1 import common_pb2, models_pb2
from shared.contracts.aistack.v1.monitoring_pb2 import (
    DECISION_KIND_DEGRADED,
    DECISION_KIND_KEEP,
    DECISION_KIND_PROMOTE,
    DECISION_KIND_ROLLBACK,
    ChampionDecision,
    DecisionKind,
)
from shared.contracts.aistack.v1.predictions_pb2 import (
    JOIN_OUTCOME_JOINED,
    PREDICTION_ROLE_CHAMPION,
    PREDICTION_ROLE_SHADOW,
    PredictionJoined,
)

#: Requests whose champion's or shadows' settlement waits for the other side;
#: the oldest are dropped past this (a shadow sampled out never arrives).
PENDING_REQUESTS = 20_000

#: ``(model, version)`` -> its registry event (None when unknown).
Lookup = Callable[[str, str], models_pb2.ModelReady | None]


@dataclass(frozen=True)
class Rule:
    min_pairs: int
    alpha: float
    margin: float


def wilcoxon_less(differences: np.ndarray) -> float:
    """The one-sided p-value that the differences are centred below zero:
    Wilcoxon's signed-rank test, zeros dropped, average ranks for ties, the
    normal approximation with the tie and continuity corrections (the
    counts it is judged at are in the hundreds). 1.0 when all are zero."""
    nonzero = differences[differences != 0]
    n = len(nonzero)
    if n == 0:
        return 1.0
    magnitudes = np.abs(nonzero)
    order = np.argsort(magnitudes, kind="stable")
    ranks = np.empty(n)
    ranks[order] = np.arange(1, n + 1)
    _, inverse, counts = np.unique(magnitudes, return_inverse=True, return_counts=True)
    sums = np.bincount(inverse, weights=ranks)
    ranks = (sums / counts)[inverse]
    positive = float(ranks[nonzero > 0].sum())
    mean = n * (n + 1) / 4
    variance = n * (n + 1) * (2 * n + 1) / 24 - float((counts**3 - counts).sum()) / 48
    if variance <= 0:
        return 1.0
    z = (positive - mean + 0.5) / math.sqrt(variance)
    return 0.5 * math.erfc(-z / math.sqrt(2))


@dataclass
class _Request:
    champion: tuple[str, float] | None = None
    shadows: dict[str, float] = field(default_factory=dict)


@dataclass
class _Model:
    champion: str = ""
    displaced: str = ""
    sequence: int = 0
    newest: int = 0
    degraded: bool = False
    served: int = 0
    recent: deque[float] = field(default_factory=deque)
    # challenger version -> (|champion error|, |challenger error|) per request
    pairs: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    requests: OrderedDict[str, _Request] = field(default_factory=OrderedDict)


class Referee:
    """The rule of the module docstring over every model's settlements;
    ``lookup`` finds a version's registry event (its validation value)."""

    def __init__(self, rule: Rule, lookup: Lookup) -> None:
        if rule.min_pairs < 2:
            raise ValueError(f"a paired test needs at least 2 pairs, not {rule.min_pairs}")
        self.rule = rule
        self._lookup = lookup
        self._models: dict[str, _Model] = {}

    def add(self, joined: PredictionJoined) -> list[ChampionDecision]:
        """One settlement, in the joined topic's order; the decisions it completes."""
        if joined.outcome != JOIN_OUTCOME_JOINED or not joined.model_version.isdigit():
            return []
        if joined.role not in (PREDICTION_ROLE_CHAMPION, PREDICTION_ROLE_SHADOW):
            return []
        model = self._models.setdefault(joined.model_name, _Model())
        version = joined.model_version
        model.newest = max(model.newest, int(version))
        error = abs(joined.error)
        if joined.role == PREDICTION_ROLE_CHAMPION:
            if version != model.champion:
                if version == model.displaced:
                    return []  # served before the decision that displaced it
                self._reign(model, version)  # the validation rule changed it
            decisions = self._served(joined, model, error)
            request = self._request(model, joined.request_id)
            request.champion = (version, error)
            for shadow, shadow_error in list(request.shadows.items()):
                if model.champion != version:
                    break  # a decision just ended this reign
                decisions += self._pair(joined, model, shadow, error, shadow_error)
            return decisions
        request = self._request(model, joined.request_id)
        request.shadows[version] = error
        if request.champion is None or request.champion[0] != model.champion:
            return []
        return self._pair(joined, model, version, request.champion[1], error)

    # ---- the judgements ----

    def _served(
        self, joined: PredictionJoined, model: _Model, error: float
    ) -> list[ChampionDecision]:
        model.served += 1
        model.recent.append(error)
        if model.served % self.rule.min_pairs or model.degraded:
            return []
        live = float(np.mean(model.recent))
        validation = self._validation(joined.model_name, model.champion, joined.metric)
        if validation is None or live <= validation * (1 + self.rule.margin):
            return []
        model.degraded = True
        decision = self._decision(
            joined,
            model,
            DECISION_KIND_DEGRADED,
            challenger="",
            pairs=len(model.recent),
            champion_error=live,
            validation=validation,
            reason=(
                f"the champion's live {joined.metric} {live:.4g} over its latest "
                f"{len(model.recent)} predictions passed its validation value "
                f"{validation:.4g} by more than {self.rule.margin:.0%}"
            ),
        )
        decisions = [decision]
        for challenger in sorted(model.pairs, key=int, reverse=True):
            if int(challenger) < int(model.champion) and len(model.pairs[challenger]) >= (
                self.rule.min_pairs
            ):
                decisions += self._judge(joined, model, challenger)
                if model.champion != decision.champion_version:
                    break
        return decisions

    def _pair(
        self,
        joined: PredictionJoined,
        model: _Model,
        challenger: str,
        champion_error: float,
        challenger_error: float,
    ) -> list[ChampionDecision]:
        pairs = model.pairs.setdefault(challenger, [])
        pairs.append((champion_error, challenger_error))
        if len(pairs) % self.rule.min_pairs:
            return []
        return self._judge(joined, model, challenger)

    def _judge(
        self, joined: PredictionJoined, model: _Model, challenger: str
    ) -> list[ChampionDecision]:
        pairs = np.asarray(model.pairs[challenger])
        champion_error, challenger_error = (float(v) for v in pairs.mean(axis=0))
        p_value = wilcoxon_less(pairs[:, 1] - pairs[:, 0])
        better = challenger_error < champion_error and p_value < self.rule.alpha
        newer = int(challenger) > int(model.champion)
        judged = f"on {len(pairs)} requests both served"
        figures = (
            f"{challenger_error:.4g} against {champion_error:.4g}, p = {p_value:.3g} "
            f"(alpha {self.rule.alpha:g})"
        )
        if better and newer:
            kind, reason = DECISION_KIND_PROMOTE, f"the challenger beat the champion {judged}"
        elif better and model.degraded:
            kind = DECISION_KIND_ROLLBACK
            reason = f"the degraded champion gave way to the version before it, better {judged}"
        elif better:
            kind = DECISION_KIND_KEEP
            reason = (
                f"an earlier version was better {judged}, but the champion has not "
                "degraded past its validation value"
            )
        else:
            kind, reason = DECISION_KIND_KEEP, f"the challenger did not beat the champion {judged}"
        decision = self._decision(
            joined,
            model,
            kind,
            challenger=challenger,
            pairs=len(pairs),
            champion_error=champion_error,
            challenger_error=challenger_error,
            p_value=p_value,
            reason=f"{reason}: {figures}",
        )
        if kind in (DECISION_KIND_PROMOTE, DECISION_KIND_ROLLBACK):
            model.sequence += 1
            self._reign(model, challenger, displaced=model.champion)
        return [decision]

    # ---- bookkeeping ----

    def _reign(self, model: _Model, champion: str, displaced: str = "") -> None:
        model.champion = champion
        model.displaced = displaced
        model.degraded = False
        model.served = 0
        model.recent = deque(maxlen=self.rule.min_pairs)
        model.pairs = {}
        model.requests.clear()

    def _request(self, model: _Model, request_id: str) -> _Request:
        request = model.requests.get(request_id)
        if request is None:
            request = model.requests[request_id] = _Request()
            while len(model.requests) > PENDING_REQUESTS:
                model.requests.popitem(last=False)
        return request

    def _validation(self, name: str, version: str, metric: str) -> float | None:
        """The version's validation value of what ``metric`` measures; None
        when its objective measures something else (or is unknown)."""
        event = self._lookup(name, version)
        if event is None:
            return None
        objective = event.objective
        if (
            objective.direction == common_pb2.DIRECTION_MAXIMIZE
            or objective.metric.removeprefix("val_") != metric
        ):
            return None
        value = event.metrics.get(objective.metric)
        return None if value is None or math.isnan(value) else float(value)

    def _decision(
        self,
        joined: PredictionJoined,
        model: _Model,
        kind: DecisionKind,
        *,
        challenger: str,
        pairs: int,
        champion_error: float,
        challenger_error: float = 0.0,
        p_value: float = 1.0,
        validation: float | None = None,
        reason: str,
    ) -> ChampionDecision:
        chosen = (
            challenger
            if kind in (DECISION_KIND_PROMOTE, DECISION_KIND_ROLLBACK)
            else model.champion
        )
        sequence = model.sequence + 1 if chosen != model.champion else 0
        name = joined.model_name
        identity = f"{name}\0{kind}\0{model.champion}\0{challenger}\0{pairs}\0{model.sequence}"
        decision = ChampionDecision(
            decision_id=hashlib.sha256(identity.encode()).hexdigest()[:32],
            model_name=name,
            kind=kind,
            champion_version=model.champion,
            challenger_version=challenger,
            chosen_version=chosen,
            metric=joined.metric,
            pairs=pairs,
            champion_error=champion_error,
            challenger_error=challenger_error,
            p_value=p_value,
            alpha=self.rule.alpha,
            min_pairs=self.rule.min_pairs,
            margin=self.rule.margin,
            reason=reason,
            sequence=sequence,
            newest_version=str(model.newest),
        )
        if validation is None and model.degraded:
            validation = self._validation(name, model.champion, joined.metric)
        if validation is not None:
            decision.validation_value = validation
        decision.decided_time.CopyFrom(joined.truth_time)
        return decision
