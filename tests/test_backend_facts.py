"""Backend facts live beside the backends (gear_runtime/backends/__init__.py FACTS, ALIASES):
no module outside backends/ decides anything by a backend's name, and each fact reaches the
place that uses it (the server's load options and model config, weight sharing, the command
line's --providers / --threads / --backend cuda, inspect)."""

from __future__ import annotations

import argparse
import ast
from pathlib import Path

import pytest

from gear_runtime.backends import ALIASES, BACKENDS, FACTS, facts
from gear_runtime.cli.common import UsageError, backend_options
from gear_runtime.serving.options import ServeOptions

ROOT = Path(__file__).resolve().parent.parent / "gear_runtime"


def _names_in(node: ast.AST) -> list[str]:
    """The backend names a comparison operand or dict key spells out."""
    items = node.elts if isinstance(node, ast.Tuple | ast.List | ast.Set) else [node]
    return [i.value for i in items
            if isinstance(i, ast.Constant) and isinstance(i.value, str) and i.value in BACKENDS]


def test_no_module_outside_backends_decides_by_a_backend_name() -> None:
    """``backend == "onnxruntime"``, ``in ("acl", ...)`` or a dict keyed by backend names
    anywhere but gear_runtime/backends/ fails here (a default argument is no decision, nor a
    package name among others: the versions a report lists)."""
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        if path.relative_to(ROOT).parts[0] == "backends":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Compare):
                names = [n for op in [node.left, *node.comparators] for n in _names_in(op)]
            elif isinstance(node, ast.Dict) and node.keys:  # keyed by backend names alone
                names = [n for k in node.keys if k is not None for n in _names_in(k)]
                names = names if len(names) == len(node.keys) else []
            else:
                continue
            if names:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} {names}")
    assert found == []


def test_every_backend_has_facts_and_aliases_name_real_backends() -> None:
    assert set(FACTS) == set(BACKENDS)
    assert all(target in BACKENDS for target, _ in ALIASES.values())
    assert facts("no-such-backend") == facts("null")  # none: open_model refuses the name


def test_the_servers_load_options_follow_the_facts() -> None:
    """Spinning and threads are session options where the backend has them, nothing else."""
    ort = ServeOptions(backend="onnxruntime", spin=True, intra_op_threads=3).load_options()
    assert ort == {"intra_op_num_threads": 3, "session_config": {
        "session.intra_op.allow_spinning": "1", "session.inter_op.allow_spinning": "1"}}
    assert ServeOptions(backend="onnxruntime").load_options()["session_config"] == {
        "session.intra_op.allow_spinning": "0", "session.inter_op.allow_spinning": "0"}
    assert ServeOptions(backend="acl", spin=True, intra_op_threads=3,
                        device_options=(("device_id", 1),)).load_options() == {"device_id": 1}
    assert ServeOptions(backend="openvino", intra_op_threads=2).load_options() == {
        "num_threads": 2}


def _args(**given: object) -> argparse.Namespace:
    base = dict(backend="onnxruntime", providers=None, threads=None, device=None, config=None,
                input_shape=None)
    return argparse.Namespace(**{**base, **given})


def test_the_command_lines_backend_options_follow_the_facts() -> None:
    assert backend_options(_args(backend="cuda")) == (
        "onnxruntime", {"providers": ["CUDAExecutionProvider", "CPUExecutionProvider"]})
    assert ALIASES["cuda"][1]["providers"] == ["CUDAExecutionProvider",
                                               "CPUExecutionProvider"]  # not changed by it
    assert backend_options(_args(providers="cpu", threads=2)) == (
        "onnxruntime", {"providers": ["CPUExecutionProvider"], "intra_op_num_threads": 2})
    assert backend_options(_args(backend="openvino", threads=2)) == (
        "openvino", {"num_threads": 2})
    with pytest.raises(UsageError, match="--providers is an onnxruntime option; --backend is "
                                         "'openvino'"):
        backend_options(_args(backend="openvino", providers="cpu"))
    with pytest.raises(UsageError, match="--threads is an option of onnxruntime, openvino"):
        backend_options(_args(backend="acl", threads=2))


def test_the_model_config_names_the_backends_instance_kind(monkeypatch) -> None:
    """Triton's instance_group kind comes from the facts: KIND_MODEL on the null backend;
    with ONNX Runtime's facts given to it, KIND_CPU."""
    import dataclasses

    from gear_runtime import backends
    from gear_runtime.backends import null
    from gear_runtime.runtime.model import GearModel
    from gear_runtime.serving.metrics import Metrics
    from gear_runtime.serving.served import ServedModel
    from gear_runtime.spec import GearSpec

    spec = GearSpec.from_atc(input_shape="data:-1,3", dynamic_batch_size="1,2")
    model = GearModel(null.open_model(None, spec=spec, outputs={"y": [(1, 3), (2, 3)]}))
    kinds = []
    for fact in (None, dataclasses.replace(FACTS["null"], instance_kind="KIND_CPU")):
        if fact is not None:
            monkeypatch.setitem(backends.FACTS, "null", fact)
        served = ServedModel("m", model, ServeOptions(executors=1, backend="null"), Metrics())
        try:
            kinds.append(served.config()["instance_group"][0]["kind"])
        finally:
            served.pool.close()
    assert kinds == ["KIND_MODEL", "KIND_CPU"]


def test_the_bench_table_says_what_the_naive_column_runs_on_each_backend() -> None:
    from gear_runtime.tools.bench.table import column_notes

    def naive(backend: str) -> str:
        return next(n for n in column_notes(True, None, backend) if n.startswith("naive = "))

    assert "session.run(None, feeds) on the model's session" in naive("onnxruntime")
    assert "OpenVINO's own dynamic-shape model" in naive("openvino")
    assert "session.run(None, feeds)" in naive("null")  # no naive run of its own: ORT's text
