"""FleetUnavailable: the fleet gate's Redis cannot be reached and the gate fails closed."""

from __future__ import annotations

from .._errors import Busy

__all__ = ["FleetUnavailable"]


class FleetUnavailable(Busy):
    """Raised when a fleet gate fails closed because its Redis cannot be reached.

    A :class:`anygate.Busy`, so code that already turns ``Busy`` into HTTP 429 does the
    right thing; catch this subclass to tell an outage from a full fleet.

    Attributes:
        fleet: the fleet gate's name.
        cause: why Redis is unreachable (the last error, e.g. a refused connection or a
            call that passed its deadline).
    """

    def __init__(
        self, *, fleet: str, cause: str, capacity: float, in_flight: int, waited: float
    ) -> None:
        super().__init__(gate=fleet, capacity=capacity, in_flight=in_flight, waited=waited)
        self.fleet = fleet
        self.cause = cause
        # Re-initialise the message only (args), keeping Busy's attributes set above.
        BaseException.__init__(
            self,
            f"fleet gate {fleet!r} is unavailable ({cause}); failing closed with "
            f"{in_flight} calls still in flight here; retry shortly",
        )

    def __reduce__(self) -> tuple[object, ...]:
        return (
            _rebuild,
            (self.fleet, self.cause, self.capacity, self.in_flight, self.waited),
        )


def _rebuild(
    fleet: str, cause: str, capacity: float, in_flight: int, waited: float
) -> FleetUnavailable:
    return FleetUnavailable(
        fleet=fleet, cause=cause, capacity=capacity, in_flight=in_flight, waited=waited
    )
