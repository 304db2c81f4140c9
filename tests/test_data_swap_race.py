"""What ONNX Runtime loads is what was checked: a data file swapped or rewritten while a model
loads ends in a refusal or in the original weights, never in other weights.

ORT opens the data file by path; the digest is computed through a descriptor opened once
(gearfile.digest.HeldDataFile), and after the session is built the path must still name that
file, unchanged. These tests race real loads against a thread that changes the file the ways
a deployment (or an accident) does: an atomic rename of a fresh copy, a rename of a hard link
(the same file comes back), and a rewrite in place.
"""

from __future__ import annotations

import os
import random
import shutil
import threading
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from models import heavy_model

import gear_runtime as gr
from gear_runtime.compiler import compile_gears
from gear_runtime.gearfile import digest
from gear_runtime.gearfile.digest import HeldDataFile
from gear_runtime.gearfile.reader import GearFile, read_gear_file

WIDTH = 256
LOADS = 150


@pytest.fixture
def model(tmp_path: Path) -> tuple[Path, Path, bytes, bytes, dict[str, np.ndarray],
                                   np.ndarray]:
    """A gear file with a data file; the good and a bit-flipped copy of the data; inputs and
    the outputs of the good weights."""
    gear = tmp_path / "m.gear.onnx"
    compile_gears(heavy_model(width=WIDTH, layers=4),
                  gr.GearSpec.from_atc(input_shape=f"x:-1,{WIDTH}", dynamic_batch_size="1,4"),
                  gear, progress=False, external_data=True)
    data = Path(f"{gear}.data")
    good = data.read_bytes()
    bad = bytearray(good)
    for at in range(2, len(bad), 4096):  # every page of every weight: any read of it differs
        bad[at] ^= 0x40
    feeds = {"x": np.random.default_rng(0).standard_normal((4, WIDTH), dtype=np.float32)}
    with gr.load(str(gear)) as m:
        want = m.create_executor().execute(feeds)[0]
    return gear, data, good, bytes(bad), feeds, want


class Swapper(threading.Thread):
    """Every 10-20 ms, puts the other of (good, bad) in place: by renaming a fresh copy over
    it, by renaming a hard link of a kept copy over it, or by rewriting the changed bytes in
    place (chosen at random each time)."""

    def __init__(self, data: Path, good: bytes, bad: bytes) -> None:
        super().__init__(daemon=True)
        self.data, self.contents = data, (good, bad)
        self.kept = [data.with_name("good.kept"), data.with_name("bad.kept")]
        for path, content in zip(self.kept, self.contents, strict=True):
            path.write_bytes(content)
        self.diff = [i for i in range(len(good)) if good[i] != bad[i]]
        self.stop = threading.Event()
        self.swaps: Counter[str] = Counter()

    def run(self) -> None:
        rng, which = random.Random(1), 0
        while not self.stop.is_set():
            which ^= 1
            how = rng.choice(("copy", "link", "in place"))
            if how == "in place" and any(os.path.samefile(k, self.data) for k in self.kept):
                how = "copy"  # rewriting a link of a kept copy would change the copy
            tmp = self.data.with_name("swap.tmp")
            tmp.unlink(missing_ok=True)  # renaming a link onto its own file leaves it there
            if how == "copy":
                tmp.write_bytes(self.contents[which])
                os.replace(tmp, self.data)
            elif how == "link":
                os.link(self.kept[which], tmp)
                os.replace(tmp, self.data)
            else:
                with open(self.data, "r+b") as f:
                    for i in self.diff:
                        f.seek(i)
                        f.write(self.contents[which][i:i + 1])
            self.swaps[how] += 1
            time.sleep(rng.uniform(0.010, 0.020))
        self.data.write_bytes(self.contents[0])


def test_150_loads_under_a_swapping_thread_never_run_other_weights(model) -> None:
    gear, data, good, bad, feeds, want = model
    tally: Counter[str] = Counter()
    swapper = Swapper(data, good, bad)
    swapper.start()
    try:
        for _ in range(LOADS):
            try:
                with gr.load(str(gear)) as m:
                    got = m.create_executor().execute(feeds)[0]
            except gr.GearFileError as exc:
                assert "data file" in str(exc)
                tally["refused"] += 1
            else:
                tally["same" if np.array_equal(got, want) else "OTHER WEIGHTS"] += 1
    finally:
        swapper.stop.set()
        swapper.join()
    assert tally["OTHER WEIGHTS"] == 0, (tally, swapper.swaps)
    assert tally["same"] + tally["refused"] == LOADS
    assert tally["refused"] > 0 and min(swapper.swaps.values()) > 0, (tally, swapper.swaps)


def _load_while(monkeypatch: pytest.MonkeyPatch, gear: Path, change) -> None:
    """Load ``gear`` with ``change()`` run right after ONNX Runtime built its session (after
    the data file was opened and hashed: the window the check by path alone left open)."""
    original = GearFile.checked_load

    def build_then_change(self: GearFile, build):
        def changed_after_build():
            out = build()
            change()
            return out
        return original(self, changed_after_build)

    monkeypatch.setattr(GearFile, "checked_load", build_then_change)
    gr.load(str(gear)).close()


@pytest.mark.parametrize("how", ["copy", "link", "in place", "truncate", "move away"])
def test_a_change_during_the_session_build_is_refused_even_when_undone(
        model, monkeypatch: pytest.MonkeyPatch, how: str) -> None:
    gear, data, good, bad, _, _ = model
    kept = data.with_name("good.kept")
    kept.write_bytes(good)

    def swap_and_back() -> None:  # ORT could have read the other file in between
        tmp = data.with_name("t")
        if how == "copy":
            tmp.write_bytes(bad)
            os.replace(tmp, data)
            tmp.write_bytes(good)
            os.replace(tmp, data)
        elif how == "link":  # the very file hashed comes back
            os.replace(data, data.with_name("orig"))
            os.link(kept, tmp)
            os.replace(tmp, data)
            os.replace(data.with_name("orig"), data)
        elif how == "in place":
            with open(data, "r+b") as f:
                f.write(bad[:8])
                f.seek(0)
                f.write(good[:8])
        elif how == "truncate":
            os.truncate(data, len(good) // 2)
            with open(data, "ab") as f:
                f.write(good[len(good) // 2:])
        else:
            shutil.move(data, data.with_name("elsewhere"))
            shutil.move(data.with_name("elsewhere"), data)

    with monkeypatch.context() as patch, pytest.raises(
            gr.GearFileError, match="changed while the model was loading"):
        _load_while(patch, gear, swap_and_back)
    gr.load(str(gear)).close()  # the file itself is fine: the next load succeeds


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc/self/fd")
def test_no_descriptor_of_the_data_file_outlives_the_load(model) -> None:
    gear, data, *_ = model

    def open_on_data() -> list[str]:
        out = []
        for fd in os.listdir("/proc/self/fd"):
            try:
                if os.readlink(f"/proc/self/fd/{fd}") == str(data.resolve()):
                    out.append(fd)
            except OSError:  # the listing's own descriptor, closed meanwhile
                pass
        return out

    with gr.load(str(gear)):
        assert open_on_data() == []
    assert open_on_data() == []


def test_a_file_that_did_not_settle_is_hashed_again_at_the_end(
        model, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where change times are coarse (or the file changed within the clock's tick), an
    in-place rewrite may keep the change time: the end check then hashes again."""
    gear, data, good, bad, _, _ = model
    (path, want), = read_gear_file(gear).data_digests.items()
    monkeypatch.setattr(digest, "_clock_ns", lambda: 0)  # the file never settles
    held = HeldDataFile(path, want)
    try:
        assert not held.settled
        held.verify()
        with open(data, "r+b") as f:
            f.write(bad[:8])
        # a file system whose times do not show the rewrite
        monkeypatch.setattr(digest, "_identity", lambda st: (st.st_dev, st.st_ino))
        with pytest.raises(gr.GearFileError, match="corrupt"):
            held.check_unchanged()
    finally:
        held.close()
