"""Every command on the device backends' own files, through the doubles: inspect, run, bench
and serve on an .om (acl) and a MindIR (mindspore_lite), with --device / --config /
--input-shape; the served name is the file's stem."""

from __future__ import annotations

import asyncio
import json
import sys

import pytest
from cli_support import run_cli
from doubles import fake_acl, fake_mslite

from gear_runtime.serving import build_server
from gear_runtime.serving.options import ServeOptions

OM_INPUTS = [("x", [-1, 3, 4], "float32"), ("ids", [-1, 2], "int64")]
OM_GEARS = [(1,), (4,), (8,)]
MS_INPUTS = [("input_ids", [1, -1], "int32")]
MS_CONFIG = '[acl_build_options]\ninput_shape="input_ids:1,-1"\nge.dynamicDims="4;8"\n'


@pytest.fixture
def acl(monkeypatch, tmp_path):
    double = fake_acl.FakeAcl(device_count=2)
    monkeypatch.setitem(sys.modules, "acl", double.module)
    om = fake_acl.write_om(tmp_path / "fake_conv.om", OM_INPUTS, "batch", OM_GEARS)
    return double, om


@pytest.fixture
def mslite(monkeypatch, tmp_path):
    double = fake_mslite.FakeMslite()
    monkeypatch.setitem(sys.modules, "mindspore_lite", double.module)
    mindir = fake_mslite.write_mindir(tmp_path / "prefill.mindir", MS_INPUTS,
                                      [[[1, 4]], [[1, 8]]])
    config = tmp_path / "config.ini"
    config.write_text(MS_CONFIG)
    return double, mindir, str(config)


def test_inspect_an_om_reports_the_gears_acl_reads(capsys, acl, tmp_path) -> None:
    _, om = acl
    code, out, err = run_cli(capsys, "inspect", om, "--backend", "acl")
    assert code == 0, err
    assert "model file" in out and "backend     acl" in out and "3 gears" in out
    code, _, err = run_cli(capsys, "inspect", om, "--backend", "acl", "--json",
                           tmp_path / "i.json")
    doc = json.loads((tmp_path / "i.json").read_text())
    assert doc["backend"] == "acl" and doc["mode"] == "batch"
    assert [g["dims"] for g in doc["gears"]] == [[1], [4], [8]]
    assert doc["gears"][1]["inputs"] == {"x": [4, 3, 4], "ids": [4, 2]}


def test_an_om_without_backend_says_which_backend_opens_it(capsys, acl) -> None:
    _, om = acl
    code, _, err = run_cli(capsys, "inspect", om)
    assert code != 0 and "--backend acl" in err


def test_run_and_bench_an_om_with_device(capsys, acl, tmp_path) -> None:
    double, om = acl
    code, out, err = run_cli(capsys, "run", om, "--backend", "acl", "--device", "1",
                             "--dymBatch", "4", "--output-dir", tmp_path / "out")
    assert code == 0, err
    assert ("rt.set_device", (1,)) in double.state.calls
    code, out, err = run_cli(capsys, "bench", om, "--backend", "acl", "--iterations", "3",
                             "--warmup", "0", "--no-progress", "--json", tmp_path / "b.json")
    assert code == 0, err
    doc = json.loads((tmp_path / "b.json").read_text())
    assert doc["context"]["model"]["files"] == [om] and len(doc["gears"]) == 3


def test_a_device_flag_a_backend_lacks_is_refused(capsys, acl) -> None:
    _, om = acl
    code, _, err = run_cli(capsys, "run", om, "--backend", "acl", "--config", om)
    assert code != 0 and "--config FILE is the mindspore_lite converter config" in err
    code, _, err = run_cli(capsys, "run", om, "--backend", "acl", "--device", "npu0")
    assert code != 0 and "--device 'npu0'" in err


def test_inspect_run_bench_a_mindir_with_its_config(capsys, mslite, tmp_path) -> None:
    _, mindir, config = mslite
    code, out, err = run_cli(capsys, "inspect", mindir, "--backend", "mindspore_lite",
                             "--config", config)
    assert code == 0, err
    assert "backend     mindspore_lite" in out and "2 gears" in out
    code, out, err = run_cli(capsys, "run", mindir, "--backend", "mindspore_lite", "--config",
                             config, "--dymDims", "input_ids:1,8", "--output-dir", tmp_path)
    assert code == 0, err
    code, _, err = run_cli(capsys, "bench", mindir, "--backend", "mindspore_lite", "--config",
                           config, "--iterations", "2", "--warmup", "0", "--no-progress")
    assert code == 0, err


def test_served_names_are_the_files_stems(acl, mslite) -> None:
    _, om = acl
    _, mindir, config = mslite
    server = build_server([om], options=ServeOptions(backend="acl"))
    try:
        assert list(server.models) == ["fake_conv"]
    finally:
        asyncio.run(server.close())
    server = build_server([mindir], options=ServeOptions(
        backend="mindspore_lite", device_options=(("config", config),)))
    try:
        assert list(server.models) == ["prefill"]
    finally:
        asyncio.run(server.close())
