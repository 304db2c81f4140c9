"""An executor's resident state at run time: the face the executor shows of the session's
buffers (``ex.state``, ``set_state``, ``reset_state``, ``copy_state_rows``, ``first_row=``)
and the state's part of a run (the rows bound, the swap after success, the memory an
``out=`` array must not share).

The executor owns the locking (every method here runs inside one of its owned calls); this
class owns the rules: the pair named, the value checked against it, the rows in range. The
buffers themselves are the session's (``session.state``: the contract of
:mod:`gear_runtime.backends.state`), reached through that contract alone.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from gear_runtime.backends.base import BackendSession
from gear_runtime.backends.state import DeviceBuffer, SessionState
from gear_runtime.errors import InputError
from gear_runtime.runtime import inputs as inputs_rules
from gear_runtime.runtime.state.plan import StatePair, StatePlan


class ResidentState:
    """The state pairs of one executor (``plan``; None: it has none) over its session's
    buffers. ``gear_values``: each gear's dynamic values, for the messages."""

    def __init__(self, plan: StatePlan | None, session: BackendSession,
                 gear_values: Sequence[tuple[int, ...]]) -> None:
        self.plan = plan
        self._session = session
        self._gear_values = gear_values
        pairs = () if plan is None else plan.pairs
        #: the pairs with rows (their axis 0 follows the gear; see :meth:`bind_rows`)
        self.row_pairs = [p for p in pairs if p.rows]
        #: state input name -> output name
        self.names = {p.input_name: p.output_name for p in pairs}
        self._index = {p.input_name: j for j, p in enumerate(pairs)}

    def _buffers(self) -> SessionState:
        """The session's state (present whenever there is a plan: the session was created
        with it)."""
        state = self._session.state
        assert state is not None, "a session created with a state plan holds its state"
        return state

    def _pair(self, name: str) -> tuple[int, StatePair]:
        assert self.plan is not None
        pair = self.plan.pair(name)  # InputError naming the state inputs
        return self._index[name], pair

    # ---- what the executor shows ---------------------------------------------------------
    @property
    def modes(self) -> dict[str, str]:
        """State input name -> ``"double-buffered"`` or ``"in place"``."""
        return {} if self.plan is None else {p.input_name: p.mode for p in self.plan.pairs}

    @property
    def rows(self) -> int:
        """Rows of the states with rows (a batched decode's slots); 0 when none has rows."""
        return self.row_pairs[0].shape[0] if self.row_pairs else 0

    def is_output(self, name: str) -> bool:
        """Whether ``name`` is a state output (its buffers are the state's)."""
        return name in self.names.values()

    def view(self, name: str) -> np.ndarray | DeviceBuffer:
        """The buffer the next run reads of state ``name`` (``ex.state[name]``); KeyError
        (so that ``name in ex.state`` is False) for any other name."""
        if name not in self.names:
            raise KeyError(f"{name!r} is no state input of this executor; its state inputs: "
                           f"{', '.join(self.names) or 'none'}")
        j, _ = self._pair(name)
        buf = self._buffers().read(j)
        # a view: the caller's flags (writeable=False) stay off the executor's own array,
        # which set_state / reset_state write; the memory is the same (zero-copy, out=)
        return buf.view() if isinstance(buf, np.ndarray) else buf

    def set(self, name: str, value: Any) -> None:
        """``set_state``: ``value`` (its exact shape and dtype) copied once into the buffer
        the next run reads of state ``name``."""
        if self.plan is None:
            raise InputError("set_state on an executor without state: create it with "
                             "model.create_executor(state={input: output})")
        j, pair = self._pair(name)
        if isinstance(value, DeviceBuffer):  # device memory: copied where it lives
            value.check_genuine(f"set_state({name!r})'s value")
            if value.shape != pair.shape or value.dtype != pair.dtype:
                raise InputError(f"set_state({name!r}): got {value!r}, the state is "
                                 f"{pair.dtype} {list(pair.shape)}")
            self._buffers().set(j, value)
            return
        arr = inputs_rules.as_input_array(name, value, pair.dtype)
        if tuple(arr.shape) != pair.shape or arr.dtype != pair.dtype:
            raise InputError(f"set_state({name!r}): got {arr.dtype} {list(arr.shape)}, the "
                             f"state is {pair.dtype} {list(pair.shape)}")
        self._buffers().set(j, arr)

    def reset(self) -> None:
        """``reset_state``: every buffer zeroed (a new sequence)."""
        if self.plan is not None:
            self._buffers().zero()

    def copy_rows(self, source: int, target: int) -> None:
        """``copy_state_rows``: row ``source`` of every state with rows onto row ``target``
        of the buffer the next run reads; InputError naming the row when it is outside."""
        if not self.row_pairs:
            raise InputError("copy_state_rows needs a state with rows (a state input "
                             "whose axis 0 follows the gear); this executor has none")
        src, dst = inputs_rules.to_ints("rows", [source, target])
        total = self.rows
        for name, row in (("source", src), ("target", dst)):
            if not 0 <= row < total:
                raise InputError(f"copy_state_rows: {name} row {row} is outside the "
                                 f"state's {total} rows")
        state = self._buffers()
        for p in self.row_pairs:
            state.copy_row(self._index[p.input_name], src, dst)

    # ---- the state's part of a run -------------------------------------------------------
    def bind_rows(self, gear: int, first_row: object) -> None:
        """Gear ``gear``'s state rows from ``first_row`` (``execute(first_row=)``);
        InputError naming the rows and the buffers' when they do not fit, or when no state
        has rows."""
        rows = self.row_pairs
        if first_row == 0 and type(first_row) is int:
            if rows:
                self._session.bind_rows(gear, 0)
            return
        (first,) = inputs_rules.to_ints("first_row", [first_row])
        if not rows:
            raise InputError(f"first_row={first} needs a state with rows (a state input whose "
                             "axis 0 follows the gear); this executor has none")
        per_gear = rows[0].rows
        assert per_gear is not None  # a row pair has rows
        count, total = per_gear[gear], rows[0].shape[0]
        if not 0 <= first <= total - count:
            raise InputError(f"first_row={first}: gear {gear} {self._gear_values[gear]} runs "
                             f"{count} state row(s), the buffers hold {total}: first_row must "
                             f"be 0..{total - count}")
        self._session.bind_rows(gear, first)

    def commit(self) -> None:
        """After a successful run: what it wrote becomes what the next run reads (the
        session's swap; nothing on a session without state)."""
        self._session.commit_state()

    def refuse_own(self, what: str, buf: DeviceBuffer) -> None:
        """InputError when ``buf`` (an ``out=`` device buffer) is this executor's own state:
        its run reads that memory."""
        if buf.owned_by(self._session.state):
            raise InputError(f"{what} is this executor's own state: its run reads "
                             "that memory; give another executor's state")

    def host_memory(self) -> list[tuple[str, np.ndarray]]:
        """Every host buffer of this state (both parities), named for errors: what an
        ``out=`` array must not share."""
        state = self._session.state
        if state is None:
            return []
        pairs = state.plan.pairs
        return [(f"this executor's state {pairs[j].input_name!r} (buffer {parity})", buf)
                for j, parity, buf in state.host_buffers()]


class StateView(Mapping[str, Any]):
    """``executor.state``: each state input's current read buffer, looked up on access."""

    def __init__(self, state: ResidentState) -> None:
        self._state = state

    def __getitem__(self, name: str) -> Any:
        return self._state.view(name)

    def __iter__(self) -> Iterator[str]:
        return iter(self._state.names)

    def __len__(self) -> int:
        return len(self._state.names)
