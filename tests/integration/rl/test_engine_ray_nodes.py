"""A vLLM engine in a Ray actor on a second node of a Ray cluster simulated on this machine.

Two raylets on 127.0.0.1 (``ray.cluster_utils.Cluster``): the head has the CPU the rollout actor takes,
the second node has no CPU and one ``engine`` resource, so the engine actor (``engine_placement = "ray"``,
``engine_resources = {engine = 1}``) can only land there. Through the same :class:`RayWorkers` wiring the
trainer uses, the driver syncs it (safetensors bytes through Ray) and then scores like the trainer within
1e-4 and decodes greedily token for token as HF does; a rollout actor on the head samples from it through
its router, token-exact with the driver's own router; every listener is on loopback; killing the engine
actor ends its server and frees its ``/dev/shm``; closing leaves no process of the cluster.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import time

import pytest
import torch

from cadenza.executor import ExecutorConfig
from cadenza.executor.reaper import shm_mapped
from cadenza.rl.engines.policy import HFPolicy, SampleRequest, SamplingParams
from cadenza.rl.engines.vllm_server import _group_pids
from cadenza.rl.text.chat import load_tokenizer
from cadenza.rl.train.local_engine import ray_engines
from cadenza.rl.train.ray_workers import RayWorkers
from cadenza.rl.train.workers import LocalWorkers
from tests.support.engine_helpers import TOL, hf_logprobs, requires_vllm, train_step
from tests.support.ray_cluster import listeners, loopback_cluster
from tests.support.rl_fixtures import config, step_units

# its own lane (a worker process of its own): its simulated cluster imports Ray in-process, and a later
# private cluster in the same process then listened on every interface (seen in CI)
pytestmark = [pytest.mark.slow, pytest.mark.serial("nodes"), requires_vllm, pytest.mark.requires("ray")]

LOOPBACK = {"127.0.0.1", "::ffff:127.0.0.1", "::1"}
GREEDY = SamplingParams(max_new_tokens=24, temperature=0.0)


@torch.no_grad()
def _hf_greedy(policy: HFPolicy, prompt: list[int], n: int) -> list[int]:
    """The trainer's own greedy decode (argmax of each next-token distribution), the reference."""
    ids = list(prompt)
    for _ in range(n):
        ids.append(int(policy.model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt) :]


def _alive_children() -> list[str]:
    import psutil

    left = []
    for p in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if p.status() != psutil.STATUS_ZOMBIE:
                left.append(f"{p.pid} {p.name()}")
    return left


def _rss_mib(engine_group: list[int]) -> dict[str, float]:
    """Resident memory (MiB, shared pages counted per process: an upper bound) of the engine's server
    group and of this process with everything below it (both nodes' Ray processes, the actors)."""
    import psutil

    me = psutil.Process()
    procs = [me, *me.children(recursive=True)]
    rss = {}
    for p in procs:
        with contextlib.suppress(psutil.Error):
            rss[p.pid] = p.memory_info().rss / 2**20
    return {
        "rss_mib_engine_server": sum(v for k, v in rss.items() if k in set(engine_group)),
        "rss_mib_all": sum(rss.values()),
    }


def _episodes(results) -> list[tuple]:
    return [
        (e.rollout.tokens.group_id, list(e.rollout.tokens.input_ids), e.policy_version)
        for eps in results
        for e in eps
    ]


@pytest.fixture(scope="module")
def cluster():
    """One simulated two-node cluster for both tests (a start is 15-40 s); once it is stopped, no process
    of it, of the engines or of the actors is left."""
    t0 = time.monotonic()
    with loopback_cluster({"num_cpus": 1}, {"num_cpus": 0, "resources": {"engine": 1}}) as (cluster, ids):
        yield cluster, ids, time.monotonic() - t0
    deadline = time.monotonic() + 30
    while _alive_children() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not _alive_children(), f"processes left behind: {_alive_children()}"


def test_engine_actor_on_a_second_node_syncs_to_parity_and_serves_rollout_actors(
    cluster, sft_model_32, tmp_path
):
    import ray

    cluster, ids, figures_start = cluster

    cfg = config(sft_model_32, tmp_path / "run", steps=1)
    cfg.rollout = dataclasses.replace(
        cfg.rollout, engine="vllm", engine_placement="ray", engine_resources={"engine": 1}, executor="ray",
        workers=1, engine_timeout_s=300,
        engine_options={"max_model_len": 1024, "kv_cache_gib": 1, "startup_timeout_s": 900},
    )  # fmt: skip
    tok = load_tokenizer(str(sft_model_32))
    policy = HFPolicy.from_pretrained(sft_model_32)
    policy.model.eval()
    text = tok.apply_chat_template(
        [{"role": "user", "content": "Add 2 and 3 with the tools, then submit."}],
        add_generation_prompt=True,
        tokenize=False,
    )
    prompt = list(tok.encode(text, add_special_tokens=False))
    figures: dict[str, float] = {"cluster_start_s": figures_start}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    t0 = time.monotonic()
    try:
        head, second = ids
        t1 = time.monotonic()
        workers = RayWorkers(
            cfg, 1, ExecutorConfig(kind="ray", ray_address=cluster.address, workers=1), timeout_s=300,
            engines=lambda: ray_engines(cfg, policy, tok), tokenizer=tok,
        )  # fmt: skip
        figures["engine_and_actor_start_s"] = time.monotonic() - t1
        server = None
        try:
            (engine,) = workers.served.engines
            driver = ray.get_runtime_context().get_node_id()
            assert engine.node_id == second and driver == head, (engine.info, driver, ids)
            server = engine.info["server_pid"]
            group = _group_pids(server)
            assert group, "the engine's server is not running"
            shm = shm_mapped(group)

            # a real update; before the sync the engine does not score like the trainer, after it does
            seqs = [prompt + _hf_greedy(policy, prompt, 8), list(range(5, 60))]
            train_step(policy, seqs, lr=0.1)
            new = [hf_logprobs(policy, s) for s in seqs]
            before = [torch.tensor(x) for x in engine.score(seqs)]
            assert max(float((b - n).abs().max()) for b, n in zip(before, new, strict=True)) > 10 * TOL
            t2 = time.monotonic()
            workers.sync(policy.model.named_parameters(), version=1)
            figures["sync_s"] = time.monotonic() - t2
            assert engine.version == workers.version == 1
            after = [torch.tensor(x) for x in engine.score(seqs)]
            gap = max(float((a - n).abs().max()) for a, n in zip(after, new, strict=True))
            assert gap <= TOL, gap
            figures["logprob_gap"] = gap

            greedy = engine.sample(SampleRequest([prompt], GREEDY))
            assert greedy[0].token_ids == _hf_greedy(policy, prompt, 24)  # token-exact with the trainer
            assert greedy[0].policy_version == 1

            # the rollout actor (on the head: the engine node has no CPU) reaches the engine through its
            # router; the driver's own router over the same actor samples the same tokens
            units = step_units(cfg, steps=(1,))
            t3 = time.monotonic()
            got = _episodes(workers.run(units))
            figures["rollout_s"] = time.monotonic() - t3
            assert len(got) == len(units) * cfg.rollout.group_size and {v for *_, v in got} == {1}
            assert workers.counts.retried == workers.counts.lost == 0
            local = LocalWorkers(cfg, engines=[engine], tokenizer=tok)
            assert _episodes(local.run(units)) == got

            figures.update(_rss_mib(group))
            seen = listeners()
            port = int(engine.base_url.rsplit(":", 1)[1])
            assert port in {p for _, p, _ in seen}, seen  # the engine's server is among them
            assert sum("raylet" in n for _, _, n in seen) >= 1, seen
            assert {ip for ip, _, _ in seen} <= LOOPBACK, seen

            # ``ray.kill`` of the engine actor without ``close()``: Ray SIGKILLs the actor and its direct
            # children (the server's supervisor, which so gets no chance to stop the server); the server
            # follows its supervisor's death (``PR_SET_PDEATHSIG``) and stops cleanly. Before, it was
            # left serving, an orphan of init, with its engine core (found by this test). close() then
            # still ends everything else.
            ray.kill(engine.actor, no_restart=True)
            deadline = time.monotonic() + 60
            while _group_pids(server) and time.monotonic() < deadline:
                time.sleep(0.5)
            assert not _group_pids(server), "the engine's server outlived its actor"
            assert not [f for f in shm if os.path.exists(f)], f"/dev/shm segments left: {shm}"
        finally:
            if server is not None and _group_pids(server):  # a failed check must not leave it running
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(server, signal.SIGKILL)
            workers.close()
        assert server is not None and not _group_pids(server), "the engine's server outlived close()"
        assert not [f for f in shm if os.path.exists(f)], f"/dev/shm segments left: {shm}"
    finally:
        torch.set_num_threads(threads)
    figures["total_s"] = time.monotonic() - t0
    print(json.dumps({k: round(v, 6 if k == "logprob_gap" else 1) for k, v in figures.items()}))


def test_cadenza_train_with_the_engine_on_the_second_node_trains_and_leaves_nothing(
    cluster, sft_model_32, tmp_path
):
    """``cadenza train`` with ``executor = "local"`` and ``engine_placement = "ray"``: the trainer joins
    the cluster, its engine actor lands on the second node, every update is synced through Ray and
    checked by the parity probe (``sync_probe_tol``), and the run ends with nothing left running (its
    engine's server here, every process once the cluster stops: the ``cluster`` fixture)."""
    from cadenza.rl.train.trainer import Trainer

    cluster, ids, _ = cluster
    cfg = config(sft_model_32, tmp_path / "run", steps=2, lambda_sd=1.0)
    cfg.rollout = dataclasses.replace(
        cfg.rollout, engine="vllm", engine_placement="ray", engine_resources={"engine": 1},
        ray_address=cluster.address, engine_timeout_s=300, sync_probe_tol=1e-3,
        engine_options={"max_model_len": 1024, "kv_cache_gib": 1, "startup_timeout_s": 900},
    )  # fmt: skip
    trainer = Trainer(cfg)
    server = None
    try:
        (engine,) = trainer.engine.engine.engines  # built (and synced) on first use, as train() does
        assert engine.node_id == ids[1], (engine.info, ids)
        server = engine.info["server_pid"]
        rows = trainer.train()
    finally:
        trainer.close()
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["sync_s"] > 0 and r["episodes"] > 0 for r in rows)  # the engine took every update
    assert max(r["mismatch_kl"] for r in rows) < 1e-3  # engine and trainer hold the same weights
    assert (tmp_path / "run" / "engine.log").is_file()  # written on the engine's node (same disk here)
    deadline = time.monotonic() + 30
    while _group_pids(server) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not _group_pids(server), "the engine's server outlived the run"
