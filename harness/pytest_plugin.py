"""pytest plugin (entry point ``pytest11``, name ``specdec``): verify a sampler from any repository.

    pytest --specdec-backend mykernels.sampler:Sampler --specdec-profile smoke

adds one test per (scenario, template, check) of the profile's catalog, named
``specdec[BACKEND]::SCENARIO[TEMPLATE][CHECK]`` and marked ``specdec`` and ``exact`` or
``statistical`` (``-m exact`` runs the exact checks alone), and one ``coverage`` test per
backend, which fails when no check was evaluated. The backend is sampled once per session,
in worker processes, by the runner ``python -m harness run`` uses: the verdicts and
reproducers are the CLI's, and a failing test shows its reproducer. The run's seed is in the
header. Options: ``--specdec-backend`` (repeatable), ``--specdec-profile`` (default smoke),
``--specdec-seed`` (default 0), ``--specdec-device`` (cpu or cuda), ``--specdec-timeout``.
"""

import pytest

MARKERS = {
    "specdec": "a verification test added by the specdec-verify plugin",
    "exact": "an exact check: any deviation from the law fails it",
    "statistical": "a statistical check at the profile's alpha, with its stated power",
}


def pytest_addoption(parser):
    group = parser.getgroup("specdec", "speculative-decoding verification (specdec-verify)")
    group.addoption(
        "--specdec-backend", action="append", default=[], help="backend to verify: pkg.mod:Sampler or a built-in name (repeatable)"
    )
    group.addoption("--specdec-profile", default="smoke", help="profile: smoke, ci, gpu or nightly (default: smoke)")
    group.addoption("--specdec-seed", type=int, default=0, help="the run's seed; the same seed gives the same counts (default: 0)")
    group.addoption("--specdec-device", default="cpu", choices=("cpu", "cuda"), help="device for the backends (default: cpu)")
    group.addoption("--specdec-timeout", type=float, default=900.0, help="seconds a backend may load or sample one scenario (default: 900)")


def pytest_configure(config):
    for name, text in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {text}")


def pytest_report_header(config):
    backends = config.getoption("--specdec-backend")
    seed = config.getoption("--specdec-seed")
    if not backends:
        return f"specdec: seed={seed} (no --specdec-backend: no verification tests added)"
    return f"specdec: backends={backends} profile={config.getoption('--specdec-profile')} seed={seed}"


@pytest.hookimpl(tryfirst=True)  # before -m / -k deselect: the added tests are selectable
def pytest_collection_modifyitems(session, config, items):
    backends = config.getoption("--specdec-backend")
    if not backends:
        return
    from harness.backends import check_backend_name
    from harness.run.plans import planned_trials
    from harness.scenarios.catalog import catalog
    from harness.scenarios.profiles import get_profile
    from harness.scenarios.scenario import check_seed

    try:
        for name in backends:
            check_backend_name(name)
        profile = get_profile(config.getoption("--specdec-profile"))
        seed = check_seed(config.getoption("--specdec-seed"), "--specdec-seed")
    except ValueError as e:
        raise pytest.UsageError(str(e)) from None
    scenarios = catalog(profile, seed)
    plans = [(s, planned_trials(s, profile)[1]) for s in scenarios]
    verification = Verification(config, backends, scenarios, profile, seed)
    for backend in backends:
        collector = BackendCollector.from_parent(session, name=f"specdec[{backend}]")
        for scenario, planned in plans:
            for check in planned:
                item = CheckItem.from_parent(
                    collector,
                    name=f"{scenario.name}[{check.template}][{check.name}]",
                    verification=verification,
                    key=(backend, scenario.name, check.template, check.name),
                )
                for mark in ("specdec", "statistical" if check.kind == "statistical" else "exact"):
                    item.add_marker(mark)
                items.append(item)
        coverage = CoverageItem.from_parent(collector, name="coverage", verification=verification, backend=backend)
        coverage.add_marker("specdec")
        items.append(coverage)


class BackendCollector(pytest.Collector):
    def collect(self):
        return []


class Verification:
    """The session's one run of every backend, sampled when its first test runs."""

    def __init__(self, config, backends, scenarios, profile, seed):
        self._config, self._backends, self._scenarios, self._profile, self._seed = config, backends, scenarios, profile, seed
        self._result, self._records = None, {}

    def result(self):
        if self._result is None:
            from harness.run.runner import run

            config = self._config
            self._result = run(
                self._backends, self._scenarios, self._profile, self._seed, config.getoption("--specdec-device"),
                isolate=True, timeout=config.getoption("--specdec-timeout"),
            )  # fmt: skip
            for r in self._result.records:
                self._records.setdefault(r.backend, {})[(r.scenario, r.template, r.check)] = r
        return self._result

    def record(self, key):
        """The record of ``key`` = (backend, scenario, template, check); else the error that
        stopped its scenario or its backend."""
        backend, scenario = key[0], key[1]
        self.result()
        records = self._records.get(backend, {})
        if key[1:] in records:
            return records[key[1:]]
        return next((r for r in records.values() if r.verdict == "error" and r.scenario in (scenario, "-")), None)


class CheckItem(pytest.Item):
    def __init__(self, *, verification, key, **kwargs):
        super().__init__(**kwargs)
        self.verification, self.key = verification, key

    def runtest(self):
        r = self.verification.record(self.key)
        if r is None:
            pytest.fail(f"no record for {self.key}: the run did not reach this check", pytrace=False)
        if r.verdict == "skipped":
            pytest.skip(r.message)
        if r.verdict != "pass":
            pytest.fail(f"{r.verdict}: {r.message}\nreproducer: {r.reproducer}", pytrace=False)

    def reportinfo(self):
        return self.path, None, self.name


class CoverageItem(pytest.Item):
    def __init__(self, *, verification, backend, **kwargs):
        super().__init__(**kwargs)
        self.verification, self.backend = verification, backend

    def runtest(self):
        result = self.verification.result()
        unverified = [line for line in result.unverified() if line.startswith(f"{self.backend}: ")]
        if unverified:  # every check skipped or errored is no pass
            pytest.fail(unverified[0], pytrace=False)

    def reportinfo(self):
        return self.path, None, self.name
