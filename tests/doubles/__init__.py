"""Faithful doubles of the Ascend runtimes the backends call (no NPU here).

* :mod:`doubles.fake_acl`: pyACL (``import acl``): same module / function names,
  argument orders and ``value, ret`` return conventions as the CANN documentation, memory
  emulated (pinned host memory is real memory, device memory is bytearrays behind fake
  pointers), a fake ``.om`` model that computes something checkable per gear, call recording
  and failure injection.
* :mod:`doubles.fake_mslite`: MindSpore Lite's Python API (``import mindspore_lite``):
  Context / Model / Tensor, a fake MindIR whose resize accepts only the compiled gears.
* :mod:`doubles.layout`: the core's own staging layout (``gear_runtime.runtime.core.plan_layout``)
  and a test-only ``stage``.

The tests import them as ``from doubles import fake_acl`` (``tests/`` is on ``sys.path``
under pytest's default import mode). Install one with
``monkeypatch.setitem(sys.modules, "acl", fake.module)``.
fake_acl and fake_mslite never import gear_runtime: what they declare is independent of what
the code under test discovers, so "the spec equals what the model declares" can fail.
"""
