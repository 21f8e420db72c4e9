"""The trial's thresholds (signed, with per-kind defaults; hostile values refused) and its
judge on real tiny encoders: the same package passes, a slower one fails on latency, one
that fails some requests fails on errors, one that answers elsewhere fails on agreement."""

from __future__ import annotations

import json
import math
import random
import threading
from pathlib import Path
from typing import Any

import pytest
from fleet_harness import PERTURBED, live_text, load, releases

from edgeinfer.bridge.ota.release import Release
from edgeinfer.bridge.ota.signing import Signer, TrustedKeys, generate_keypair
from edgeinfer.bridge.ota.trial import TrialModel, Verdict
from edgeinfer.bridge.ota.trial_policy import TrialPolicy, policy_for
from edgeinfer.errors import ConfigError, DeployRefusedError


@pytest.mark.parametrize(
    "bad",
    [{"window_s": math.nan}, {"min_requests": -1}, {"shadow_share": 2}, {"min_cosine": True},
     {"max_p99_ratio": "1.5"}, {"min_shadow": 1.5}, {"window_s": 1e400}, {"nope": 1},
     {"window_s": 100, "max_window_s": 10}],
)  # fmt: skip
def test_hostile_thresholds_are_refused_with_the_name(bad: dict[str, Any]) -> None:
    with pytest.raises(ConfigError, match=next(iter(bad)) if "nope" not in bad else "unknown"):
        policy_for("embed", bad)


def test_each_kind_has_its_defaults_and_signed_values_win() -> None:
    assert policy_for("classify", {}).min_agreement == 0.9
    assert policy_for("embed", {}).min_cosine == 0.98
    assert policy_for("generate", {}).shadow_share == 0.0
    assert policy_for("embed", {"min_cosine": 0.9}).min_cosine == 0.9
    with pytest.raises(ConfigError, match="min_shadow"):
        policy_for("generate", {"min_shadow": 5})


def test_a_signed_trial_that_is_not_thresholds_is_a_bad_signature(tmp_path: Path) -> None:
    key, pub, _ = generate_keypair(tmp_path / "k")
    package = releases(tmp_path / "pkgs", key).good
    record = json.loads((package / "manifest.sig").read_text())
    body = {**record["release"], "trial": {"window_s": "soon"}}
    record = {**Signer.load(key).sign("release", body), "release": body}
    manifest = (package / "manifest.json").read_bytes()
    with pytest.raises(DeployRefusedError) as refused:
        Release.verified(manifest, record, TrustedKeys.load([pub]))
    assert refused.value.reason == "bad_signature"


class _Repeated:
    """A real model that answers each request ``times`` times (real compute, slower)."""

    def __init__(self, model: Any, times: int) -> None:
        self.model, self.times = model, times
        self.task, self.manifest = model.task, model.manifest

    def embed_with_info(self, texts: list[str], *, truncate: bool = True) -> Any:
        for _ in range(self.times - 1):
            self.model.embed_with_info(texts, truncate=truncate)
        return self.model.embed_with_info(texts, truncate=truncate)


class _ThreadClock:
    """Seconds that pass on a thread only when a ``_Costly`` model's call spends them: the
    trial's latencies become what the test says, whatever the machine's load."""

    def __init__(self) -> None:
        self._local = threading.local()

    def __call__(self) -> float:
        return float(getattr(self._local, "now", 0.0))

    def spend(self, seconds: float) -> None:
        self._local.now = self() + seconds


class _Costly:
    """A real model whose every answer takes ``ms`` on ``clock`` (its real compute, nothing)."""

    def __init__(self, model: Any, ms: float, clock: _ThreadClock) -> None:
        self.model, self.ms, self.clock = model, ms, clock
        self.task, self.manifest = model.task, model.manifest

    def embed_with_info(self, texts: list[str], *, truncate: bool = True) -> Any:
        answer = self.model.embed_with_info(texts, truncate=truncate)
        self.clock.spend(self.ms / 1e3)
        return answer


class _Failing(_Repeated):
    """A real model that fails requests with a ``PERTURBED`` word (a fake failure: a real
    package that fails on some inputs only would need a broken graph built for it)."""

    def embed_with_info(self, texts: list[str], *, truncate: bool = True) -> Any:
        if any(w in t.split() for t in texts for w in PERTURBED):
            raise RuntimeError("the graph failed")
        return self.model.embed_with_info(texts, truncate=truncate)


def _judge(
    new: Any, previous: Any, policy: TrialPolicy, requests: int, *, timer: Any = None
) -> Verdict:
    judged = threading.Event()
    seen: list[Verdict] = []

    def on_verdict(trial: TrialModel, verdict: Verdict) -> None:
        seen.append(verdict)
        judged.set()

    timed = {} if timer is None else {"timer_s": timer}
    trial = TrialModel(new, previous, policy=policy, on_verdict=on_verdict, **timed)
    rng = random.Random(3)
    try:
        for _ in range(requests):
            if judged.is_set():
                break
            try:
                trial.embed_with_info([live_text(rng)])
            except RuntimeError:
                pass
        assert judged.wait(60), "no verdict"
    finally:
        trial.close()
    return seen[0]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("trial")
    key, _, _ = generate_keypair(tmp / "k")
    packages = releases(tmp / "pkgs", key)
    return {name: load(getattr(packages, name)) for name in ("origin", "good", "bad")}


POLICY = TrialPolicy(window_s=0.0, max_window_s=60.0, min_requests=30, min_shadow=20,
                     shadow_share=1.0, min_agreement=0.95, min_cosine=0.98)  # fmt: skip


def test_the_same_package_passes(models: dict[str, Any]) -> None:
    verdict = _judge(models["good"], models["origin"], POLICY, 10_000)
    assert verdict.passed and verdict.reason == "passed" and verdict.agreement == 1.0
    assert verdict.requests >= POLICY.min_requests and verdict.shadowed >= POLICY.min_shadow


def test_answers_elsewhere_fail_on_agreement(models: dict[str, Any]) -> None:
    verdict = _judge(models["bad"], models["origin"], POLICY, 10_000)
    assert not verdict.passed and verdict.reason == "trial_agreement"
    assert verdict.agreement is not None and verdict.agreement < POLICY.min_agreement


def test_a_package_four_times_slower_fails_on_latency(models: dict[str, Any]) -> None:
    # Enough requests for the p99 to be judged (100 compared); the answers agree.
    # Each call's time is the test's (4 ms against 1 ms), not this machine's: a loaded CI
    # worker's stalls made the previous package's p99 the larger one.
    policy = TrialPolicy(**{**POLICY.as_dict(), "min_requests": 10_000, "max_p99_ratio": 1.5})
    clock = _ThreadClock()
    slow, quick = _Costly(models["good"], 4.0, clock), _Costly(models["origin"], 1.0, clock)
    verdict = _judge(slow, quick, policy, 10_000, timer=clock)
    assert verdict.reason == "trial_latency", verdict
    assert verdict.p99_new_ms is not None and verdict.p99_old_ms is not None
    assert verdict.p99_new_ms > 1.5 * verdict.p99_old_ms


def test_failing_requests_fail_on_errors(models: dict[str, Any]) -> None:
    verdict = _judge(_Failing(models["good"], 1), models["origin"], POLICY, 10_000)
    assert verdict.reason == "trial_errors" and verdict.errors > 0.02 * verdict.requests


def test_no_traffic_rolls_back_when_the_window_runs_out(models: dict[str, Any]) -> None:
    policy = TrialPolicy(**{**POLICY.as_dict(), "max_window_s": 0.3})
    verdict = _judge(models["good"], models["origin"], policy, 0)
    assert verdict.reason == "trial_no_traffic" and verdict.requests == 0


def test_the_shadow_stays_within_its_share(models: dict[str, Any]) -> None:
    policy = TrialPolicy(**{**POLICY.as_dict(), "shadow_share": 0.1, "min_shadow": 20})
    # Each call costs 1 ms on the test's clock: one slow first call of the previous package on
    # a busy machine had put the measured share past the budget by that call alone.
    clock = _ThreadClock()
    new, old = _Costly(models["good"], 1.0, clock), _Costly(models["origin"], 1.0, clock)
    verdict = _judge(new, old, policy, 100_000, timer=clock)
    assert verdict.passed and verdict.shadow_compute_share is not None
    assert verdict.shadow_compute_share <= 0.1 + 0.05  # one comparison past the budget at most
    assert verdict.shadowed < verdict.requests / 3


def test_sign_trial_options_are_signed_and_bad_ones_exit_2(tmp_path: Path) -> None:
    from edgeinfer.cli import main

    key, _, _ = generate_keypair(tmp_path / "k")
    package = releases(tmp_path / "pkgs", key).good
    sign = ["sign", str(package), "--key", str(key), "--compatible", "plant-gw"]
    assert main([*sign, "--trial-set", "window_s=5", "--trial-set", "min_shadow=30"]) == 0
    release = json.loads((package / "manifest.sig").read_text())["release"]
    assert release["trial"] == {"window_s": 5.0, "min_shadow": 30}
    assert main([*sign, "--trial"]) == 0
    assert json.loads((package / "manifest.sig").read_text())["release"]["trial"] == {}
    for bad in ("window_s=soon", "window_s=nan", "nope=1", "min_shadow=2.5"):
        assert main([*sign, "--trial-set", bad]) == 2, bad
    assert main(sign) == 0  # no trial: commits at the swap, as before
    assert "trial" not in json.loads((package / "manifest.sig").read_text())["release"]
