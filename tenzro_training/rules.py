"""The aggregation-rule value type: which Byzantine-robust rule a task uses, and its one parameter.

A task's ``aggregation`` field names one rule, applied per fragment over the K accepted outer
gradients of a round (SPEC.md "Aggregation rules"). This module holds the *value*: its JSON forms,
its wire code (``RuleKind``, used in round records and the ABI), and the arithmetic that decides
whether the rule fits a quorum K (how many values TrimmedMean drops, how many neighbours Krum
scores). Those two integers are consensus-critical, so they are computed with integer math only.

It is NOT the aggregation itself (no tensors here) and does no I/O.

JSON forms (exactly these; anything else is rejected)::

    "Mean"
    {"TrimmedMean": {"alpha_bps": N}}     0 <= N <= 10000 (basis points trimmed from EACH end)
    "CoordinateMedian"
    {"Krum": {"f": N}}                    N >= 0 (Byzantine inputs tolerated)
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from tenzro_training.errors import AggregationError, SpecError

__all__ = ["RuleKind", "AggregationRule", "MAX_ALPHA_BPS", "MAX_JSON_SAFE_INT"]

MAX_ALPHA_BPS = 10_000
"""alpha_bps is in basis points of K; 10000 would trim everything, so no K accepts it."""

MAX_JSON_SAFE_INT = 2**53 - 1
"""RFC 8785 serializes numbers as IEEE-754 doubles: larger integers would not round-trip."""

_PATH = "aggregation"


class RuleKind(enum.IntEnum):
    """The rule's wire code, as written into round records and ABI-encoded receipts."""

    MEAN = 0
    TRIMMED_MEAN = 1
    COORDINATE_MEDIAN = 2
    KRUM = 3

    @property
    def spec_name(self) -> str:
        """The rule's name in the task spec JSON ("Mean", "TrimmedMean", ...)."""
        return _SPEC_NAMES[self]


_SPEC_NAMES: dict[RuleKind, str] = {
    RuleKind.MEAN: "Mean",
    RuleKind.TRIMMED_MEAN: "TrimmedMean",
    RuleKind.COORDINATE_MEDIAN: "CoordinateMedian",
    RuleKind.KRUM: "Krum",
}
# The one parameter of each parameterised rule: its JSON key.
_PARAM_NAMES: dict[RuleKind, str] = {RuleKind.TRIMMED_MEAN: "alpha_bps", RuleKind.KRUM: "f"}
_KINDS_BY_NAME: dict[str, RuleKind] = {name: kind for kind, name in _SPEC_NAMES.items()}


def _is_plain_int(value: object) -> bool:
    # bool is a subclass of int in Python, but true/false are not numbers in JSON.
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True, slots=True)
class AggregationRule:
    """One aggregation rule and its parameter; construct it with the classmethods below."""

    kind: RuleKind
    """Which rule (its integer value is the wire code)."""
    param: int = 0
    """alpha_bps (0..10000) for TRIMMED_MEAN, f (>= 0) for KRUM, 0 for the others."""

    def __post_init__(self) -> None:
        # Accept a bare wire code (decoding a round record) but store the enum member.
        if isinstance(self.kind, bool) or not isinstance(self.kind, int):
            raise AggregationError(f"rule kind must be a RuleKind, got {self.kind!r}")
        try:
            kind = RuleKind(self.kind)
        except ValueError:
            raise AggregationError(f"unknown aggregation rule code {int(self.kind)}") from None
        object.__setattr__(self, "kind", kind)
        problem = _param_problem(kind, self.param)
        if problem is not None:
            raise AggregationError(f"{kind.spec_name}: {problem}")

    # --- convenience constructors -------------------------------------------------------------

    @classmethod
    def mean(cls) -> AggregationRule:
        return cls(RuleKind.MEAN)

    @classmethod
    def trimmed_mean(cls, alpha_bps: int) -> AggregationRule:
        return cls(RuleKind.TRIMMED_MEAN, alpha_bps)

    @classmethod
    def coordinate_median(cls) -> AggregationRule:
        return cls(RuleKind.COORDINATE_MEDIAN)

    @classmethod
    def krum(cls, f: int) -> AggregationRule:
        return cls(RuleKind.KRUM, f)

    # --- JSON boundary ------------------------------------------------------------------------

    @classmethod
    def from_spec(cls, value: object, quorum: int | None = None) -> AggregationRule:
        """Parse the spec's ``aggregation`` JSON value; if ``quorum`` is given, check it fits K.

        Raises SpecError whose ``path`` starts with "aggregation" and names the offending part,
        e.g. "aggregation.TrimmedMean.alpha_bps".
        """
        if isinstance(value, str):
            kind = _KINDS_BY_NAME.get(value)
            if kind is None:
                raise SpecError(_PATH, f"unknown aggregation rule {value!r}")
            if kind in _PARAM_NAMES:
                raise SpecError(
                    _PATH,
                    f"{value} takes a parameter: write "
                    f'{{"{value}": {{"{_PARAM_NAMES[kind]}": N}}}}',
                )
            rule = cls(kind)
        elif isinstance(value, dict):
            rule = cls._from_spec_object(value)
        else:
            raise SpecError(_PATH, f"must be a rule name or a one-key object, got {_type(value)}")
        if quorum is not None:
            try:
                rule.validate_for_quorum(quorum)
            except AggregationError as exc:
                raise SpecError(_PATH, str(exc)) from None
        return rule

    @classmethod
    def _from_spec_object(cls, value: dict[object, object]) -> AggregationRule:
        if len(value) != 1:
            got = f"{len(value)} keys"
            raise SpecError(_PATH, f"a parameterised rule is a one-key object, got {got}")
        ((name, body),) = value.items()
        if not isinstance(name, str):
            raise SpecError(_PATH, "rule name must be a string")
        kind = _KINDS_BY_NAME.get(name)
        if kind is None:
            raise SpecError(_PATH, f"unknown aggregation rule {name!r}")
        if kind not in _PARAM_NAMES:
            # Exactly one JSON form per rule keeps the canonical bytes (and spec hash) unique.
            raise SpecError(_PATH, f'{name} takes no parameter: write "{name}"')
        path = f"{_PATH}.{name}"
        param_name = _PARAM_NAMES[kind]
        if not isinstance(body, dict):
            raise SpecError(path, f'must be an object {{"{param_name}": N}}, got {_type(body)}')
        for key in body:
            if key != param_name:
                raise SpecError(f"{path}.{key}", "unknown field")
        if param_name not in body:
            raise SpecError(f"{path}.{param_name}", "missing field")
        param = body[param_name]
        param_path = f"{path}.{param_name}"
        if not _is_plain_int(param):
            raise SpecError(param_path, f"must be an integer, got {_type(param)}")
        problem = _param_problem(kind, param)
        if problem is not None:
            raise SpecError(param_path, problem)
        return cls(kind, param)

    def to_spec(self) -> str | dict[str, dict[str, int]]:
        """The rule's JSON form, as ``from_spec`` accepts it (a fresh object each call)."""
        name = self.kind.spec_name
        param_name = _PARAM_NAMES.get(self.kind)
        if param_name is None:
            return name
        return {name: {param_name: self.param}}

    # --- arithmetic against a quorum ------------------------------------------------------------

    def trimmed_per_side(self, k: int) -> int:
        """How many values TrimmedMean drops from EACH end of K sorted values (0 for others)."""
        _check_k(k)
        if self.kind is not RuleKind.TRIMMED_MEAN:
            return 0
        # Integer floor division: Solidity and Rust reproduce it exactly, floats might not.
        return (k * self.param) // MAX_ALPHA_BPS

    def neighbours(self, k: int) -> int:
        """How many nearest other inputs Krum sums distances to (K - f - 2); 0 for other rules.

        Raises AggregationError when Krum does not fit K (the count would be < 1).
        """
        _check_k(k)
        if self.kind is not RuleKind.KRUM:
            return 0
        self.validate_for_quorum(k)
        return k - self.param - 2

    def validate_for_quorum(self, k: int) -> None:
        """Raise AggregationError unless the rule is well defined over K inputs."""
        _check_k(k)
        if self.kind is RuleKind.TRIMMED_MEAN:
            t = self.trimmed_per_side(k)
            if k - 2 * t < 1:
                raise AggregationError(
                    f"TrimmedMean alpha_bps={self.param} trims {t} per side of K={k}, "
                    f"leaving {k - 2 * t} values (need K - 2t >= 1)"
                )
        elif self.kind is RuleKind.KRUM:
            if k <= 2 * self.param + 2:
                raise AggregationError(
                    f"Krum f={self.param} needs K > 2f + 2 = {2 * self.param + 2}, got K={k}"
                )

    def validate_for_accepted_counts(self, quorum: int, trainer_count: int) -> None:
        """Raise AggregationError unless the rule is defined for every accepted count K..M.

        A round aggregates however many submissions it accepted, anywhere from the quorum to
        trainer_count once stragglers arrive within the grace window, so a rule valid only at K
        can make a round unfinalizable (TrimmedMean alpha_bps 5000 over 4 inputs trims all
        four). Two counts decide it: Krum's condition only gets easier as K grows, and
        TrimmedMean fails some count iff alpha_bps >= 5000 (every even count fails then, and of
        K and K + 1 one is even) or it fails K itself.
        """
        _check_k(quorum)
        _check_k(trainer_count)
        for k in range(quorum, min(trainer_count, quorum + 1) + 1):
            self.validate_for_quorum(k)

    def byzantine_tolerance(self, k: int) -> int:
        """How many of K accepted inputs may be arbitrary with the aggregate still within the
        honest ones' range (per coordinate for the coordinate-wise rules, per fragment for
        Krum; docs/aggregation.md "What each rule tolerates"): Mean 0, TrimmedMean the values
        it trims per side, CoordinateMedian fewer than half, Krum f. Never smaller for a larger
        K, so a task's weakest round is one that closes at its quorum.

        Raises AggregationError when the rule does not fit K."""
        self.validate_for_quorum(k)
        if self.kind is RuleKind.TRIMMED_MEAN:
            return self.trimmed_per_side(k)
        if self.kind is RuleKind.COORDINATE_MEDIAN:
            return (k - 1) // 2
        if self.kind is RuleKind.KRUM:
            return self.param
        return 0

    def describe_no_tolerance(self, quorum: int) -> str | None:
        """Why a round that closes at ``quorum`` accepted payloads tolerates no Byzantine
        trainer under this rule, with what would change that; None when it tolerates one.
        For the sponsor, before posting (Byzantine probe, 2026-11-27: TrimmedMean alpha_bps 2000
        at quorum 4 trimmed nothing in any round, and one attacker took the model's loss from
        0.58 to 200)."""
        if self.byzantine_tolerance(quorum) > 0:
            return None
        if self.kind is RuleKind.MEAN:
            return ("aggregation Mean tolerates no Byzantine trainer: one accepted payload moves every weight; use it "
                    "only with trusted trainers, or on nodes whose max_gradient_abs is near real outer gradients")
        if self.kind is RuleKind.TRIMMED_MEAN:
            least = -(-MAX_ALPHA_BPS // quorum)  # ceil: floor(quorum x alpha / 10000) >= 1
            fix = (f"alpha_bps >= {least} trims one per side there" if quorum > 2
                   else "a quorum of 3 or more leaves room to trim one per side")
            return (f"aggregation TrimmedMean alpha_bps={self.param} trims nothing from a round that closes at the "
                    f"quorum, {quorum} accepted payloads, which is then a plain Mean; {fix}")
        if self.kind is RuleKind.KRUM:
            return ("aggregation Krum f=0 tolerates no Byzantine trainer (it may select any payload); f=1 tolerates "
                    "one and needs a quorum of 5 or more")
        return (f"aggregation CoordinateMedian over {quorum} accepted payload(s) (the quorum) tolerates no "
                "Byzantine trainer; a quorum of 3 or more tolerates one")

    def is_valid_for_quorum(self, k: int) -> bool:
        """Predicate form of ``validate_for_quorum``."""
        try:
            self.validate_for_quorum(k)
        except AggregationError:
            return False
        return True


def _param_problem(kind: RuleKind, param: object) -> str | None:
    """Why ``param`` is not a valid parameter for ``kind`` (None when it is)."""
    if isinstance(param, bool) or not isinstance(param, int):
        return f"parameter must be an integer, got {_type(param)}"
    if kind is RuleKind.TRIMMED_MEAN:
        if not 0 <= param <= MAX_ALPHA_BPS:
            return f"alpha_bps must be in 0..{MAX_ALPHA_BPS}, got {param}"
    elif kind is RuleKind.KRUM:
        if not 0 <= param <= MAX_JSON_SAFE_INT:
            return f"f must be in 0..{MAX_JSON_SAFE_INT}, got {param}"
    elif param != 0:
        return f"takes no parameter, got {param}"
    return None


def _check_k(k: object) -> None:
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise AggregationError(f"quorum K must be an integer >= 1, got {k!r}")


def _type(value: object) -> str:
    """A JSON-ish name for a value's type, for error messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return f"number {value!r}"
    if isinstance(value, str):
        return "string"
    if isinstance(value, (list, tuple)):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__
