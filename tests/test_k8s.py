"""``apexrl k8s``: the rendered manifests, checked without a cluster.

Every object is read back by the official Kubernetes Python client into its API model (``V1Pod``,
``V1Job``, ...) and must serialize back to exactly what was rendered, so a misspelled or misplaced
field (the client drops it) or a value of the wrong type fails. Every address a role connects to
must be ``<hostname>.<service>.<namespace>.svc.cluster.local`` of a headless Service that exists,
selects a pod with that hostname and lists the port the pod exposes. The ConfigMap's config loads
with apexrl's own loader, each container's command line parses with apexrl's own CLI, and the key
files each pod mounts are enough for its role: a replay server started with the replay pod's
files answers a client that has only the actor pod's files.
"""

from __future__ import annotations

import argparse
import base64
import copy
import re
import stat
from pathlib import Path
from urllib.parse import urlparse

import builders
import pytest
import yaml
import zmq
from conftest import Processes, free_port, wait_until

from apexrl import cli, roles
from apexrl.config import NetConfig, load_config
from apexrl.launch import k8s
from apexrl.launch import k8s_manifests as manifests
from apexrl.transport import auth, sockets
from apexrl.transport.messages import Stats, StatsRequest

kubernetes = pytest.importorskip(
    "kubernetes",
    reason="the manifests are checked against the official Kubernetes client's models "
    "(pip install kubernetes)",
)

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "apex_dqn_cartpole.yaml"
MODELS = {
    ("v1", "Service"): "V1Service",
    ("v1", "Pod"): "V1Pod",
    ("batch/v1", "Job"): "V1Job",
    ("v1", "ConfigMap"): "V1ConfigMap",
    ("v1", "Secret"): "V1Secret",
}
CONNECT_FLAGS = ("--replay", "--params", "--rendezvous")
ACTOR_BUNDLES = [f"actor_{i}" for i in range(4)]  # apexrl k8s's 4 actors (its default), each own


# --- rendering ------------------------------------------------------------------------------------


def cli_has_k8s() -> bool:
    """Whether ``apexrl.cli`` has the ``k8s`` subcommand wired in."""
    for action in cli.build_parser()._actions:
        if isinstance(action, argparse._SubParsersAction):
            return "k8s" in action.choices
    return False


def k8s_main(argv: list[str]) -> int:
    """``apexrl k8s ARGV``: through ``cli.main`` once it is wired, else the module's own parser."""
    if cli_has_k8s():
        return cli.main(["k8s", *argv])
    parser = argparse.ArgumentParser(prog="apexrl k8s")
    k8s.add_arguments(parser)
    return k8s.main(parser.parse_args(argv))


def render(tmp_path: Path, *flags: str, name: str = "run.yaml") -> list[dict]:
    """The objects of ``apexrl k8s --config CONFIG FLAGS -o FILE``, parsed back from FILE."""
    out = tmp_path / name
    rc = k8s_main(["--config", str(CONFIG), *flags, "-o", str(out)])
    assert rc == 0
    text = out.read_text()
    assert text.startswith("# ") and "kubectl apply -f" in text.split("---", 1)[0]
    return [doc for doc in yaml.safe_load_all(text) if doc is not None]


def of_kind(docs: list[dict], kind: str) -> list[dict]:
    return [doc for doc in docs if doc["kind"] == kind]


def pod_specs(docs: list[dict]) -> list[tuple[dict, dict]]:
    """(metadata, spec) of every pod: the Pods and the Job's pod template."""
    found = [(pod["metadata"], pod["spec"]) for pod in of_kind(docs, "Pod")]
    found += [
        (job["spec"]["template"]["metadata"], job["spec"]["template"]["spec"])
        for job in of_kind(docs, "Job")
    ]
    return found


def containers(docs: list[dict]) -> list[tuple[dict, dict, dict]]:
    """(pod metadata, pod spec, container) of every container."""
    return [(meta, spec, c) for meta, spec in pod_specs(docs) for c in spec["containers"]]


def flag_values(args: list[str], flag: str) -> list[str]:
    return [args[i + 1] for i, arg in enumerate(args[:-1]) if arg == flag]


def key_role(args: list[str]) -> str:
    """The CURVE key a container's ``apexrl`` command line uses."""
    if args[0] == "actor":
        return "eval" if "--eval" in args else "actor"
    return args[0]


def config_of(docs: list[dict], tmp_path: Path) -> Path:
    """The ConfigMap's config.yaml, written where a test can load it."""
    (config_map,) = of_kind(docs, "ConfigMap")
    return builders.write_config(tmp_path, config_map["data"]["config.yaml"])


def mount_keys(docs: list[dict], spec: dict, directory: Path) -> Path:
    """Write the key files of the Secret that ``spec``'s secret volume mounts (every key of it,
    no ``items``) to ``directory``, as the kubelet would."""
    (volume,) = [v for v in spec["volumes"] if "secret" in v]
    (secret,) = [
        s
        for s in of_kind(docs, "Secret")
        if s["metadata"]["name"] == volume["secret"]["secretName"]
    ]
    assert "items" not in volume["secret"], "the pod mounts its whole bundle"
    mode = volume["secret"]["defaultMode"]
    assert mode == 0o400, "key files are readable by their owner only"
    directory.mkdir(parents=True)
    for name, data in secret["data"].items():
        path = directory / name
        path.write_bytes(base64.b64decode(data))
        path.chmod(mode)
    return directory


# --- the API models -------------------------------------------------------------------------------


def round_trip(doc: dict) -> dict:
    """``doc`` read into its Kubernetes API model and serialized back (the model drops unknown
    fields; a value of the wrong type raises, or is converted)."""
    client = kubernetes.client.ApiClient()
    model = client._ApiClient__deserialize(doc, MODELS[(doc["apiVersion"], doc["kind"])])
    return client.sanitize_for_serialization(model)


def is_valid(doc: dict) -> bool:
    """Whether ``doc`` is exactly a Kubernetes API object of its kind."""
    try:
        return round_trip(doc) == doc
    except (ValueError, TypeError):  # pydantic's ValidationError is a ValueError
        return False


@pytest.mark.parametrize("learners", [1, 3])
def test_every_object_is_a_valid_kubernetes_object(tmp_path: Path, learners: int) -> None:
    docs = render(tmp_path, "--actors", "4", "--learners", str(learners), "--namespace", "rl")
    kinds = [doc["kind"] for doc in docs]
    assert sorted(kinds) == sorted(  # a Job and a Secret per actor: each its own key
        ["Service", "ConfigMap"] + ["Job"] * 4 + ["Secret"] * (3 + 4) + ["Pod"] * (2 + learners + 1)
    )
    for doc in docs:
        assert round_trip(doc) == doc, f"{doc['kind']} {doc['metadata']['name']}"
        assert is_valid(doc)
        meta = doc["metadata"]
        assert meta["namespace"] == "rl"
        assert meta["labels"]["app.kubernetes.io/name"] == "apexrl"
        assert meta["labels"]["app.kubernetes.io/instance"] == "apex-dqn-cartpole-v1"
        assert meta["labels"]["apexrl/role"]
        assert len(meta["name"]) <= 63 - len("-99"), "room for the Job's index in pod hostnames"
    for _meta, spec, container in containers(docs):
        assert spec["restartPolicy"] == "OnFailure", "a finished run's pods end Completed"
        assert container["command"] == ["apexrl"]
        for values in container["resources"].values():
            for value in values.values():
                assert isinstance(value, str) and kubernetes.utils.parse_quantity(value) > 0

    # The check is not vacuous: a misspelled field, a misplaced one, a wrong type all fail it.
    pod = of_kind(docs, "Pod")[0]
    broken = [copy.deepcopy(pod) for _ in range(3)]
    broken[0]["spec"]["restartpolicy"] = "OnFailure"
    broken[1]["spec"]["containers"][0]["readOnly"] = True
    broken[2]["spec"]["containers"][0]["resources"]["limits"]["memory"] = 4
    for doc in broken:
        assert not is_valid(doc)


# --- addresses ------------------------------------------------------------------------------------


def check_address(docs: list[dict], addr: str, namespace: str) -> dict:
    """Fail unless ``addr`` is a pod's name behind a headless Service that exists and lists the
    port, and the pod's container exposes it; the pod's spec."""
    parsed = urlparse(addr)
    assert parsed.scheme == "tcp" and parsed.port, addr
    hostname, service_name, ns, *domain = parsed.hostname.split(".")
    assert (ns, domain) == (namespace, ["svc", "cluster", "local"]), addr
    services = [
        s
        for s in of_kind(docs, "Service")
        if (s["metadata"]["name"], s["metadata"]["namespace"]) == (service_name, ns)
    ]
    assert len(services) == 1, f"{addr}: no Service {service_name} in {ns}"
    spec = services[0]["spec"]
    assert spec["clusterIP"] == "None", "headless: pod DNS names"
    assert parsed.port in [p["port"] for p in spec["ports"]], f"{addr}: port not in the Service"
    assert all(p["targetPort"] == p["port"] for p in spec["ports"])
    selector = spec["selector"].items()
    pods = [
        pod
        for pod in of_kind(docs, "Pod")
        if pod["metadata"]["namespace"] == ns
        and selector <= pod["metadata"]["labels"].items()
        and pod["spec"].get("hostname") == hostname
        and pod["spec"].get("subdomain") == service_name
    ]
    assert len(pods) == 1, f"{addr}: no pod {hostname} behind the Service {service_name}"
    exposed = [
        p["containerPort"] for c in pods[0]["spec"]["containers"] for p in c.get("ports", [])
    ]
    assert parsed.port in exposed, f"{addr}: the pod does not expose the port"
    return pods[0]["spec"]


@pytest.mark.parametrize("learners", [1, 2])
def test_every_address_a_role_connects_to_is_a_service_that_exists(
    tmp_path: Path, learners: int
) -> None:
    docs = render(tmp_path, "--learners", str(learners), "--namespace", "rl", "--name", "exp1")
    connected = set()
    for meta, spec, container in containers(docs):
        args = container["args"]
        for flag in CONNECT_FLAGS:
            for addr in flag_values(args, flag):
                target = check_address(docs, addr, "rl")
                served = target["containers"][0]["args"]
                if flag == "--rendezvous":  # rank 0 hosts it
                    assert flag_values(served, "--rank") == ["0"]
                    assert flag_values(served, "--rendezvous") == [addr]
                else:  # the server's own role, bound to every interface on that port
                    assert served[0] == flag[2:]
                    port = urlparse(addr).port
                    assert flag_values(served, "--bind") == [f"tcp://0.0.0.0:{port}"]
                connected.add((flag, addr))
        for bind in flag_values(args, "--bind"):  # a server: behind the Service on that port
            port = urlparse(bind).port
            addr = f"tcp://{spec['hostname']}.exp1.rl.svc.cluster.local:{port}"
            assert check_address(docs, addr, "rl") is spec
            assert meta["labels"]["apexrl/role"] == args[0]
    expected = {"--replay", "--params"} | ({"--rendezvous"} if learners > 1 else set())
    assert {flag for flag, _ in connected} == expected
    cfg = load_config(config_of(docs, tmp_path))
    for addr in (cfg.net.replay_addr, cfg.net.params_addr):
        check_address(docs, addr, "rl")
    if learners > 1:
        check_address(docs, cfg.learner.rendezvous, "rl")
    # Actors are not behind the Service: nothing connects to them.
    selector = of_kind(docs, "Service")[0]["spec"]["selector"].items()
    for job in of_kind(docs, "Job"):
        assert not selector <= job["spec"]["template"]["metadata"]["labels"].items()
    # The check is not vacuous.
    for wrong in (
        "tcp://replay.exp2.rl.svc.cluster.local:6000",  # no such Service
        "tcp://replay.exp1.default.svc.cluster.local:6000",  # another namespace
        "tcp://replay.exp1.rl.svc.cluster.local:6001",  # the port of another pod
        "tcp://actor.exp1.rl.svc.cluster.local:6000",  # no such hostname
    ):
        with pytest.raises(AssertionError):
            check_address(docs, wrong, "rl")


def test_every_command_line_is_apexrl_cli_and_reads_the_cluster_config(tmp_path: Path) -> None:
    docs = render(tmp_path, "--actors", "3", "--learners", "2", "--name", "exp1")
    config_path = config_of(docs, tmp_path)
    cluster = load_config(config_path)
    names = []
    for _meta, _spec, container in containers(docs):
        args = [arg.replace("$(ACTOR_ID)", "2") for arg in container["args"]]
        assert flag_values(args, "--config") == [manifests.CONFIG_FILE]
        args[args.index(manifests.CONFIG_FILE)] = str(config_path)
        parsed = cli.build_parser().parse_args(args)
        cfg = load_config(parsed.config, roles.role_overrides(parsed))
        names.append(roles.log_name(parsed, cfg.learner.world_size))
        assert cfg.net.keys_dir == manifests.KEYS_DIR and str(cfg.run_dir) == "/apexrl/runs/exp1"
        assert cfg.actor.num_actors == 3 and cfg.learner.world_size == 2
        if parsed.role in ("replay", "params"):
            assert auth.is_loopback(getattr(cfg.net, f"{parsed.role}_addr")) is False
        else:  # clients connect where the cluster config says
            assert cfg.net == cluster.net
            assert cfg.learner.rendezvous == cluster.learner.rendezvous
    assert sorted(names) == [
        "actor_0", "actor_1", "actor_2", "eval", "learner_0", "learner_1", "params", "replay"
    ]  # fmt: skip


# --- the actors' Job, GPUs, the config ------------------------------------------------------------


def test_each_actor_is_a_job_of_its_own_that_mounts_only_its_own_key(tmp_path: Path) -> None:
    docs = render(tmp_path, "--actors", "3", "--name", "exp1")
    jobs = of_kind(docs, "Job")
    assert [job["metadata"]["name"] for job in jobs] == [f"exp1-actor-{i}" for i in range(3)]
    for actor_id, job in enumerate(jobs):
        spec = job["spec"]
        assert "completionMode" not in spec and spec["backoffLimit"] == manifests.ACTOR_RETRIES
        pod = spec["template"]["spec"]
        (container,) = pod["containers"]
        assert flag_values(container["args"], "--id") == [str(actor_id)]
        assert flag_values(container["args"], "--num-actors") == ["3"]
        keys_dir = mount_keys(docs, pod, tmp_path / f"actor-{actor_id}")
        assert sorted(p.name for p in keys_dir.iterdir()) == sorted(auth.bundle_files("actors"))
        # Its key is actor <id>'s: the servers' allow-list binds it to that id alone.
        keys = auth.client_keys(
            NetConfig(keys_dir=str(keys_dir)), auth.actor_identity(actor_id), "replay"
        )
        servers = next(p for m, p in pod_specs(docs) if m["labels"]["apexrl/role"] == "replay")
        allow = auth.load_allow_list(
            mount_keys(docs, servers, tmp_path / f"servers-{actor_id}") / "allow_list.json"
        )
        assert allow[keys.public_key] == f"actor:{actor_id}"


def test_with_the_actors_shared_key_the_actors_are_an_indexed_job(tmp_path: Path) -> None:
    keys_dir = tmp_path / "keys"
    auth.make_keys(keys_dir)  # no --actors: one key shared by the actors
    docs = render(tmp_path, "--actors", "5", "--keys", str(keys_dir))
    (job,) = of_kind(docs, "Job")
    spec = job["spec"]
    assert spec["completionMode"] == "Indexed"
    assert spec["completions"] == spec["parallelism"] == 5
    (container,) = spec["template"]["spec"]["containers"]
    env = {e["name"]: e for e in container["env"]}
    field_path = env["ACTOR_ID"]["valueFrom"]["fieldRef"]["fieldPath"]
    assert field_path == "metadata.annotations['batch.kubernetes.io/job-completion-index']"
    args = container["args"]
    assert args[0] == "actor" and "--eval" not in args
    # Kubernetes expands $(VAR) in args only for a variable the container declares.
    assert flag_values(args, "--id") == ["$(ACTOR_ID)"]
    assert flag_values(args, "--num-actors") == ["5"]
    assert "actors" in secret_files(docs) and "actor_0" not in secret_files(docs)
    evals = [c for _m, _s, c in containers(docs) if "--eval" in c["args"]]
    assert len(evals) == 1 and evals[0]["args"][0] == "actor"
    assert not any("--eval" in c["args"] for _m, _s, c in containers(render(tmp_path, "--no-eval")))


def test_gpus_go_to_the_learners_only(tmp_path: Path) -> None:
    docs = render(tmp_path, "--learners", "2", "--gpus-per-learner", "2")
    with_gpus = {
        c["args"][0]: c["resources"]["limits"].get("nvidia.com/gpu")
        for _m, _s, c in containers(docs)
    }
    assert with_gpus == {"replay": None, "params": None, "learner": "2", "actor": None}
    learners = [c for _m, _s, c in containers(docs) if c["args"][0] == "learner"]
    assert len(learners) == 2
    assert all(c["resources"]["limits"]["nvidia.com/gpu"] == "2" for c in learners)
    # The config's cpu learner device becomes cuda, so the GPUs asked for are used.
    assert load_config(str(config_of(docs, tmp_path))).learner.device == "cuda"
    docs = render(tmp_path, "--learners", "2")
    assert not any("nvidia.com/gpu" in c["resources"]["limits"] for _m, _s, c in containers(docs))
    assert load_config(str(config_of(docs, tmp_path))).learner.device == "cpu"


def test_resources_come_from_the_flags(tmp_path: Path) -> None:
    docs = render(
        tmp_path,
        *("--actor-cpu", "500m", "--actor-memory", "768Mi"),
        *("--learner-cpu", "4", "--learner-memory", "16Gi"),
        *("--server-cpu", "1.5", "--server-memory", "8G"),
    )
    expected = {
        "actor": ("500m", "768Mi"),
        "learner": ("4", "16Gi"),
        "replay": ("1.5", "8G"),
        "params": ("1.5", "8G"),
    }
    for _m, _s, c in containers(docs):
        cpu, memory = expected[c["args"][0]]
        assert c["resources"]["requests"] == {"cpu": cpu, "memory": memory}
        assert c["resources"]["limits"]["memory"] == memory


def test_track_puts_the_tracker_in_the_clusters_config(tmp_path: Path) -> None:
    docs = render(tmp_path, "--track", "mlflow")
    assert load_config(config_of(docs, tmp_path)).run.trackers == ("tensorboard", "mlflow")


def test_the_config_map_holds_the_resolved_config_with_in_cluster_values(tmp_path: Path) -> None:
    docs = render(
        tmp_path,
        *("--actors", "6", "--learners", "2", "--namespace", "rl"),
        *("--set", "algo.lr=0.001", "--set", "net.replay_addr=tcp://10.0.0.1:7000"),
    )
    cfg = load_config(config_of(docs, tmp_path))
    name = "apex-dqn-cartpole-v1"
    assert cfg.actor.num_actors == 6 and cfg.learner.world_size == 2
    assert cfg.algo.lr == 0.001, "the user's --set"
    assert cfg.net.replay_addr == f"tcp://replay.{name}.rl.svc.cluster.local:6000"
    assert cfg.net.params_addr == f"tcp://params.{name}.rl.svc.cluster.local:6001"
    assert cfg.learner.rendezvous == f"tcp://learner-0.{name}.rl.svc.cluster.local:6002"
    assert cfg.net.keys_dir == "/apexrl/keys" and cfg.run.dir == f"/apexrl/runs/{name}"
    for _meta, spec in pod_specs(docs):
        mounts = {v["name"]: v for v in spec["volumes"]}
        assert mounts["config"]["configMap"]["name"] == f"{name}-config"
        assert mounts["runs"] == {"name": "runs", "emptyDir": {}}
    docs = render(tmp_path, "--pvc", "apexrl-runs")
    for _meta, spec in pod_specs(docs):
        (runs,) = [v for v in spec["volumes"] if v["name"] == "runs"]
        assert runs["persistentVolumeClaim"] == {"claimName": "apexrl-runs"}


# --- keys -----------------------------------------------------------------------------------------


def secret_files(docs: list[dict]) -> dict[str, dict[str, bytes]]:
    """Each Secret's files by bundle (``<run>-keys-<bundle>``; ``actor-3``: ``actor_3``)."""
    bundles = {}
    for secret in of_kind(docs, "Secret"):
        assert secret["type"] == "Opaque"
        bundle = secret["metadata"]["name"].rsplit("-keys-", 1)[1]
        bundle = re.sub(r"^actor-(\d+)$", r"actor_\1", bundle)
        bundles[bundle] = {name: base64.b64decode(data) for name, data in secret["data"].items()}
    return bundles


def test_each_pod_mounts_just_the_bundle_of_its_role(tmp_path: Path) -> None:
    docs = render(tmp_path, "--learners", "2", "--actors", "2")
    files = secret_files(docs)
    expected = [b for b in auth.BUNDLES if b != "actors"] + ["actor_0", "actor_1"]
    assert {b: set(f) for b, f in files.items()} == {b: set(auth.bundle_files(b)) for b in expected}
    allow_list = None
    public = {}
    for i, (_meta, spec, container) in enumerate(containers(docs)):
        role = key_role(container["args"])
        keys_dir = mount_keys(docs, spec, tmp_path / f"{i}-{role}")
        secrets = sorted(p.name for p in keys_dir.iterdir() if p.name.endswith(".key_secret"))
        own = auth.BUNDLES[auth.BUNDLE_OF[role]]
        assert secrets == sorted(f"{r}.key_secret" for r in own), "no other host's secret key"
        assert stat.S_IMODE((keys_dir / f"{role}.key_secret").stat().st_mode) == 0o400
        net = NetConfig(keys_dir=str(keys_dir))
        if role in auth.SERVER_ROLES:
            keys = auth.server_keys(net, role)
            public[role] = keys.public_key
            allow_list = keys.client_roles
        else:
            if role == "actor":  # each its own: actor:<id>
                role = auth.actor_identity(int(flag_values(container["args"], "--id")[0]))
            for server in auth.SERVER_ROLES:
                keys = auth.client_keys(net, role, server)
                server_key, _ = zmq.auth.load_certificate(keys_dir / f"{server}.key")
                assert keys.server_key == server_key
            public[role] = keys.public_key
    identities = ["learner", "eval", "actor:0", "actor:1"]
    assert set(public) == set(auth.SERVER_ROLES) | set(identities)
    for identity in identities:
        assert allow_list[public[identity]] == identity, f"the servers admit {identity} as such"


def test_a_replay_server_with_its_pods_keys_answers_an_actor_with_its_pods_keys(
    tmp_path: Path, procs: Processes
) -> None:
    docs = render(tmp_path)
    config_path = config_of(docs, tmp_path)
    by_role = {key_role(c["args"]): (spec, c) for _m, spec, c in containers(docs)}
    replay_spec, replay = by_role["replay"]
    actor_spec, _ = by_role["actor"]
    replay_keys = mount_keys(docs, replay_spec, tmp_path / "replay-keys")
    actor_keys = mount_keys(docs, actor_spec, tmp_path / "actor-keys")
    # The replay pod's command line, with this machine's paths and a free port.
    port = free_port()
    local = {
        manifests.CONFIG_FILE: str(config_path),
        manifests.KEYS_DIR: str(replay_keys),
        flag_values(replay["args"], "--run-dir")[0]: str(tmp_path / "run"),
        "tcp://0.0.0.0:6000": f"tcp://0.0.0.0:{port}",
    }
    args = [local.get(arg, arg) for arg in replay["args"]]
    assert args != replay["args"] and args[0] == "replay"
    server = procs.start("replay", *args)
    curve = auth.client_keys(NetConfig(keys_dir=str(actor_keys)), "actor", "replay")

    def stats() -> dict | None:
        ctx = sockets.make_context()
        with sockets.closing(ctx):
            sock = sockets.connect(ctx, zmq.DEALER, f"tcp://127.0.0.1:{port}", curve=curve)
            sockets.send(sock, StatsRequest())
            reply = sockets.recv(sock, timeout_ms=500)
        return reply.values if isinstance(reply, Stats) else None

    values = wait_until(lambda: server.alive() and stats(), 20.0)
    assert values is not None, f"no Stats for the actor's key\n{server.tail()}"
    assert values["replay/size"] == 0


def test_keys_flag_puts_the_given_keys_in_the_secret(tmp_path: Path) -> None:
    keys_dir = tmp_path / "keys"
    auth.make_keys(keys_dir)
    files = secret_files(render(tmp_path, "--keys", str(keys_dir)))
    assert files == {
        b: {name: (keys_dir / b / name).read_bytes() for name in auth.bundle_files(b)}
        for b in auth.BUNDLES
    }
    first = secret_files(render(tmp_path, name="a.yaml"))
    second = secret_files(render(tmp_path, name="b.yaml"))
    assert set(first) == set(second) == {"servers", "learner", "eval", *ACTOR_BUNDLES}
    for bundle in first:
        for name in auth.bundle_files(bundle):
            assert first[bundle][name] != second[bundle][name], f"fresh keys per render: {name}"
            if bundle in files:
                assert first[bundle][name] != files[bundle][name]
    assert stat.S_IMODE((tmp_path / "a.yaml").stat().st_mode) == 0o600, "it holds secret keys"


# --- bad input ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--set", "algo.nope=1"], "unknown config key 'algo.nope'"),
        (["--actors", "0"], "--actors and --learners must be >= 1"),
        (["--learners", "0"], "--actors and --learners must be >= 1"),
        (["--actor-memory", "1GB"], "--actor-memory '1GB' is not a positive Kubernetes quantity"),
        (["--server-cpu", "-1"], "--server-cpu '-1' is not a positive Kubernetes quantity"),
        (["--learner-memory", "0"], "--learner-memory '0' is not a positive"),
        (["--name", "Bad_Name"], "--name 'Bad_Name' must be lower case"),
        (["--namespace", "No Spaces"], "--namespace 'No Spaces' is not a DNS label"),
        (["--gpus-per-learner", "-1"], "--gpus-per-learner must be >= 0"),
        (["--keys", "{tmp}/nokeys"], "holds no servers/replay.key"),
        (["--config", "{tmp}/missing.yaml"], "does not exist"),
    ],
)
def test_bad_input_exits_2_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture, flags: list[str], message: str
) -> None:
    (tmp_path / "nokeys").mkdir()
    flags = [flag.replace("{tmp}", str(tmp_path)) for flag in flags]
    out = tmp_path / "out.yaml"
    assert k8s_main(["--config", str(CONFIG), *flags, "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and err.startswith("apexrl k8s: error: "), err
    assert message in err
    assert not out.exists()


@pytest.mark.parametrize("text", ["1", "500m", "1.5", "0.25", ".5", "2Gi", "768Mi", "8G", "1e3"])
def test_kubernetes_quantities_are_accepted(text: str) -> None:
    assert k8s.check_quantity("--x", text) == text
    assert kubernetes.utils.parse_quantity(text) > 0


@pytest.mark.parametrize("text", ["", "1GB", "1gi", "Gi", "1 Gi", "-1", "0", "0.0Mi", "nan", "1K"])
def test_other_quantities_are_refused(text: str) -> None:
    with pytest.raises(k8s.K8sError):
        k8s.check_quantity("--x", text)


def test_the_bundles_are_those_of_apexrl_keys(tmp_path: Path) -> None:
    auth.make_keys(tmp_path / "keys")
    made = {b.name: sorted(p.name for p in b.iterdir()) for b in (tmp_path / "keys").iterdir()}
    assert made == {b: sorted(files) for b, files in manifests.BUNDLE_FILES.items()}
    assert {b: list(f) for b, f in manifests.BUNDLE_FILES.items()} == {
        b: auth.bundle_files(b) for b in auth.BUNDLES
    }
    assert manifests.KEY_BUNDLE == auth.BUNDLE_OF
    assert manifests.OWN_ACTOR_BUNDLE == auth.OWN_ACTOR_BUNDLE
    auth.make_keys(tmp_path / "own", actors=2)
    own = sorted(p.name for p in (tmp_path / "own" / "actor_1").iterdir())
    assert own == sorted(manifests.bundle_files("actor_1")) == sorted(auth.bundle_files("actor_1"))


def test_keys_with_own_keys_for_fewer_actors_than_the_run_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    auth.make_keys(tmp_path / "keys", actors=2)
    out = tmp_path / "out.yaml"
    flags = ["--actors", "3", "--keys", str(tmp_path / "keys"), "-o", str(out)]
    assert k8s_main(["--config", str(CONFIG), *flags]) == 2
    err = capsys.readouterr().err
    assert "holds own keys of 2 actors, not of all 3" in err and "--add-actors" in err, err
    assert not out.exists()
    auth.add_actor_keys(tmp_path / "keys", 1)
    assert k8s_main(["--config", str(CONFIG), *flags]) == 0


def test_without_the_evaluation_actor_there_is_no_eval_bundle(tmp_path: Path) -> None:
    assert set(secret_files(render(tmp_path, "--no-eval"))) == {
        "servers",
        "learner",
        *ACTOR_BUNDLES,
    }


def test_the_default_name_is_a_dns_label_of_the_algorithm_and_env() -> None:
    assert manifests.dns_name("apex_dqn-CartPole-v1") == "apex-dqn-cartpole-v1"
    assert manifests.dns_name("ppo-ALE-Pong-v5") == "ppo-ale-pong-v5"
    long = manifests.dns_name("impala-" + "mypkg.envs.make_" * 10)
    assert len(long) <= manifests.MAX_NAME and long[0].isalpha() and long[-1].isalnum()
    assert manifests.dns_name("9--") == "apexrl"
