"""Resident state, one concept: the inputs an executor feeds from its own outputs (a decode
step's KV cache), kept in the backend's memory between runs.

Where each part lives (docs/architecture.md, "Resident state", walks one from
``create_executor`` to the next step):

* :mod:`.plan`: the pairs, checked once at ``create_executor`` (:func:`plan_state`), and
  whether a pair may run in place (:func:`in_place_refusal`): a :class:`StatePlan`;
* :mod:`gear_runtime.backends.state`: the buffers, in the backend layer because every backend
  builds on them: the contract a session's state implements (:class:`SessionState`, declared
  as ``BackendSession.state``), :class:`HostState` (host memory), :class:`DeviceStateBase`
  and the :class:`DeviceBuffer` it hands out (device memory), :func:`locks_in_order` (a
  handoff's locks). The swap after a run is the session's ``commit_state``, the rows a gear
  binds its ``bind_rows``;
* :mod:`.resident`: the executor's face over them (:class:`ResidentState`): ``ex.state``,
  ``set_state``, ``reset_state``, ``copy_state_rows``, ``first_row=``, and the state's part
  of a run.
"""

from gear_runtime.backends.state import (
    DeviceBuffer,
    DeviceStateBase,
    HostState,
    SessionState,
    locks_in_order,
)
from gear_runtime.runtime.state.plan import (
    IN_PLACE_KERNELS,
    StatePair,
    StatePlan,
    in_place_refusal,
    plan_state,
)
from gear_runtime.runtime.state.resident import ResidentState, StateView

__all__ = ["IN_PLACE_KERNELS", "DeviceBuffer", "DeviceStateBase", "HostState", "ResidentState",
           "SessionState", "StatePair", "StatePlan", "StateView", "in_place_refusal",
           "locks_in_order", "plan_state"]
