"""Ascend backend through pyACL: run ``.om`` models that ATC compiled with dynamic gears.

Written to the documented pyACL API (CANN "pyACL API reference", aclpythondevg pages on
hiascend.com, cited at each call) and tested against the double in
``tests/doubles/fake_acl.py``; it has NOT been run on Ascend hardware here (docs/ascend.md).

Load (:func:`open_model`): ``acl.init`` once per process, ``acl.rt.set_device``, a context,
``acl.mdl.load_from_file``, the model description, and the gears read back from it:
``get_dynamic_batch`` / ``get_input_dynamic_gear_count`` + ``get_input_dynamic_dims`` /
``get_dynamic_hw`` (mmdeploy's Ascend wrapper checks them in this order on hardware). They
become a :class:`GearSpec`, so the executor applies the same O(1) gear table and the same
errors as on every backend: an out-of-gear request fails before any ACL call. Per-gear output
shapes come from ``get_cur_output_dims`` after setting each gear once at load (a table, so
runs never query the model-global "current gear", which two executors would race on).

Memory, one session per executor (:class:`AclSession`)::

    pinned host staging (malloc_host, layout.total_bytes)    <- the C++ core stages here
        | ONE acl.rt.memcpy H2D of layout.merged_span(g)     (+ one per layout.separate(g))
        v
    device region (malloc, layout.total_bytes), same offsets <- gear g's dataset points into it
        set_* writes the dims into ascend_mbatch_shape_data, acl.mdl.execute
    device outputs (malloc, largest gear) --one D2H memcpy per output--> pinned host outputs

The device region mirrors the staging byte for byte, so the merged span is a single copy, as
in GE's CopyInputDataWithMergeH2D. Its data buffers are carved out of one aclrtMalloc block,
so each must start 64-byte aligned and own ALIGN_UP(len, 32) + 32 bytes (pyACL "malloc"
constraints): :attr:`AclModel.layout_options` asks the layout for exactly that (alignment 64,
tail_padding 32; GearModel plans with it), and a session refuses a layout that breaks it.
Datasets (one per gear: the offsets differ per gear) are built once per session; a run is
memcpy(s), one ``set_*``, ``execute``, output memcpys.
Every non-zero ``ret`` raises :class:`BackendError` naming the call, with ``.code = str(ret)``.

Threads: sessions are per executor, but ACL forbids concurrent use of one model id ("lock
memcpy -> execute as one sequence"), so runs of one model are serialised by the model's lock.
ACL contexts are per thread and a model runs in the context it was loaded in, so every run
makes the model's context current (``acl.rt.set_context``: binding a thread-local, cheap):

Modules: :mod:`.calls` (constants, checked calls, init, memory), :mod:`.desc` (description ->
GearSpec, pure functions), :mod:`.model` (:class:`AclModel`), :mod:`.session`
(:class:`AclSession`).
"""

from __future__ import annotations

from gear_runtime.backends.acl.calls import import_acl
from gear_runtime.backends.acl.model import AclModel
from gear_runtime.backends.acl.session import AclSession

__all__ = ["AclModel", "AclSession", "open_model"]


def open_model(path: str, *, device_id: int = 0, input_shape: str | None = None) -> AclModel:
    """Load the ``.om`` at ``path`` on NPU ``device_id`` and read its gears.

    ``input_shape`` is the ``--input_shape`` ATC compiled the model with. In dims mode ACL
    orders the flattened dims by it (GE's user_designate_shape_order), and no ACL query
    returns that order: without it the order is inferred from the gears' dims, and a model
    whose dims fit several orders is refused (GearFileError saying to pass it). The spec's
    input order is this order.

    Raises BackendUnavailableError (what to install) when pyACL is missing or ``import acl``
    finds another module, GearFileError when the file is missing or not a dynamic-gear model,
    GearSpecError when ``input_shape`` does not describe the model's inputs, BackendError when
    an ACL call fails.
    """
    return AclModel(import_acl(), path, device_id, input_shape)
