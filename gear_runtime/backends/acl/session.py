"""One executor's buffers and datasets on the NPU (:class:`AclSession`); the picture is in
:mod:`gear_runtime.backends.acl`'s docstring."""

from __future__ import annotations

import weakref
from typing import Any

import numpy as np

from gear_runtime.backends.acl.calls import (
    ACL_MEMCPY_DEVICE_TO_DEVICE,
    ACL_MEMCPY_DEVICE_TO_HOST,
    ACL_MEMCPY_HOST_TO_DEVICE,
    ALIGN,
    PAD,
    Scratch,
    check,
    host_array,
)
from gear_runtime.backends.base import (
    BackendSession,
    DeviceBuffer,
    DeviceStateBase,
    check_layout_fits,
    locks_in_order,
)
from gear_runtime.errors import BackendError, ClosedError


class AclSession(BackendSession):
    """One executor's buffers and datasets on the NPU (see the module docstring's picture)."""

    def __init__(self, model: Any, layout: Any, state: Any = None) -> None:
        """``model``: the :class:`~gear_runtime.backends.acl.model.AclModel` creating this
        session (not imported here: model.py imports this module). ``state``: a
        :class:`~gear_runtime.runtime.state.StatePlan`; its pairs then live in device memory
        (:class:`DeviceState`) and ``layout`` covers the plan's other inputs alone."""
        self._model, self._acl, self._layout = model, model.acl, layout
        self._plan = state
        #: the spec indices the staging layout covers, in layout order
        self._staged = list(range(len(model.info.spec.input_names))) if state is None \
            else list(state.inputs)
        self.state: DeviceState | None = None
        self._mem = Scratch(model.acl)
        self._closed = False
        self.staging = np.empty(0, dtype=np.uint8)
        try:
            self._build()
        except BaseException:
            self._mem.release(strict=False)
            self._closed = True
            raise
        # An executor dropped without close() still frees its NPU memory when collected
        # (not at interpreter exit: ACL may be finalised by then, and exit frees it anyway).
        self._finalizer = weakref.finalize(self, self._mem.release, False)
        self._finalizer.atexit = False

    def _build(self) -> None:
        model, layout, mem = self._model, self._layout, self._mem
        info = model.info
        spec = info.spec
        model.activate()  # the allocations below belong to the model's context
        check_layout_fits(layout, info, self._staged)
        self._check_padding()
        self._total = int(layout.total_bytes)
        self._host = mem.host(self._total)
        self.staging = host_array(self._host, max(self._total, 1))[: self._total]
        # the layout's footprints include every buffer's padding, the last one's too
        self._device = mem.device(self._total)
        # The dims input gets its own data buffer (ACL writes the dims into it in set_*). It
        # points at the layout's dims slot when that slot is large enough for the model's
        # dims input; else (an int64 dims input) at a session buffer of the model's size.
        if model.dims_index is None:  # a static model: no dims input, no set_*
            dims_at = []
        elif int(layout.dims_nbytes) >= model.dims_nbytes:
            dims_at = [self._device + int(layout.dims_offset(g)) for g in range(spec.gear_count)]
        else:
            # one per gear: each gear's dims are set once and must stay in its own buffer
            dims_at = [mem.device(model.dims_nbytes) for _ in range(spec.gear_count)]
        if self._plan is not None:
            self.state = DeviceState(self, self._plan)
        self._build_outputs()
        state_in = {} if self._plan is None else {p.input_index: j
                                                   for j, p in enumerate(self._plan.pairs)}
        # per parity (one without state), per gear: the input dataset; a state input reads
        # the buffer of its parity
        self._in_datasets: list[list[int]] = []
        for parity in range(2 if self.state is not None else 1):
            row = []
            for g in range(spec.gear_count):
                ds = mem.dataset()
                for j in range(len(model.input_indices) + (model.dims_index is not None)):
                    if j == model.dims_index:
                        mem.add(ds, dims_at[g], model.dims_nbytes)
                        continue
                    i = model.spec_index(j)
                    if i in state_in:
                        assert self.state is not None  # state_in is empty without state
                        pair = state_in[i]
                        mem.add(ds, self.state.buffers[pair][parity],
                                self._plan.pairs[pair].nbytes)
                        continue
                    li = self._staged.index(i)
                    mem.add(ds, self._device + int(layout.offset(g, li)),
                            int(layout.nbytes(g, li)))
                row.append(ds)
                self._select_gear(ds, g)
            self._in_datasets.append(row)
        # error-message suffixes, formatted here rather than on every run
        self._labels = [f" (gear {g}: {values})" for g, values in enumerate(spec.gears)]
        self._merged = [_span(layout.merged_span(g)) for g in range(spec.gear_count)]
        self._separate = [[_span(s) for s in layout.separate(g)] for g in range(spec.gear_count)]

    def _select_gear(self, ds: int, g: int) -> None:
        """Each gear has a dataset of its own, so its gear is selected ONCE, here: set_*
        records the dims on the dataset (the fields aclmdlExecute reads) and writes them into
        the dims buffer, with one aclrtMemcpy per value (GE's SetDynamicDims). Per run that
        would be several small copies beside the ONE merged copy; the buffer is the layout's
        dims slot, refreshed by the merged copy with the same bytes (int32), or a buffer of
        its own that nothing else writes (int64). A static model has nothing to select."""
        model = self._model
        if model.dims_index is not None:
            call, fn, args = model.dims_call(model.info.spec, ds, g)
            check(fn(*args), call, f" (gear {g}: {model.info.spec.gears[g]})")

    def _check_padding(self) -> None:
        """Every sub-buffer of the device region (each input, and the dims slot) must start
        64-aligned and have ALIGN_UP(len, 32) + 32 bytes before the next one or the region's
        end: what ACL asks of buffers carved from one aclrtMalloc block. A layout planned with
        :attr:`AclModel.layout_options` always does; any other is refused (BackendError)."""
        layout, spec = self._layout, self._model.info.spec
        total = int(layout.total_bytes)
        for g in range(spec.gear_count):
            bufs = [(int(layout.offset(g, li)), int(layout.nbytes(g, li)),
                     repr(spec.input_names[i])) for li, i in enumerate(self._staged)]
            if int(layout.dims_nbytes):
                bufs.append((int(layout.dims_offset(g)), int(layout.dims_nbytes), "the dims"))
            bufs.sort()
            limits = [start for start, _, _ in bufs[1:]] + [total]
            for (start, n, what), limit in zip(bufs, limits, strict=True):
                room = (n + 31) // 32 * 32 + PAD
                if start % ALIGN or start + room > limit:
                    raise BackendError(
                        f"staging layout breaks ACL's rule for buffers carved from one "
                        f"aclrtMalloc block: {what} of gear {g} at offset {start} ({n} bytes) "
                        f"needs a 64-aligned start and {room} bytes (ALIGN_UP(len,32)+32) "
                        f"before offset {limit}; plan it with "
                        "gear_runtime.runtime.core.plan_layout(..., "
                        f"**AclModel.layout_options) = {self._model.layout_options}")

    def _build_outputs(self) -> None:
        """Device output buffers sized for the largest gear (the model's output sizes), one
        output dataset shared by every gear (one per parity with state: a state output
        writes the buffer its parity's run does not read), and pinned host buffers the
        results land in. A state output is neither copied to the host nor returned (its
        place holds an empty array; execute leaves it out)."""
        model, mem = self._model, self._mem
        info = model.info
        state_out = {} if self._plan is None else {p.output_index: j
                                                    for j, p in enumerate(self._plan.pairs)}
        sizes = [max(int(s), 1) for s in model.outputs.sizes]
        offsets = np.cumsum([0] + [_aligned(s) if k not in state_out else 0
                                   for k, s in enumerate(sizes)]).tolist()
        host = mem.host(max(offsets[-1], 1))
        host_bytes = host_array(host, max(offsets[-1], 1))
        devices = [None if k in state_out else mem.device(size) for k, size in enumerate(sizes)]
        self._out_sizes = sizes
        self._out_datasets: list[int] = []
        #: per parity, per output: the (device address, size) its dataset buffer points at
        self._out_entries: list[list[tuple[int, int]]] = []
        for parity in range(2 if self.state is not None else 1):
            entries: list[tuple[int, int]] = []
            for k, (dev, size) in enumerate(zip(devices, sizes, strict=True)):
                if k in state_out:  # written where the next run (the other parity) reads
                    assert self.state is not None  # state_out is empty without state
                    pair = state_out[k]
                    entries.append((self.state.buffers[pair][1 - parity],
                                    self._plan.pairs[pair].nbytes))
                else:
                    assert dev is not None  # only a state output has no device buffer
                    entries.append((dev, size))
            ds = mem.dataset()
            for ptr, size in entries:
                mem.add(ds, ptr, size)
            self._out_datasets.append(ds)
            self._out_entries.append(entries)
        self._out_copies: list[list[tuple[int, int, int, int, int]]] = []
        self._out_views: list[list[np.ndarray]] = []
        for g in range(info.spec.gear_count):
            copies: list[tuple[int, int, int, int, int]] = []
            views: list[np.ndarray] = []
            for k, (dev, size) in enumerate(zip(devices, sizes, strict=True)):
                if k in state_out:
                    views.append(np.empty(0, info.output_dtypes[k]))
                    continue
                assert dev is not None  # only a state output has no device buffer
                nbytes = info.output_size(g, k)
                copies.append((k, host + offsets[k], size, dev, nbytes))
                view = host_bytes[offsets[k]:offsets[k] + nbytes].view(info.output_dtypes[k])
                views.append(view.reshape(info.output_shapes[g][k]))
            self._out_copies.append(copies)
            self._out_views.append(views)

    def _memcpy(self, dst: int, dest_max: int, src: int, count: int, kind: int,
                what: str) -> None:
        # acl.rt.memcpy(dst, dest_max, src, count, kind) -> ret (aclpythondevg_01_0120)
        ret = self._acl.rt.memcpy(dst, dest_max, src, count, kind)
        if ret != 0:  # the message is formatted only on failure: this is the hot path
            check(ret, "acl.rt.memcpy", f" ({what}, {count} bytes)")

    def run_gear(self, gear: int) -> list[np.ndarray]:
        """Copy gear ``gear``'s staged inputs to the device (ONE memcpy for the merged span,
        one per separate span), select the gear, execute, copy the outputs back."""
        self._model.info.spec.gear_number(gear, "model")
        with self._model.lock:
            if self._closed:  # checked under the lock: the model may close meanwhile
                raise BackendError("this acl session is closed")
            # Every run, not once per thread: another model driven from this thread may have
            # bound its own context since (and a thread id can be reused by a new thread).
            self._model.activate()
            return self._run_locked(gear)

    def device_out_refusal(self, buf: DeviceBuffer) -> str | None:
        """An output is written into acl device memory of this session's device (the other
        executor's state: the prefill -> decode handoff); memory of another device or
        backend is refused (ACL would need peer access between devices)."""
        here = self._model.device_id
        if buf.backend != "acl" or buf.device_id != here:
            return (f"this executor runs on acl device {here}: it writes an output into acl "
                    f"memory of device {here} only; hand it over with set_state(name, output) "
                    "(through the host)")
        return None

    def run_gear_owned(self, gear: int) -> list[np.ndarray]:
        """Large outputs are copied from the device straight into pooled arrays the caller
        keeps (one device-to-host memcpy each, base :meth:`run_owned_into`)."""
        skip = () if self._plan is None else [p.output_index for p in self._plan.pairs]
        return self.run_owned_into(gear, self._model.info, skip)

    def run_gear_into(self, gear: int, out: dict[int, Any]) -> list[Any]:
        """Outputs given as :class:`DeviceBuffer` (another executor's device state on this
        device) are written on the device, never copied to the host: the output dataset of
        this run points at that buffer where it holds the model's output size
        (:meth:`_out_bindable`), else the output is copied into it device to device after
        the run. The states owning those buffers stay locked from their check through the
        run (their close, which frees them, waits). A numpy buffer (C-contiguous, the gear's
        shape: the executor checked) is the destination of the output's one device-to-host
        copy (aclrtMemcpy takes pageable host memory), not the session's pinned buffer."""
        self._model.info.spec.gear_number(gear, "model")
        device = {k: b for k, b in out.items() if isinstance(b, DeviceBuffer)}
        host = {k: b for k, b in out.items() if not isinstance(b, DeviceBuffer)}
        with locks_in_order(self._model.lock, *(b.lock for b in device.values())):
            if self._closed:
                raise BackendError("this acl session is closed")
            bound = {k: self._bound_address(k, b) for k, b in device.items()}
            self._model.activate()
            outputs = self._run_locked(gear, bound, {k: b.ctypes.data for k, b in host.items()})
        for k, buf in out.items():
            outputs[k] = buf
        return outputs

    def _bound_address(self, k: int, buf: DeviceBuffer) -> int:
        """The device address of ``buf`` (output ``k``'s target), checked with its state's
        lock held (:meth:`run_gear_into`): still allocated (ClosedError), handed out by
        gear_runtime and not stale (InputError: its executor ran since)."""
        buf.check_genuine(f"out[{self._model.info.output_names[k]!r}]")
        return int(buf.handle)

    def _bound_dataset(self, bound: dict[int, int], scratch: Scratch) -> int:
        """An output dataset like the parity's own, output ``k`` at ``bound[k]`` instead
        (only outputs whose buffer holds the model's size are given here)."""
        parity = 0 if self.state is None else self.state.parity
        ds = scratch.dataset()
        for k, (ptr, size) in enumerate(self._out_entries[parity]):
            scratch.add(ds, bound.get(k, ptr), size)
        return ds

    def _run_locked(self, gear: int, bound: dict[int, int] | None = None,
                    host: dict[int, int] | None = None) -> list[np.ndarray]:
        """The run under the model's lock. ``bound``: output index -> a device address it is
        written to instead of being copied to the host (:meth:`run_gear_into`); ``host``:
        output index -> a host address of the gear's output bytes it is copied to instead of
        the session's pinned buffer."""
        h2d, d2h = ACL_MEMCPY_HOST_TO_DEVICE, ACL_MEMCPY_DEVICE_TO_HOST
        start, end = self._merged[gear]
        if end > start:
            self._memcpy(self._device + start, self._total - start, self._host + start,
                         end - start, h2d, "merged inputs, host to device")
        for start, end in self._separate[gear]:
            if end > start:
                self._memcpy(self._device + start, self._total - start, self._host + start,
                             end - start, h2d, "separate input, host to device")
        parity = 0 if self.state is None else self.state.parity
        bound, host = bound or {}, host or {}
        bindable = {k: ptr for k, ptr in bound.items() if self._out_bindable(k, gear)}
        scratch, out_ds = None, self._out_datasets[parity]
        if bindable:  # an output dataset for this run alone, pointing at the caller's buffers
            scratch = Scratch(self._acl)
            out_ds = self._bound_dataset(bindable, scratch)
        try:
            check(self._acl.mdl.execute(self._model.model_id, self._in_datasets[parity][gear],
                                         out_ds), "acl.mdl.execute", self._labels[gear])
        finally:
            if scratch is not None:
                scratch.release(strict=False)
        for k, pinned, cap, dev, nbytes in self._out_copies[gear]:
            if k in bindable or not nbytes:
                continue
            if k in bound:  # its buffer is smaller than the model's size: copied on the device
                self._memcpy(bound[k], nbytes, dev, nbytes, ACL_MEMCPY_DEVICE_TO_DEVICE,
                             "output, device to device")
            elif k in host:
                self._memcpy(host[k], nbytes, dev, nbytes, d2h, "output, device to host")
            else:
                self._memcpy(pinned, cap, dev, nbytes, d2h, "output, device to host")
        return list(self._out_views[gear])

    def _out_bindable(self, k: int, gear: int) -> bool:
        """Whether a caller's buffer of output ``k`` at gear ``gear`` (exactly the gear's
        output bytes) holds the model's output size (the largest gear's), the most the model
        may write there. GE would not stop a smaller one: DavinciModel::CheckUserAndModelSize
        (hicann/ge runtime/v1/graph/load/model_manager/davinci_model.cc) skips the check for
        a run that selected a gear (``is_dynamic_``) and otherwise lets a buffer be up to 64
        bytes short (kDataMemAlignSizeCompare): binding one would risk a silent overrun, so
        a smaller buffer gets the output by a device-to-device copy instead."""
        return self._model.info.output_size(gear, k) >= self._out_sizes[k]

    def commit_state(self) -> None:
        """After a successful run: the buffers it wrote are what the next run reads (a new
        generation: buffers handed out before are stale). Under the model's lock: a handoff
        into this state checks the buffer's generation under it."""
        if self.state is not None:
            with self._model.lock:
                self.state.parity ^= 1

    def close(self) -> None:
        """Destroy the datasets and free the buffers; idempotent. Takes the model's lock, so a
        close from another thread (the model's close) never frees memory under a run."""
        with self._model.lock:
            if self._closed:
                return
            self._closed = True
            self.staging = np.empty(0, dtype=np.uint8)
            self._out_views = []
            self._finalizer.detach()
            if self._model.context is not None:
                self._acl.rt.set_context(self._model.context)
            self._mem.release(strict=True)


class DeviceState(DeviceStateBase):
    """Resident state in NPU memory: per pair two device buffers (a run reads the one of its
    parity and writes the other), and a pinned host buffer for the rare transfers
    (:meth:`read`, :meth:`set`, :meth:`zero`). A decode step then copies only its other
    inputs in and its other outputs out: the cache never crosses PCIe per token."""

    def __init__(self, session: AclSession, plan: Any) -> None:
        self._session, self.plan, self.parity = session, plan, 0
        self.backend, self.device_id = "acl", session._model.device_id
        mem = session._mem
        self.buffers = [(mem.device(max(p.nbytes, 1)), mem.device(max(p.nbytes, 1)))
                        for p in plan.pairs]
        self._host = [mem.host(max(p.nbytes, 1)) for p in plan.pairs]
        self.zero()

    def _host_view(self, pair: int) -> np.ndarray:
        p = self.plan.pairs[pair]
        return host_array(self._host[pair], max(p.nbytes, 1))[:p.nbytes].view(
            p.dtype).reshape(p.shape)

    def _copy(self, pair: int, parity: int, kind: int) -> None:
        p, session = self.plan.pairs[pair], self._session
        if not p.nbytes:
            return
        dev, host = self.buffers[pair][parity], self._host[pair]
        with session._model.lock:
            self._check_alive()
            session._model.activate()
            if kind == ACL_MEMCPY_HOST_TO_DEVICE:
                session._memcpy(dev, p.nbytes, host, p.nbytes, kind, "state, host to device")
            else:
                session._memcpy(host, p.nbytes, dev, p.nbytes, kind, "state, device to host")

    def handles(self, pair: int) -> tuple[int, int]:
        return self.buffers[pair]

    def alive(self) -> bool:
        return not self._session._closed

    @property
    def lock(self) -> Any:
        """The model's lock: runs, state copies and the session's close hold it."""
        return self._session._model.lock

    def _check_alive(self) -> None:
        """ClosedError once the session freed the buffers (call with :attr:`lock` held)."""
        if self._session._closed:
            raise ClosedError("this acl executor's state is freed: the executor is closed")

    def to_host(self, buf: DeviceBuffer) -> np.ndarray:
        found = self.find(buf.handle)
        if found is None:
            raise BackendError(f"{buf!r} is no buffer of this acl state")
        pair, parity = found
        self._copy(pair, parity, ACL_MEMCPY_DEVICE_TO_HOST)
        return self._host_view(pair).copy()

    def set(self, pair: int, value: np.ndarray | DeviceBuffer) -> None:
        """``value`` into the buffer the next run reads: one host-to-device copy, or one
        device-to-device copy from a :class:`DeviceBuffer` on this device."""
        if isinstance(value, DeviceBuffer) and value.backend == self.backend and \
                value.device_id == self.device_id:
            p, session = self.plan.pairs[pair], self._session
            if p.nbytes:  # both states locked through the copy: neither is freed under it
                with locks_in_order(self.lock, value.lock):
                    self._check_alive()
                    value.check_genuine(f"set_state({p.input_name!r})'s value")
                    session._model.activate()
                    session._memcpy(self.buffers[pair][self.parity], p.nbytes, value.handle,
                                    p.nbytes, ACL_MEMCPY_DEVICE_TO_DEVICE,
                                    "state, device to device")
            return
        np.copyto(self._host_view(pair), np.asarray(value))
        self._copy(pair, self.parity, ACL_MEMCPY_HOST_TO_DEVICE)

    def zero(self) -> None:
        """Both buffers of every pair zeroed (a new sequence): host zeros copied in."""
        for pair in range(len(self.plan.pairs)):
            self._host_view(pair).fill(0)
            for parity in (0, 1):
                self._copy(pair, parity, ACL_MEMCPY_HOST_TO_DEVICE)


def _span(value: Any) -> tuple[int, int]:
    """A layout span ``(start, end)`` (both cores return a pair) as ints."""
    start, end = value
    return int(start), int(end)


def _aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN
