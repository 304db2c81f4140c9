"""Mutation check: each guarded behaviour of the project, broken on purpose, must fail a test.

Not a pytest module (no ``test_`` prefix, nothing collected): run it as a script.

    python tests/mutations.py                 # every mutation (minutes)
    python tests/mutations.py --sample 6      # a random 6, seeded (CI); --seed S to repeat
    python tests/mutations.py --only ID ...   # the named ones (--list shows the ids)
    python tests/mutations.py --baseline      # first check each one's tests pass unmutated
    python tests/mutations.py --isolated      # mutate a private copy of the tree, not this one

Each row of :data:`MUTATIONS` names a file, an exact text in it (found exactly once), what
replaces it, the tests that must catch it and the behaviour a user relies on. One at a time,
the file is mutated, its tests run (``pytest -x -q``, under a timeout) and the file is
restored byte for byte, its timestamps too (in a ``finally``: also on Ctrl-C, SIGTERM or an
error; a copy of the original waits in the temp folder until the restore is verified). A
file someone edited while it was mutated gets only the mutation taken back out of it.
Bytecode is never written for a mutated file (``PYTHONDONTWRITEBYTECODE``).

Outcomes: ``caught`` (the tests failed), ``SURVIVED`` (they passed: a test is missing),
``STALE`` (the old text is not in the file once: the row no longer guards anything, update
it), ``BAD TESTS`` (pytest found no such tests: exit 4 / 5), ``timeout`` (counted as caught:
a hang fails the suite too). Exit status 1 when any mutation survived or a row is stale or
names no tests; 0 otherwise.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Mutation:
    id: str
    #: the file, relative to the repository root
    file: str
    #: exact text, found exactly once in the file
    old: str
    new: str
    #: pytest node ids or files (relative to the repository root) that must fail
    tests: tuple[str, ...]
    #: the behaviour a user relies on, in one line
    behaviour: str


STATE = "gear_runtime/runtime/state/plan.py"
RESIDENT = "gear_runtime/runtime/state/resident.py"
EXECUTOR = "gear_runtime/runtime/executor.py"
SEQUENCES = "gear_runtime/serving/sequences.py"
POOL = "gear_runtime/serving/pool.py"
START = "gear_runtime/serving/start.py"
T_STATE = "tests/test_state.py"
T_IN_PLACE = "tests/test_state_in_place.py"
T_SEQ = "tests/test_serving_sequences.py"
T_SEQ_HOSTILE = "tests/test_serving_sequences_hostile.py"
T_POOL = "tests/test_pool_waiting.py"
T_PEERS = "tests/test_serving_peers.py"
T_GAPS = "tests/test_serving_gaps.py"
METRICS = "gear_runtime/serving/metrics.py"
T_MERGED_METRICS = f"{T_GAPS}::test_a_workers_scrape_merges_its_own_series_with_the_others"

MUTATIONS: tuple[Mutation, ...] = (
    # ---- resident state: the pairs checked at create_executor --------------------------------
    Mutation(
        "state-output-feeds-two", STATE,
        "        if out in fed:  # one of the two would never advance",
        "        if False:",
        (f"{T_STATE}::test_one_output_feeding_two_state_inputs_is_refused_naming_both",),
        "one output feeding two state inputs is refused (else one state stops advancing)"),
    Mutation(
        "state-in-place-present-slot", STATE,
        "            node.output[out_slot] != pair.output_name:",
        "            not node.output[out_slot]:",
        (f"{T_IN_PLACE}::test_in_place_through_the_wrong_output_is_refused_naming_it",),
        "in place is granted only through the kernel's present slot of the pair's own output"),
    Mutation(
        "state-in-place-graph-output", STATE,
        "    if any(o.name == pair.input_name for o in graph.output):",
        "    if False:",
        (f"{T_IN_PLACE}::test_a_state_that_is_also_a_graph_output_is_not_run_in_place",),
        "a state input that is also a graph output is never aliased in place"),
    # ---- the executor's outputs and set_state ------------------------------------------------
    Mutation(
        "executor-state-commit", RESIDENT,
        "        self._session.commit_state()\n",
        "        pass\n",
        (f"{T_STATE}::test_state_advances_as_plain_ort_and_a_kept_view_is_not_written_by_the_next_run",),
        "the state a run wrote is what the next run reads"),
    Mutation(
        "executor-stateful-copy", EXECUTOR,
        "        outputs = [o if k in outs or not copy else o.copy()",
        "        outputs = [o if k in outs or True else o.copy()",
        (f"{T_STATE}::test_copy_true_outputs_of_a_stateful_executor_survive_the_next_step",),
        "copy=True on a stateful executor returns arrays the next step never overwrites"),
    Mutation(
        "executor-set-state-device-shape", RESIDENT,
        "            if value.shape != pair.shape or value.dtype != pair.dtype:",
        "            if value.dtype != pair.dtype:",
        ("tests/test_device_state.py::test_set_state_refuses_a_device_buffer_of_another_shape",),
        "set_state refuses a device buffer of another shape (never a short or long copy)"),
    # ---- shared weights ----------------------------------------------------------------------
    Mutation(
        "shared-weights-prepacking", "gear_runtime/backends/shared_weights.py",
        "        options.add_session_config_entry(DISABLE_PREPACKING_KEY, \"1\")",
        "        pass",
        (f"{T_STATE}::test_shared_weights_are_held_once",),
        "sessions over shared weights never prepack them (+517 MiB on a 606 MiB decode)"),
    Mutation(
        "shared-weights-closed-model", "gear_runtime/runtime/model.py",
        "    if other.closed:\n",
        "    if False:\n",
        (f"{T_STATE}::test_share_weights_with_is_checked",),
        "share_weights_with= a closed model is a ClosedError"),
    # ---- sequences (Triton's sequence protocol) ----------------------------------------------
    Mutation(
        "seq-owner-check", SEQUENCES,
        "            if slot.running != req.epoch:",
        "            if False:",
        (f"{T_SEQ_HOSTILE}::test_a_step_queued_behind_its_end_never_runs",),
        "a step queued behind its sequence's end never runs (the slot may be another's)"),
    Mutation(
        "seq-idle-expiry-pending", SEQUENCES,
        "            if slot.pending == 0 and now - slot.last_used > self.idle_s:",
        "            if now - slot.last_used > self.idle_s:",
        (f"{T_SEQ_HOSTILE}::test_idle_expiry_never_frees_a_sequence_whose_step_runs",),
        "idle expiry never frees a sequence whose step still runs"),
    Mutation(
        "seq-empty-id", SEQUENCES,
        '    if seq is None or seq == 0 or seq == "":',
        "    if seq is None or seq == 0:",
        (f"{T_SEQ_HOSTILE}::test_an_empty_id_is_no_sequence",),
        'sequence_id "" is no sequence (400), as in Triton'),
    Mutation(
        "seq-drain-admit", SEQUENCES,
        "        if self.refusing:\n            raise ClosedError(_REFUSING)\n"
        "        slot = self._live.get(control.id)",
        "        slot = self._live.get(control.id)",
        (f"{T_SEQ_HOSTILE}::test_past_the_drain_deadline_a_request_is_refused_at_once",),
        "sequence requests arriving past the drain deadline are refused at once"),
    Mutation(
        "seq-drain-queued", SEQUENCES,
        "            if self.refusing:\n                raise ClosedError(_REFUSING)\n"
        "            if control.start:",
        "            if control.start:",
        (f"{T_SEQ_HOSTILE}::test_past_the_drain_deadline_sequence_requests_are_refused",),
        "sequence requests queued past the drain deadline never run"),
    Mutation(
        "seq-client-left", SEQUENCES,
        "            req.began = not (req.abandoned or req.expired)",
        "            req.began = not req.expired",
        (f"{T_SEQ_HOSTILE}::test_a_start_cancelled_before_it_ran_leaves_the_sequence_not_live",),
        "a sequence request whose client left before its turn never runs"),
    Mutation(
        "seq-queue-bound", SEQUENCES,
        "                self.waiting >= self.max_waiting:",
        "                self.waiting > self.max_waiting + 1000:",
        (f"{T_SEQ_HOSTILE}::test_the_bound_refuses_only_requests_that_would_wait",),
        "past --max-queue a sequence request that would wait is refused (503 queue_full)"),
    Mutation(
        "seq-start-missing-output", START,
        "            if out not in outputs:",
        "            if False:",
        (f"{T_SEQ}::test_a_start_model_without_the_state_output_is_refused",),
        "a --sequence-start model without a state output is refused at load"),
    Mutation(
        "seq-start-shape", START,
        "            if shapes != {want} or self.model.info.output_dtypes[k] != \\",
        "            if False and self.model.info.output_dtypes[k] != \\",
        (f"{T_SEQ}::test_a_start_model_that_does_not_fit_the_step_model_is_refused_at_load",),
        "a --sequence-start model whose state output has another shape is refused at load"),
    Mutation(
        "seq-start-answers", START,
        "        if others != list(answered):",
        "        if False:",
        (f"{T_SEQ}::test_a_start_model_that_does_not_fit_the_step_model_is_refused_at_load",),
        "a --sequence-start model answering other outputs than the step's is refused at load"),
    # ---- serve --workers: forwarding to a sequence's owner -----------------------------------
    Mutation(
        "peers-unknown-output", "gear_runtime/serving/dataplane.py",
        "        model.check_outputs(request)  # the owner answers every output; chosen here",
        "        pass",
        (f"{T_PEERS}::test_an_unknown_output_is_refused_before_the_owner_is_asked",),
        "an unknown output asked of a non-owner worker is the client's 400, not a 500"),
    Mutation(
        "peers-stale-connection", "gear_runtime/serving/peers.py",
        "            if now - since < IDLE_CONNECTION_S and not reader.at_eof() and \\",
        "            if now - since < IDLE_CONNECTION_S and \\",
        (f"{T_PEERS}::test_a_connection_the_owner_closed_is_never_reused",),
        "a pooled connection the owner closed (a restart) is never reused"),
    Mutation(
        "peers-idle-connection", "gear_runtime/serving/peers.py",
        "            if now - since < IDLE_CONNECTION_S and not reader.at_eof() and \\",
        "            if not reader.at_eof() and \\",
        (f"{T_PEERS}::test_a_connection_idle_too_long_is_never_reused",),
        "a pooled connection idle past the owner's keep-alive is never reused"),
    # ---- serve --workers: merged statistics and metrics --------------------------------------
    Mutation(
        "stats-merge-last-inference", "gear_runtime/serving/stats.py",
        '            into["last_inference"] = max(into["last_inference"], m["last_inference"])',
        '            into["last_inference"] = min(into["last_inference"], m["last_inference"])',
        (f"{T_GAPS}::test_worker_statistics_merge_every_field",),
        "the merged statistics' last_inference is the latest worker's"),
    Mutation(
        "stats-merge-ns", "gear_runtime/serving/stats.py",
        '    into["ns"] += add["ns"]',
        '    into["ns"] = add["ns"]',
        (f"{T_GAPS}::test_worker_statistics_merge_every_field",),
        "the merged statistics' durations are every worker's summed"),
    Mutation(
        "stats-merge-inference-count", "gear_runtime/serving/stats.py",
        '            into["inference_count"] += m["inference_count"]',
        '            into["inference_count"] = m["inference_count"]',
        (f"{T_GAPS}::test_worker_statistics_merge_by_model_and_batch_size",),
        "the merged statistics' inference_count is every worker's summed"),
    Mutation(
        "metrics-scrape-own", METRICS,
        "        others = await asyncio.gather(*(self._peer(i) for i in self._others()))\n"
        "        return merge_expositions([body, *others]), CONTENT_TYPE_LATEST",
        "        others = await asyncio.gather(*(self._peer(i) for i in self._others()))\n"
        "        return merge_expositions(others), CONTENT_TYPE_LATEST",
        (T_MERGED_METRICS,),
        "a worker's scrape holds its own series beside the other workers'"),
    Mutation(
        "metrics-exposition-own", METRICS,
        "                  for path in (self._path(i, \"prom\") for i in self._others())]\n"
        "        return merge_expositions([body, *others]), CONTENT_TYPE_LATEST",
        "                  for path in (self._path(i, \"prom\") for i in self._others())]\n"
        "        return merge_expositions(others), CONTENT_TYPE_LATEST",
        (T_MERGED_METRICS,),
        "a worker's exposition holds its own series beside the other workers' snapshots"),
    Mutation(
        "metrics-own-snapshot-once", METRICS,
        "        found.discard(int(str(self.worker)))",
        "        pass",
        (T_MERGED_METRICS,),
        "a worker's own snapshot file is never merged beside its own series (counted twice)"),
    Mutation(
        "metrics-worker-label", METRICS,
        "            body = _with_label(body, \"worker\", self.worker)",
        "            pass",
        (T_MERGED_METRICS,),
        "every series of a worker carries its worker label (sum without(worker) works)"),
    # ---- the executor pool: a run lent to the event loop -------------------------------------
    Mutation(
        "pool-cancelled-waiter", POOL,
        "        future.add_done_callback(lambda f: waiting.end())"
        "  # a cancelled task never starts",
        "        pass",
        (f"{T_POOL}::test_cancelled_waiters_leave_the_queue",),
        "a request cancelled while it waits for an executor leaves the queue (no false 503s)"),
    Mutation(
        "pool-lend-while-waiting", POOL,
        "            if self._running or self._waiting or self.refusing:",
        "            if self._running or self.refusing:",
        (f"{T_POOL}::test_the_executor_is_not_lent_while_a_task_waits_for_it",),
        "the executor is never lent to the loop while a task waits for it (no overtaking)"),
    Mutation(
        "pool-wait-for-lent", POOL,
        "            while self._lent_to is not None:",
        "            while False:",
        (f"{T_POOL}::test_a_worker_waits_for_the_lent_executor_to_come_back",),
        "a worker never runs the executor while it is lent to the loop"),
    # ---- a client that went away -------------------------------------------------------------
    Mutation(
        "http-client-left", "gear_runtime/serving/http.py",
        "            self.answering.cancel()  # a batch drops a request whose client went away",
        "            pass",
        ("tests/test_serving_production.py::test_a_request_whose_client_left_is_not_run",),
        "a request whose client hung up before it ran is not run"),
    Mutation(
        "batcher-client-left", "gear_runtime/serving/batcher.py",
        "                if item.future.done():"
        "  # read across threads: at worst a gone client runs",
        "                if False:",
        ("tests/test_serving_production.py::test_a_request_whose_client_left_is_not_run"
         "[batched]",),
        "a batched request whose client hung up is dropped from its batch"),
    # ---- backends ----------------------------------------------------------------------------
    Mutation(
        "mindir-static-precision", "gear_runtime/backends/mindspore_lite.py",
        "        return replace(spec, precision_mode=precision_mode) if precision_mode else spec",
        "        return spec",
        ("tests/test_precision.py::test_a_static_mindir_keeps_its_configs_precision_mode",),
        "a static MindIR keeps its config's precision_mode in its spec"),
    # ---- check-padding -----------------------------------------------------------------------
    Mutation(
        "padding-verdict-all", "gear_runtime/tools/check/padding.py",
        "        return all(o.safe for o in self.outputs)",
        "        return any(o.safe for o in self.outputs)",
        ("tests/test_padding_check.py::test_mean_over_the_padded_axis_is_flagged",),
        "check-padding says UNSAFE when any output differs"),
    Mutation(
        "padding-verdict-failed", "gear_runtime/tools/check/padding.py",
        "        return self.ignored or (not self.failed and self.shape_mismatch is None)",
        "        return self.ignored or self.shape_mismatch is None",
        ("tests/test_padding_check.py::test_mean_over_the_padded_axis_is_flagged",),
        "an output that differs on a padded sample is UNSAFE"),
)


# ---- running -------------------------------------------------------------------------------
class _Stop(BaseException):
    """SIGTERM: unwind through every finally (the file restored), then exit."""


def _on_sigterm(signum: int, frame: object) -> None:
    raise _Stop


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """Ctrl-C and SIGTERM held off while a file is written: delivered after, never halfway
    through a write (a file cut short)."""
    held = {signal.SIGINT, signal.SIGTERM}
    before = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


def _backup_dir() -> Path:
    path = Path(tempfile.gettempdir()) / "gear-runtime-mutations"
    path.mkdir(exist_ok=True)
    return path


def _restore(path: Path, original: bytes, mutated: bytes, m: Mutation, stat: os.stat_result,
             backup: Path) -> None:
    """``path`` back to ``original`` (byte for byte, with its timestamps) when it still holds
    the mutation alone; when someone edited it meanwhile, the mutation taken back out of
    their text. The backup is removed once the file is verified."""
    current = path.read_bytes()
    if current == mutated:
        path.write_bytes(original)
        os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
        if path.read_bytes() != original:
            raise RuntimeError(f"{path} could not be restored: the original is in {backup}")
    elif current != original:
        new, old = m.new.encode(), m.old.encode()
        if current.count(new) != 1:
            raise RuntimeError(f"{path} changed while mutated and the mutation cannot be "
                               f"taken out of it: the original is in {backup}")
        path.write_bytes(current.replace(new, old, 1))
        print(f"  note: {m.file} was edited while mutated; only the mutation was taken out",
              file=sys.stderr)
    backup.unlink(missing_ok=True)


def _pytest(tests: tuple[str, ...], root: Path, timeout: float) -> tuple[str, float, str]:
    """(outcome of the tests' run, seconds, the last lines of its output)."""
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    if root != ROOT:
        env["PYTHONPATH"] = os.pathsep.join([str(root), env.get("PYTHONPATH", "")]).rstrip(
            os.pathsep)
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider",
           "--no-header", *tests]
    started = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill(proc)
        return "timeout", time.monotonic() - started, ""
    except BaseException:
        _kill(proc)
        raise
    seconds = time.monotonic() - started
    tail = "\n".join(out.decode(errors="replace").strip().splitlines()[-3:])
    if proc.returncode == 0:
        return "passed", seconds, tail
    if proc.returncode in (4, 5):  # usage error (no such test) / nothing collected
        return "bad tests", seconds, tail
    return "failed", seconds, tail


def _kill(proc: subprocess.Popen) -> None:
    """The test run and whatever it started (its own session)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def run_one(m: Mutation, root: Path, timeout: float, baseline: bool) -> tuple[str, float, str]:
    """Apply ``m`` alone under ``root``, run its tests, restore the file: (outcome, seconds,
    output tail)."""
    path = root / m.file
    if not path.is_file():
        return "STALE", 0.0, f"{m.file} is no file (moved?): update the row"
    original = path.read_bytes()
    old, new = m.old.encode(), m.new.encode()
    if original.count(old) != 1:
        return "STALE", 0.0, f"the old text is in {m.file} {original.count(old)} times, not once"
    if baseline:
        result, seconds, tail = _pytest(m.tests, root, timeout)
        if result != "passed":
            return "BAD TESTS", seconds, f"unmutated, the tests {result}:\n{tail}"
    mutated = original.replace(old, new, 1)
    stat = path.stat()
    backup = _backup_dir() / f"{m.id}.{path.name}.orig"
    backup.write_bytes(original)
    try:
        with _signals_held():
            path.write_bytes(mutated)
        result, seconds, tail = _pytest(m.tests, root, timeout)
    finally:
        with _signals_held():
            _restore(path, original, mutated, m, stat, backup)
    outcome = {"failed": "caught", "passed": "SURVIVED", "timeout": "timeout",
               "bad tests": "BAD TESTS"}[result]
    return outcome, seconds, tail


def _isolated_copy() -> Path:
    """A private copy of the tree (what git tracks or would, and the built extension), so
    that nobody else's runs see a mutation."""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT,
                           check=True, capture_output=True).stdout.decode().split("\0")
    files += [str(p.relative_to(ROOT)) for p in (ROOT / "gear_runtime").glob("*.so")]
    target = Path(tempfile.mkdtemp(prefix="gear-runtime-mutations-"))
    for name in filter(None, files):
        src = ROOT / name
        if src.is_file():
            dst = target / name
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst)
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="+", metavar="ID", help="run these mutations")
    parser.add_argument("--sample", type=int, metavar="N", help="run a random N of them")
    parser.add_argument("--seed", type=int, default=None,
                        help="the sample's seed (default: today's date, printed)")
    parser.add_argument("--timeout", type=float, default=120.0,
                        help="seconds one mutation's tests may take (default 120)")
    parser.add_argument("--baseline", action="store_true",
                        help="check each mutation's tests pass unmutated first")
    parser.add_argument("--isolated", action="store_true",
                        help="mutate a private copy of the tree (others' runs see nothing)")
    parser.add_argument("--list", action="store_true", help="list the mutations and exit")
    args = parser.parse_args(argv)

    ids = [m.id for m in MUTATIONS]
    assert len(set(ids)) == len(ids), "mutation ids must be unique"
    chosen = list(MUTATIONS)
    if args.list:
        for m in chosen:
            print(f"{m.id:<34} {m.file}\n{'':<34} {m.behaviour}")
        return 0
    if args.only:
        unknown = sorted(set(args.only) - set(ids))
        if unknown:
            parser.error(f"no mutation {', '.join(unknown)} (--list shows them)")
        chosen = [m for m in MUTATIONS if m.id in args.only]
    if args.sample is not None:
        seed = args.seed if args.seed is not None else \
            int(datetime.date.today().strftime("%Y%m%d"))
        chosen = random.Random(seed).sample(chosen, min(args.sample, len(chosen)))
        print(f"sample of {len(chosen)}, seed {seed} (--seed {seed} repeats it)")

    signal.signal(signal.SIGTERM, _on_sigterm)
    root = _isolated_copy() if args.isolated else ROOT
    rows = []
    try:
        for m in chosen:
            print(f"-- {m.id}: {m.behaviour}", flush=True)
            outcome, seconds, tail = run_one(m, root, args.timeout, args.baseline)
            rows.append((m, outcome, seconds))
            print(f"   {outcome} ({seconds:.0f} s)", flush=True)
            if outcome in ("SURVIVED", "STALE", "BAD TESTS") and tail:
                print("   " + tail.replace("\n", "\n   "), flush=True)
    except (KeyboardInterrupt, _Stop):
        print("interrupted: every file is restored", file=sys.stderr)
        return 130
    finally:
        if root != ROOT:
            shutil.rmtree(root, ignore_errors=True)

    print(f"\n{'mutation':<34} {'outcome':<10} {'s':>4}  behaviour")
    for m, outcome, seconds in rows:
        print(f"{m.id:<34} {outcome:<10} {seconds:>4.0f}  {m.behaviour}")
    bad = [m.id for m, outcome, _ in rows if outcome in ("SURVIVED", "STALE", "BAD TESTS")]
    caught = sum(outcome in ("caught", "timeout") for _, outcome, _ in rows)
    print(f"\n{caught} of {len(rows)} caught" + (f"; failing: {', '.join(bad)}" if bad else ""))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
