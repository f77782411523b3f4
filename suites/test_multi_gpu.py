"""Several GPUs: work sharded one GPU per worker, results independent of the sharding."""

import os

import pytest

from harness import gpus as device
from harness.run.plans import planned_trials
from harness.run.runner import _sample_backend, run
from harness.sampling.sample import device_chunk_elements
from harness.scenarios.catalog import catalog
from harness.scenarios.profiles import get_profile


@pytest.fixture(autouse=True)
def _restore_sharers(monkeypatch):
    """``pin_xdist_worker_gpu`` writes the sharer count into the environment: undone after each test."""
    monkeypatch.setenv(device.SHARERS_ENV, os.environ.get(device.SHARERS_ENV, "1"))


def test_each_xdist_worker_gets_one_of_the_visible_gpus(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw2")
    device.pin_xdist_worker_gpu()
    assert device.visible_gpus() == ["3"]  # gw2 -> the first of two GPUs again


def test_a_single_gpu_is_left_alone(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "7")
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw1")
    device.pin_xdist_worker_gpu()
    assert device.visible_gpus() == ["7"]


@pytest.mark.parametrize(
    "gpus,workers,worker,pinned,sharers",
    [
        ("7", 4, "gw3", "7", 4),  # four workers on one GPU
        ("3,5", 3, "gw0", "3", 2),  # gw0 and gw2 on GPU 3
        ("3,5", 3, "gw1", "5", 1),
        ("3,5", 3, "gw2", "3", 2),
    ],
)
def test_workers_sharing_a_gpu_split_its_memory_budget(monkeypatch, gpus, workers, worker, pinned, sharers):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", gpus)
    monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", str(workers))
    device.pin_xdist_worker_gpu()
    assert device.visible_gpus() == [pinned]
    assert device.gpu_sharers() == sharers
    profile = get_profile("gpu")
    assert device_chunk_elements(profile) == profile.device_chunk_elements // sharers


@pytest.mark.parametrize("sharers,cap", [("1", None), ("4", 0.95 / 4)])
def test_workers_sharing_a_gpu_cap_their_memory(monkeypatch, sharers, cap):
    import torch

    capped = []
    monkeypatch.setenv(device.SHARERS_ENV, sharers)
    monkeypatch.setattr(device, "cuda_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", lambda fraction, *a: capped.append(fraction))
    device.share_gpu_memory()
    assert capped == ([] if cap is None else [cap])


def test_without_a_gpu_a_worker_shares_nothing(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw1")
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "2")
    monkeypatch.delenv(device.SHARERS_ENV)
    device.pin_xdist_worker_gpu()
    assert device.gpu_sharers() == 1


def test_sharded_sampling_returns_every_outcome_in_catalog_order():
    profile = get_profile("smoke")
    scenarios = catalog(profile, 0)[:5]
    work = [(s, min(planned_trials(s, profile)[2], 300)) for s in scenarios]
    one, env = _sample_backend("reference", work, profile, "cpu", False, 60.0, 1, None)
    three, _ = _sample_backend("reference", work, profile, "cpu", False, 60.0, 3, None)
    assert set(env) == {"vllm", "vllm_source", "backend_module", "backend_module_sha256"}  # what the backend loaded with
    assert [o[0] for o in three] == ["tallies"] * len(work)
    for a, b in zip(one, three):
        assert all((x.outcome == y.outcome).all() and x.trials == y.trials for x, y in zip(a[1], b[1]))


def test_several_gpus_need_isolated_cuda_workers():
    profile = get_profile("smoke")
    with pytest.raises(ValueError, match="gpus > 1 needs worker isolation on a CUDA device"):
        run(["reference"], catalog(profile, 0)[:1], profile, gpus=2, device="cpu", isolate=True)


@pytest.mark.gpu
def test_two_gpus_give_the_same_records_as_one():
    """Needs two CUDA devices: the same run sharded over both equals the one-GPU run."""
    import torch

    if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
        pytest.skip("needs two visible CUDA devices (pytest -n pins one GPU per worker: run this test without -n)")
    profile = get_profile("ci")
    scenarios = [s for s in catalog(profile, 0) if s.name in ("standard-near-target", "block-fixed", "synthetic-rates", "greedy-ragged")]
    one = run(["triton"], scenarios, profile, device="cuda", isolate=True, gpus=1)
    two = run(["triton"], scenarios, profile, device="cuda", isolate=True, gpus=2)
    key = [(r.scenario, r.template, r.check, r.verdict, r.statistic, r.p_value) for r in one.records]
    assert key == [(r.scenario, r.template, r.check, r.verdict, r.statistic, r.p_value) for r in two.records]


def test_each_backend_records_the_versions_its_worker_loaded():
    """With NAME@PATH every worker binds its own vLLM tree: the run records each one's versions,
    and the module of the backend's class with its source's SHA-256, in process and isolated."""
    import hashlib

    from harness.backends import load_backend
    from harness.evidence.environment import backend_environment

    expected = backend_environment(load_backend("reference"))
    with open(load_backend.__code__.co_filename, "rb") as f:  # the reference's adapter lives in the registry
        assert (
            expected["backend_module"] == "harness.backends" and expected["backend_module_sha256"] == hashlib.sha256(f.read()).hexdigest()
        )
    profile = get_profile("smoke")
    for isolate in (False, True):
        result = run(["reference"], catalog(profile, 0)[:1], profile, isolate=isolate)
        assert result.backend_environments == {"reference": expected}
