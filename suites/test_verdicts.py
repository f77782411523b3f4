"""A verdict cannot be faked by a misbehaving backend: a run that verified nothing is no
pass, a check with nothing to test is never a pass, ids that are not integers are a
structure failure, a declined request does not hide the rest of its batch, and the run's
outputs are written before nothing is lost (``suites/verdict_backends.py`` misbehaves)."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.cli import EXIT_UNVERIFIED, main
from harness.run.runner import run
from harness.scenarios.catalog import catalog
from harness.scenarios.profiles import get_profile

ROOT = Path(__file__).resolve().parent.parent
PROFILE = get_profile("smoke")
SCENARIOS = {s.name: s for s in catalog(PROFILE)}
B = "suites.verdict_backends:"


def records(backend, *names):
    result = run([B + backend], [SCENARIOS[n] for n in names], PROFILE)
    return result, [r for r in result.records if r.backend == B + backend]


def cli(tmp_path, *args):
    out = tmp_path / "out"
    code = main(["run", "--profile", "smoke", "--out", str(out), "--no-progress", "--in-process", *args])
    return code, out


def test_a_run_that_verified_nothing_exits_non_zero(tmp_path, capsys):
    code, out = cli(tmp_path, "--backend", B + "DeclinesAll", "--scenario", "greedy-ties", "--scenario", "standard-sampled")
    text = capsys.readouterr().out
    assert code == EXIT_UNVERIFIED == 3
    assert "verified nothing: 0 of" in text and "this sampler is not finished" in text and "0%" in text
    doc = json.loads((out / "results.json").read_text())
    assert doc["coverage"][B + "DeclinesAll"]["evaluated"] == 0 and doc["coverage"][B + "DeclinesAll"]["planned"] > 0


def test_the_share_of_checks_verified_is_reported(tmp_path, capsys):
    code, out = cli(tmp_path, "--backend", B + "DeclinesSynthetic", "--scenario", "synthetic-mixed-batch", "--scenario", "greedy-ties")
    assert code == 0
    coverage = json.loads((out / "results.json").read_text())["coverage"][B + "DeclinesSynthetic"]
    assert 0 < coverage["evaluated"] < coverage["planned"]
    assert f"{100 * coverage['share']:.0f}%" in capsys.readouterr().out


def test_pytest_fails_a_backend_that_verified_nothing():
    cmd = [sys.executable, "-m", "pytest", "suites/test_backends.py::test_user_backend", "-q", "-p", "no:cacheprovider"]
    cmd += ["--profile", "smoke", "--backend", B + "DeclinesAll"]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 1 and "verified nothing" in done.stdout, done.stdout[-2000:]


@pytest.mark.parametrize("backend,returned", [("TruthySupports", "5"), ("EmptySupports", "''")])
def test_supports_off_protocol_is_a_protocol_error_naming_the_backend(backend, returned):
    result, mine = records(backend, "greedy-ties")
    assert [r.verdict for r in mine] == ["error"]
    assert "supports() returned " + returned in mine[0].message and "expected None or a non-empty reason" in mine[0].message
    assert result.failed


def test_a_check_with_no_valid_trial_is_never_a_pass():
    _, mine = records("AllMalformed", "standard-sampled", "greedy-ties", "synthetic-rates", "block-fixed")
    structure = [r for r in mine if r.check == "structure"]
    assert structure and all(r.verdict == "fail" for r in structure)
    others = [r for r in mine if r.check != "structure"]
    assert others and all(r.verdict == "skipped" and "not evaluated: no valid trial" in r.message for r in others)


@pytest.mark.parametrize(
    "backend,named",
    [
        ("FloatTokens", "tokens: dtype float32"),
        ("StringTokens", "tokens: dtype <U"),
        ("NanTokens", "tokens: dtype float64"),
        ("HugeUnsignedTokens", "value 18446744073709551615"),
        ("FloatCounts", "num_emitted: dtype float64"),
    ],
)
def test_outputs_that_are_not_integer_ids_fail_structure_naming_why(backend, named):
    result, mine = records(backend, "standard-sampled")
    structure = [r for r in mine if r.check == "structure"]
    assert structure and all(r.verdict == "fail" and named in r.message for r in structure), [r.message for r in structure]
    assert not any(r.verdict == "pass" for r in mine)
    assert result.failed


def test_a_declined_request_leaves_the_rest_of_its_batch_verified():
    _, mine = records("DeclinesSynthetic", "synthetic-mixed-batch")
    by_template = {}
    for r in mine:
        by_template.setdefault(r.template, set()).add(r.verdict)
    assert by_template == {0: {"skipped"}, 1: {"pass"}, 2: {"pass"}}  # template 0 is the synthetic request
    assert all("declined by the backend: no synthetic mode" in r.message for r in mine if r.template == 0)


def test_requests_a_backend_takes_only_apart_are_sampled_apart():
    _, mine = records("OneMethodACall", "synthetic-mixed-batch")
    assert mine and {r.verdict for r in mine} == {"pass"}


def test_a_backend_whose_outputs_differ_for_the_same_inputs_is_flagged(tmp_path, capsys):
    code, out = cli(tmp_path, "--backend", B + "Unrepeatable", "--backend", "reference", "--scenario", "standard-sampled")
    text = capsys.readouterr().out
    assert code == 0  # its law is the reference's: flagged, not failed
    assert f"{B}Unrepeatable is not repeatable" in text and "reference is not repeatable" not in text
    assert json.loads((out / "results.json").read_text())["unrepeatable"] == {B + "Unrepeatable": ["standard-sampled"]}


def test_the_summary_says_why_a_backend_errored(tmp_path, capsys):
    code, _ = cli(tmp_path, "--backend", B + "Errors", "--scenario", "greedy-ties")
    assert code == 1
    assert "error: RuntimeError: kernel launch failed: out of shared memory" in capsys.readouterr().out


def test_a_reproducer_carries_the_pythonpath_its_backend_needed(tmp_path):
    package = tmp_path / "site" / "mykernels"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sampler.py").write_text("from reference.sampler import ReferenceSampler as Sampler\n")
    out = tmp_path / "out"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path / "site"), str(ROOT)]))
    cmd = [sys.executable, "-m", "harness", "run", "--backend", "mykernels.sampler:Sampler", "--profile", "smoke"]
    cmd += ["--scenario", "greedy-ties", "--out", str(out), "--no-progress"]
    done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    repro = json.loads((out / "results.json").read_text())["records"][0]["reproducer"]
    assert repro.startswith(f"PYTHONPATH={tmp_path / 'site'} python -m harness run --backend mykernels.sampler:Sampler")
    again = subprocess.run(
        repro.replace("python -m", f"{sys.executable} -m", 1) + f" --out {tmp_path / 'again'} --no-progress",
        shell=True, cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert again.returncode == 0, again.stderr


@pytest.mark.parametrize("out", ["/dev/null", "{file}", "{file}/below"])
def test_a_bad_out_is_refused_before_sampling(tmp_path, capsys, out):
    (tmp_path / "file").write_text("x")
    out = out.format(file=tmp_path / "file")
    t0 = time.perf_counter()
    code = main(["run", "--profile", "smoke", "--out", out, "--no-progress", "--in-process"])
    assert code == 2 and time.perf_counter() - t0 < 10  # the whole smoke catalog takes longer than that
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: --out ")


def test_a_failed_write_still_prints_the_summary_and_verdict(tmp_path, capsys, monkeypatch):
    import harness.evidence.files

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(harness.evidence.files, "write_unit", full_disk)
    monkeypatch.setattr("harness.report.outputs.write_unit", full_disk)
    code, _ = cli(tmp_path, "--scenario", "greedy-ties")
    captured = capsys.readouterr()
    assert code == 2
    assert "verdict: pass" in captured.out and "reference" in captured.out
    assert "could not be written" in captured.err and "No space left on device" in captured.err


def test_outputs_are_one_unit_an_interrupted_write_leaves_the_previous_run(tmp_path, monkeypatch):
    from harness.evidence import files

    out = tmp_path / "out"
    files.write_unit(str(out), {"results.json": "old\n", "index.html": "old\n", "scenarios/a.json": "old\n"}, ("scenarios",))
    real_open = open
    writes = []

    def interrupted(path, mode="r", *args, **kwargs):
        if "w" in mode and ".tmp-run-" in str(path):
            writes.append(path)
            if len(writes) == 2:  # results.json staged, index.html not yet
                raise KeyboardInterrupt
        return real_open(path, mode, *args, **kwargs)

    monkeypatch.setattr("builtins.open", interrupted)
    with pytest.raises(KeyboardInterrupt):
        files.write_unit(str(out), {"results.json": "new\n", "index.html": "new\n", "scenarios/b.json": "new\n"}, ("scenarios",))
    monkeypatch.undo()
    assert sorted(os.listdir(out)) == ["index.html", "results.json", "scenarios"]  # no temporary file left
    assert {(out / f).read_text() for f in ("results.json", "index.html")} == {"old\n"}
    files.write_unit(str(out), {"results.json": "new\n", "index.html": "new\n", "scenarios/b.json": "new\n"}, ("scenarios",))
    assert os.listdir(out / "scenarios") == ["b.json"]  # an earlier run's scenario file does not linger


@pytest.mark.parametrize("rel", ["../x.json", "/tmp/x.json", "scenarios/../../x.json"])
def test_no_output_path_leaves_the_output_folder(tmp_path, rel):
    from harness.evidence import files

    with pytest.raises(ValueError, match="not inside the output folder"):
        files.write_unit(str(tmp_path / "out"), {rel: "x"})
    assert not (tmp_path / "x.json").exists() and not (tmp_path / "out").exists()


def test_a_backends_own_output_goes_to_a_log_under_out(tmp_path, capfd):
    out = tmp_path / "out"
    code = main(
        ["run", "--profile", "smoke", "--backend", "suites.isolation_noisy:Noisy", "--scenario", "greedy-ties"]
        + ["--out", str(out), "--no-progress"]
    )
    captured = capfd.readouterr()
    assert code == 0 and "noisy: " not in captured.out + captured.err
    (log,) = (out / "backends").iterdir()
    assert "noisy: fd 2 in sample" in log.read_text() and "noisy: print at import" in log.read_text()


def test_repeatability_is_asked_of_device_batch_backends_too():
    scenarios = [SCENARIOS["standard-sampled"]]
    result = run([B + "UnrepeatableOnDevice", B + "RepeatableOnDevice"], scenarios, PROFILE)
    assert result.unrepeatable == {B + "UnrepeatableOnDevice": ["standard-sampled"]}
