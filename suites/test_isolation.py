"""Backend isolation: a crash, a hang, a malformed message or an import failure is that
backend's verdict and the run goes on; a hang costs one timeout, not one per scenario;
workers and their children end with a timeout, with the run and when it is interrupted;
a backend's own output goes to its log; two vLLM versions can be verified in one run."""

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from harness.cli import main
from harness.run.plans import planned_trials
from harness.run.runner import Sampling, run
from harness.sampling.worker import backend_log_path, sample_isolated
from harness.scenarios.catalog import catalog
from harness.scenarios.profiles import get_profile
from suites.helpers import MARK, python_only_tree
from suites.isolation_backends import PIDS_ENV

PROFILE = get_profile("smoke")
SCENARIOS = [s for s in catalog(PROFILE) if s.name in ("greedy-ties", "standard-near-target", "block-fixed")]


def verdicts(result, backend):
    return {r.scenario: r.verdict for r in result.records if r.backend == backend}


def messages(result, backend):
    return {r.scenario: r.message for r in result.records if r.backend == backend and r.verdict == "error"}


def test_a_crash_is_the_backends_verdict_and_the_run_goes_on():
    name = "suites.isolation_backends:Crashes"
    result = run([name, "reference"], SCENARIOS, PROFILE, isolate=True)
    assert verdicts(result, name) == {"greedy-ties": "pass", MARK: "error", "block-fixed": "pass"}
    crash = next(r for r in result.records if r.backend == name and r.verdict == "error")
    assert "exit code 3" in crash.message
    assert set(verdicts(result, "reference").values()) == {"pass"}


def test_a_hang_is_killed_after_the_timeout():
    """Scenarios are sampled costliest first: block-fixed, MARK (hangs), greedy-ties (then
    charged without being sampled)."""
    name = "suites.isolation_backends:Hangs"
    t0 = time.perf_counter()
    result = run([name], SCENARIOS, PROFILE, isolate=True, timeout=20)
    assert time.perf_counter() - t0 < 150
    assert verdicts(result, name) == {"greedy-ties": "error", MARK: "error", "block-fixed": "pass"}
    assert "timed out" in messages(result, name)[MARK]
    assert messages(result, name)["greedy-ties"].startswith("not sampled: this backend timed out on an earlier scenario")


def test_an_import_failure_is_a_load_verdict():
    result = run(["no_such_package.mod:Sampler", "reference"], SCENARIOS[:1], PROFILE, isolate=True)
    load = [r for r in result.records if r.check == "load"]
    assert len(load) == 1 and "cannot import" in load[0].message
    assert verdicts(result, "reference") == {"greedy-ties": "pass"}


def test_two_vllm_versions_in_one_run(tmp_path):
    """The installed release and a python-only tree of it, each in its own worker."""
    from harness.backends.vllm import mrv2 as vllm_mrv2

    ok, why = vllm_mrv2.availability()
    if not ok:
        pytest.skip(f"vLLM not usable here: {why}")
    tree = python_only_tree(tmp_path / "tree")
    names = ["vllm-mrv2", f"vllm-mrv2@{tree}"]
    result = run(names, SCENARIOS[:1], PROFILE, isolate=True)
    for name in names:
        assert verdicts(result, name) == {"greedy-ties": "pass"}, [(r.check, r.message) for r in result.records if r.backend == name]


ROOT = Path(__file__).resolve().parent.parent
FIXTURES = "suites.isolation_backends"


def within(seconds, fn, *args, **kw):
    """``fn(*args, **kw)``, failing the test (not hanging it) when it runs past ``seconds``."""
    box = {}

    def call():
        try:
            box["result"] = fn(*args, **kw)
        except BaseException as e:
            box["error"] = e

    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still running after {seconds} s"
    if "error" in box:
        raise box["error"]
    return box["result"]


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie is gone: only its exit status is left)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError):
        return False


def group_members(pgid: int) -> list[int]:
    """The running processes of process group ``pgid``."""
    members = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):  # it ended meanwhile
            continue
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            members.append(int(entry))
    return members


def noted_pids(path: Path, timeout: float = 0.0) -> list[tuple[int, int, int]]:
    """The (worker, its group, its child) lines a backend noted (``isolation_backends``),
    waiting up to ``timeout`` seconds for the first."""
    deadline = time.monotonic() + timeout
    while True:
        lines = path.read_text().splitlines() if path.exists() else []
        if lines or time.monotonic() >= deadline:
            return [tuple(int(x) for x in line.split()) for line in lines]
        time.sleep(0.05)


def all_gone(pids, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not any(alive(p) for p in pids)


def kill_leftovers(noted) -> None:
    """Kill what a failing test left running, one process at a time (a worker that did not
    lead its own group shares the test's group)."""
    for worker, _, child in noted:
        for pid in (worker, child):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.mark.parametrize("kind", ["WritesGarbage", "SendsNonTuple", "SendsWrongTag", "SendsBadTallies"])
def test_a_malformed_message_is_that_scenarios_error_and_the_run_goes_on(kind):
    """Bytes written into the worker's pipe, or a message that is not the protocol's, are that
    scenario's error (the worker killed, a fresh one takes the rest); other backends keep theirs."""
    name = f"{FIXTURES}:{kind}"
    result = within(90, run, [name, "reference"], SCENARIOS, PROFILE, isolate=True, timeout=30)
    assert verdicts(result, name) == {"greedy-ties": "pass", MARK: "error", "block-fixed": "pass"}
    assert "malformed message" in messages(result, name)[MARK]
    assert set(verdicts(result, "reference").values()) == {"pass"}


def test_a_timeout_ends_the_backends_children_with_its_worker(tmp_path, monkeypatch):
    pids = tmp_path / "pids"
    monkeypatch.setenv(PIDS_ENV, str(pids))
    name = f"{FIXTURES}:SpawnsAndHangs"
    result = within(60, run, [name], SCENARIOS, PROFILE, isolate=True, timeout=2)
    noted = noted_pids(pids)
    try:
        assert verdicts(result, name)[MARK] == "error" and len(noted) == 1
        worker, group, child = noted[0]
        assert group == worker  # the worker leads a group of its own
        assert all_gone([worker, child]) and group_members(group) == []
    finally:
        kill_leftovers(noted)


def test_the_backends_children_end_with_the_run(tmp_path, monkeypatch):
    pids = tmp_path / "pids"
    monkeypatch.setenv(PIDS_ENV, str(pids))
    name = f"{FIXTURES}:SpawnsAtLoad"
    result = within(60, run, [name], SCENARIOS[:1], PROFILE, isolate=True, timeout=30)
    noted = noted_pids(pids)
    try:
        assert set(verdicts(result, name).values()) == {"pass"} and len(noted) == 1
        assert all_gone([noted[0][2]])
    finally:
        kill_leftovers(noted)


@pytest.mark.parametrize("signum, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)], ids=["SIGTERM", "SIGINT"])
def test_a_signal_to_the_run_ends_its_workers_and_their_children(signum, code, tmp_path):
    """``python -m harness run`` stopped by SIGTERM (or SIGINT, as Ctrl-C sends it) while its
    worker hangs: one line, no traceback, exit 128 + signal; the worker's group is gone and
    nothing half-written is left in --out."""
    pids, out = tmp_path / "pids", tmp_path / "out"
    cmd = [sys.executable, "-m", "harness", "run", "--backend", f"{FIXTURES}:SpawnsAndHangsAlways", "--profile", "smoke"]
    cmd += ["--scenario", "greedy-ties", "--scenario", "block-fixed", "--out", str(out), "--no-progress", "--timeout", "300"]
    env = dict(os.environ, **{PIDS_ENV: str(pids)})
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    noted = []
    try:
        noted = noted_pids(pids, timeout=90)
        assert noted, "the backend never sampled"
        t0 = time.monotonic()
        proc.send_signal(signum)
        stdout, stderr = proc.communicate(timeout=30)
        assert time.monotonic() - t0 < 10
        assert proc.returncode == code, stderr
        assert "Traceback" not in stdout + stderr
        lines = [line for line in stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("interrupted"), stderr
        worker, group, child = noted[0]
        assert group == worker
        assert all_gone([worker, child]) and group_members(group) == []
        assert not list(out.rglob(".tmp-*"))  # nothing half-written (an --out never made has none)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        kill_leftovers(noted)


def test_after_a_timeout_the_backends_other_scenarios_are_charged_at_once():
    """A backend that hangs on every scenario costs one timeout, not one per scenario."""
    name = f"{FIXTURES}:HangsAlways"
    timeout = 5
    t0 = time.perf_counter()
    result = within(60, run, [name], SCENARIOS, PROFILE, isolate=True, timeout=timeout)
    assert time.perf_counter() - t0 < 3 * timeout  # three hangs waited out take at least that
    first = "block-fixed"  # sampled first: the costliest
    why = messages(result, name)
    assert set(why) == {s.name for s in SCENARIOS}
    assert "timed out" in why[first]
    for scenario, message in why.items():
        if scenario != first:
            assert message == f"not sampled: this backend timed out on an earlier scenario ({first}, after {timeout} s)"


def test_a_streaming_worker_that_hangs_holding_several_charges_the_one_that_hangs_alone():
    """The items a hung streaming worker held are sampled again one at a time (any of them may
    have hung it); the one that hangs alone is charged with the timeout, the rest at once."""
    order = ["greedy-ties", MARK, "block-fixed"]
    work = [(s, planned_trials(s, PROFILE)[2]) for name in order for s in SCENARIOS if s.name == name]
    stream = sample_isolated("suites.isolation_backends:Hangs", iter(work), PROFILE, "cpu", 2, stream=True)
    got = within(60, lambda: [(s.name, o) for s, o in stream if s is not None])
    assert [(name, o[0]) for name, o in got] == [("greedy-ties", "tallies"), (MARK, "error"), ("block-fixed", "error")]
    assert "timed out" in got[1][1][1]
    assert got[2][1][1] == f"not sampled: this backend timed out on an earlier scenario ({MARK}, after 2 s)"


def test_a_load_that_hangs_is_bounded_by_the_timeout():
    result = within(60, run, ["suites.isolation_hangs_at_import:sample", "reference"], SCENARIOS[:1], PROFILE, isolate=True, timeout=3)
    load = [r for r in result.records if r.check == "load"]
    assert len(load) == 1 and "timed out" in load[0].message and "3 s" in load[0].message
    assert verdicts(result, "reference") == {"greedy-ties": "pass"}


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf"])
def test_the_timeout_must_be_a_positive_number_of_seconds(value, tmp_path, capsys):
    argv = ["run", "--profile", "smoke", "--scenario", "greedy-ties", "--no-progress", "--out", str(tmp_path), f"--timeout={value}"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--timeout" in err[0]
    assert not (tmp_path / "results.json").exists()


def test_a_backends_output_goes_to_its_log_file(tmp_path, capfd):
    """Its prints and its writes to descriptors 1 and 2, at import and in ``sample``, are in
    ``{log_dir}/backends/NAME.log``, not in the tool's output."""
    name = "suites.isolation_noisy:Noisy"
    scenarios = SCENARIOS[:2]
    work = [(s, planned_trials(s, PROFILE)[2]) for s in scenarios]
    sampling = Sampling(name, len(work), work.__getitem__, PROFILE, "cpu", True, 30, log_dir=str(tmp_path))
    within(60, sampling.join)
    assert [o[0] for o in sampling.outcomes] == ["tallies"] * len(work)
    captured = capfd.readouterr()
    assert "noisy" not in captured.out + captured.err
    log = Path(backend_log_path(str(tmp_path), name)).read_text()
    for line in ("print at import", "fd 2 at import", "print in sample", "stderr in sample", "fd 1 in sample", "fd 2 in sample"):
        assert f"noisy: {line}" in log


def test_backend_log_names_are_safe_and_distinct(tmp_path):
    names = ["reference", "vllm-mrv2@/opt/vllm 0.19/../x", "pkg.mod:Sampler", "pkg.mod_Sampler", "../../etc/passwd", "é:π"]
    paths = [backend_log_path(str(tmp_path), n) for n in names]
    assert len(set(paths)) == len(names)
    for path in paths:
        assert os.path.dirname(path) == str(tmp_path / "backends") and os.path.isdir(os.path.dirname(path))
        base = os.path.basename(path)
        assert (
            base.endswith(".log")
            and not base.startswith(".")
            and set(base) <= set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")
        )
