"""The Kubernetes objects of a whole run (``apexrl k8s``), made from a ``Plan``: pure functions, no
reading of files or flags (``apexrl.launch.k8s`` checks the command line, reads the config and
the keys and makes the ``Plan``).

``manifests`` returns the objects as plain dicts, in the order they are applied: the headless
Service, the ConfigMap (``config.yaml``), the Secrets (a bundle of the CURVE keys each), the
servers' and learners' Pods, the actors' Jobs and the evaluation actor's Pod. With a key per
actor (``apexrl keys DIR --actors N``, and the keys ``apexrl k8s`` makes) each actor is a Job of
its own that mounts only its own key; with the actors' shared key, one indexed Job runs them
all. ``render``
writes them as one YAML stream under a comment ``header`` that says what they make and how to
watch and stop the run. The names, ports and mount points every pod agrees on are the constants
below.
"""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass, field
from typing import Any

import yaml

from apexrl.runtime import rundir

REPLAY_PORT = 6000
PARAMS_PORT = 6001
RENDEZVOUS_PORT = 6002
CONFIG_DIR = "/apexrl/config"  # the ConfigMap: config.yaml
CONFIG_FILE = f"{CONFIG_DIR}/{rundir.CONFIG}"
KEYS_DIR = "/apexrl/keys"  # the Secret of the pod's bundle: its key files
RUNS_DIR = "/apexrl/runs"  # the emptyDir or the claim; the run directory is RUNS_DIR/NAME
KEYS_MODE = 0o400  # of the mounted key files (secret volumes: defaultMode)
ACTOR_ID_ENV = "ACTOR_ID"
COMPLETION_INDEX = "metadata.annotations['batch.kubernetes.io/job-completion-index']"
ACTOR_RETRIES = 6  # failures per actor (on average) before the Job gives up on all of them
MAX_NAME = 40  # leaves room for "-actors-<index>" and "-learner-<rank>" in a 63-character label
GPU_RESOURCE = "nvidia.com/gpu"
LABEL_NAME = "app.kubernetes.io/name"
LABEL_INSTANCE = "app.kubernetes.io/instance"
LABEL_ROLE = "apexrl/role"
LABEL_SERVICE = "apexrl/service"  # on the pods behind the headless Service: the Service's name

# The bundles of ``apexrl keys DIR`` and their files (``apexrl.transport.auth``: ``BUNDLES``,
# ``bundle_files``, ``BUNDLE_OF``; imported only when keys are read, since building the CLI's
# parser imports this module). Each becomes a Secret that only the pods of its roles mount.
_SERVER_KEYS = ("replay.key", "params.key")
BUNDLE_FILES: dict[str, tuple[str, ...]] = {
    "servers": ("replay.key", "replay.key_secret", "params.key", "params.key_secret")
    + ("allow_list.json",),
    "learner": ("learner.key", "learner.key_secret", *_SERVER_KEYS),
    "actors": ("actor.key", "actor.key_secret", *_SERVER_KEYS),
    "eval": ("eval.key", "eval.key_secret", *_SERVER_KEYS),
}
KEY_BUNDLE = {  # the bundle a role's pod mounts (an actor: its own, where the keys have one)
    "replay": "servers",
    "params": "servers",
    "learner": "learner",
    "actor": "actors",
    "eval": "eval",
}
OWN_ACTOR_BUNDLE = "actor_{}"  # actor i's own bundle (``auth.OWN_ACTOR_BUNDLE``)


@dataclass(frozen=True)
class Resources:
    """A container's requests (the memory also its limit) as Kubernetes quantities."""

    cpu: str
    memory: str
    gpus: int = 0  # nvidia.com/gpu in the limits


@dataclass(frozen=True)
class Plan:
    """Everything the manifests are made of; ``manifests`` reads nothing else."""

    name: str  # the run's name: the Service's, and the prefix of every other object's
    namespace: str
    image: str  # has apexrl installed: the containers run `apexrl <role> ...`
    actors: int
    learners: int
    config_yaml: str  # the resolved config with the in-cluster values (cluster_overrides)
    keys: dict[str, dict[str, bytes]]  # bundle -> key file name -> contents (BUNDLE_FILES)
    server: Resources
    learner: Resources
    actor: Resources  # the evaluation actor's too
    evaluate: bool = True
    pvc: str = ""  # claim of the run directory; "": an emptyDir per pod
    cluster_domain: str = "cluster.local"
    pull_policy: str = ""  # "": Kubernetes' default
    labels: dict[str, str] = field(default_factory=dict)  # extra labels (none by default)


# -- names and addresses ---------------------------------------------------------------------------


def dns_name(text: str) -> str:
    """``apex_dqn-CartPole-v1`` -> ``apex-dqn-cartpole-v1``: an RFC 1035 label of at most
    ``MAX_NAME`` characters (lower case, digits and ``-``, starting with a letter)."""
    name = re.sub(r"[^a-z0-9]+", "-", text.lower())
    name = re.sub(r"^[^a-z]+", "", name)[:MAX_NAME].strip("-")
    return name or "apexrl"


def host(name: str, namespace: str, hostname: str, domain: str = "cluster.local") -> str:
    """The DNS name of the pod with ``hostname`` behind the headless Service ``name``."""
    return f"{hostname}.{name}.{namespace}.svc.{domain}"


def learner_hostname(rank: int) -> str:
    return f"learner-{rank}"


def cluster_overrides(
    name: str, namespace: str, actors: int, learners: int, domain: str = "cluster.local"
) -> list[str]:
    """The config values every pod of the run reads (after the user's ``--set``)."""
    overrides = [
        f"actor.num_actors={actors}",
        f"learner.world_size={learners}",
        f"run.dir={RUNS_DIR}/{name}",
        f"net.keys_dir={KEYS_DIR}",
        f"net.replay_addr=tcp://{host(name, namespace, 'replay', domain)}:{REPLAY_PORT}",
        f"net.params_addr=tcp://{host(name, namespace, 'params', domain)}:{PARAMS_PORT}",
        "net.insecure=false",
    ]
    if learners > 1:
        rendezvous = host(name, namespace, learner_hostname(0), domain)
        overrides.append(f"learner.rendezvous=tcp://{rendezvous}:{RENDEZVOUS_PORT}")
    return overrides


def keys_secret_name(plan: Plan, bundle: str) -> str:
    """The Secret that holds one bundle of the run's keys (``actor_3``: ``...-keys-actor-3``)."""
    return f"{plan.name}-keys-{bundle.replace('_', '-')}"


def bundle_files(bundle: str) -> tuple[str, ...]:
    """The files of a bundle; an actor's own bundle holds what the shared one does."""
    return BUNDLE_FILES.get(bundle, BUNDLE_FILES[KEY_BUNDLE["actor"]])


def own_actor_keys(plan: Plan) -> bool:
    """Whether each actor has its own key (no shared bundle among the plan's keys)."""
    return KEY_BUNDLE["actor"] not in plan.keys


def actor_bundle(plan: Plan, actor_id: int) -> str:
    return OWN_ACTOR_BUNDLE.format(actor_id) if own_actor_keys(plan) else KEY_BUNDLE["actor"]


def bundles(plan: Plan) -> list[str]:
    """The bundles the run's pods mount: the servers', the learners', the actors' (each its own,
    or the shared one), the evaluation actor's (only when it runs)."""
    actors = [actor_bundle(plan, i) for i in range(plan.actors)] if own_actor_keys(plan) else []
    found = []
    for bundle in BUNDLE_FILES:
        if bundle == KEY_BUNDLE["actor"]:
            found += actors or [bundle]
        elif bundle != KEY_BUNDLE["eval"] or plan.evaluate:
            found.append(bundle)
    return found


# -- the objects -----------------------------------------------------------------------------------


def labels(plan: Plan, role: str) -> dict[str, str]:
    return {LABEL_NAME: "apexrl", LABEL_INSTANCE: plan.name, LABEL_ROLE: role, **plan.labels}


def metadata(plan: Plan, name: str, role: str, **extra: str) -> dict[str, Any]:
    return {"name": name, "namespace": plan.namespace, "labels": {**labels(plan, role), **extra}}


def service_selector(plan: Plan) -> dict[str, str]:
    return {LABEL_NAME: "apexrl", LABEL_INSTANCE: plan.name, LABEL_SERVICE: plan.name}


def service_ports(plan: Plan) -> list[tuple[str, int]]:
    ports = [("replay", REPLAY_PORT), ("params", PARAMS_PORT)]
    return ports + ([("rendezvous", RENDEZVOUS_PORT)] if plan.learners > 1 else [])


def _address(plan: Plan, hostname: str, port: int) -> str:
    return f"tcp://{host(plan.name, plan.namespace, hostname, plan.cluster_domain)}:{port}"


def _volumes(plan: Plan, bundle: str) -> list[dict[str, Any]]:
    runs: dict[str, Any] = (
        {"persistentVolumeClaim": {"claimName": plan.pvc}} if plan.pvc else {"emptyDir": {}}
    )
    return [
        {"name": "config", "configMap": {"name": f"{plan.name}-config"}},
        {
            "name": "keys",
            "secret": {
                "secretName": keys_secret_name(plan, bundle),
                "defaultMode": KEYS_MODE,
            },
        },
        {"name": "runs", **runs},
    ]


def _container(
    plan: Plan,
    name: str,
    args: list[str],
    resources: Resources,
    ports: list[tuple[str, int]] | None = None,
    env: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    limits = {"memory": resources.memory}
    if resources.gpus:
        limits[GPU_RESOURCE] = str(resources.gpus)
    container: dict[str, Any] = {"name": name, "image": plan.image}
    if plan.pull_policy:
        container["imagePullPolicy"] = plan.pull_policy
    container["command"] = ["apexrl"]
    container["args"] = [
        *args,
        *("--config", CONFIG_FILE, "--run-dir", f"{RUNS_DIR}/{plan.name}", "--keys", KEYS_DIR),
    ]
    container["env"] = [{"name": "PYTHONUNBUFFERED", "value": "1"}, *(env or [])]
    if ports:
        container["ports"] = [
            {"name": port_name, "containerPort": port, "protocol": "TCP"}
            for port_name, port in ports
        ]
    container["resources"] = {
        "requests": {"cpu": resources.cpu, "memory": resources.memory},
        "limits": limits,
    }
    container["volumeMounts"] = [
        {"name": "config", "mountPath": CONFIG_DIR, "readOnly": True},
        {"name": "keys", "mountPath": KEYS_DIR, "readOnly": True},
        {"name": "runs", "mountPath": RUNS_DIR},
    ]
    return container


def _pod_spec(
    plan: Plan, bundle: str, container: dict[str, Any], hostname: str = ""
) -> dict[str, Any]:
    spec: dict[str, Any] = {}
    if hostname:  # a DNS name <hostname>.<subdomain>.NS.svc.<domain> behind the Service
        spec["hostname"] = hostname
        spec["subdomain"] = plan.name
    spec["restartPolicy"] = "OnFailure"
    spec["containers"] = [container]
    spec["volumes"] = _volumes(plan, bundle)
    return spec


def _pod(plan: Plan, name: str, role: str, spec: dict[str, Any], **extra: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata(plan, name, role, **extra),
        "spec": spec,
    }


def _service(plan: Plan) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(plan, plan.name, "service"),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": service_selector(plan),
            "ports": [
                {"name": port_name, "port": port, "targetPort": port, "protocol": "TCP"}
                for port_name, port in service_ports(plan)
            ],
        },
    }


def _config_map(plan: Plan) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata(plan, f"{plan.name}-config", "config"),
        "data": {rundir.CONFIG: plan.config_yaml},
    }


def _secret(plan: Plan, bundle: str) -> dict[str, Any]:
    files = plan.keys[bundle]
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": metadata(plan, keys_secret_name(plan, bundle), "keys"),
        "type": "Opaque",
        "data": {f: base64.b64encode(files[f]).decode() for f in bundle_files(bundle)},
    }


def _server_pods(plan: Plan) -> list[dict[str, Any]]:
    pods = []
    for role, port in (("replay", REPLAY_PORT), ("params", PARAMS_PORT)):
        container = _container(
            plan, role, [role, "--bind", f"tcp://0.0.0.0:{port}"], plan.server, [(role, port)]
        )
        spec = _pod_spec(plan, KEY_BUNDLE[role], container, hostname=role)
        pods.append(_pod(plan, f"{plan.name}-{role}", role, spec, **{LABEL_SERVICE: plan.name}))
    return pods


def _client_args(plan: Plan) -> list[str]:
    """A client's addresses of both servers."""
    replay_addr = _address(plan, "replay", REPLAY_PORT)
    return ["--replay", replay_addr, "--params", _address(plan, "params", PARAMS_PORT)]


def _learner_pods(plan: Plan) -> list[dict[str, Any]]:
    pods = []
    for rank in range(plan.learners):
        args = ["learner", *_client_args(plan)]
        ports: list[tuple[str, int]] = []
        if plan.learners > 1:
            rendezvous = _address(plan, learner_hostname(0), RENDEZVOUS_PORT)
            args += ["--rank", str(rank), "--world-size", str(plan.learners)]
            args += ["--rendezvous", rendezvous]
            ports = [("rendezvous", RENDEZVOUS_PORT)] if rank == 0 else []
        container = _container(plan, "learner", args, plan.learner, ports)
        spec = _pod_spec(plan, KEY_BUNDLE["learner"], container, hostname=learner_hostname(rank))
        extra = {LABEL_SERVICE: plan.name, "apexrl/rank": str(rank)}
        pods.append(_pod(plan, f"{plan.name}-learner-{rank}", "learner", spec, **extra))
    return pods


def _actor_jobs(plan: Plan) -> list[dict[str, Any]]:
    """A Job per actor, each mounting its own key; with the actors' shared key, one indexed Job
    whose completion index is the actor id."""
    if not own_actor_keys(plan):
        return [_indexed_actor_job(plan)]
    jobs = []
    for actor_id in range(plan.actors):
        args = ["actor", *_client_args(plan), "--id", str(actor_id)]
        container = _container(plan, "actor", [*args, "--num-actors", str(plan.actors)], plan.actor)
        spec = _pod_spec(plan, actor_bundle(plan, actor_id), container)
        jobs.append(_job(plan, f"{plan.name}-actor-{actor_id}", spec, backoffLimit=ACTOR_RETRIES))
    return jobs


def _job(plan: Plan, name: str, pod_spec: dict[str, Any], **spec: Any) -> dict[str, Any]:
    """An actors' Job ``name`` of ``spec`` (its counts) running pods of ``pod_spec``."""
    template = {"metadata": {"labels": labels(plan, "actor")}, "spec": pod_spec}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": metadata(plan, name, "actor"),
        "spec": {**spec, "template": template},
    }


def _indexed_actor_job(plan: Plan) -> dict[str, Any]:
    actor = _container(
        plan,
        "actor",
        ["actor", *_client_args(plan), "--id", f"$({ACTOR_ID_ENV})"]
        + ["--num-actors", str(plan.actors)],
        plan.actor,
        env=[{"name": ACTOR_ID_ENV, "valueFrom": {"fieldRef": {"fieldPath": COMPLETION_INDEX}}}],
    )
    return _job(
        plan,
        f"{plan.name}-actors",
        _pod_spec(plan, KEY_BUNDLE["actor"], actor),
        completionMode="Indexed",
        completions=plan.actors,
        parallelism=plan.actors,
        backoffLimit=ACTOR_RETRIES * plan.actors,
    )


def _eval_pod(plan: Plan) -> dict[str, Any]:
    container = _container(plan, "eval", ["actor", *_client_args(plan), "--eval"], plan.actor)
    return _pod(plan, f"{plan.name}-eval", "eval", _pod_spec(plan, KEY_BUNDLE["eval"], container))


def manifests(plan: Plan) -> list[dict[str, Any]]:
    """The run's objects: Service, ConfigMap, a Secret per bundle of keys, the servers',
    learners' and evaluation actor's Pods and the actors' Jobs, as plain dicts in the order they
    are applied."""
    objects = [_service(plan), _config_map(plan), *(_secret(plan, b) for b in bundles(plan))]
    objects += _server_pods(plan) + _learner_pods(plan) + _actor_jobs(plan)
    return objects + ([_eval_pod(plan)] if plan.evaluate else [])


# -- the YAML stream -------------------------------------------------------------------------------


class _Dumper(yaml.SafeDumper):
    """Block literals for multi-line strings (the config), no anchors for repeated values."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _represent_str(dumper: yaml.SafeDumper, data: str) -> yaml.ScalarNode:
    style = "|" if "\n" in data else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)


_Dumper.add_representer(str, _represent_str)


def shown_bundles(plan: Plan) -> list[str]:
    """The bundles as the header names them: the actors' own ones as a range."""
    if not own_actor_keys(plan):
        return bundles(plan)
    last = plan.actors - 1
    own = OWN_ACTOR_BUNDLE.format("0") + (f" .. {last}" if last else "")
    return [b for b in bundles(plan) if not b.startswith(OWN_ACTOR_BUNDLE.format(""))] + [own]


def header(plan: Plan) -> str:
    """What the stream makes and how to use it, as YAML comments."""
    ns, name = plan.namespace, plan.name
    learners = f"{name}-learner-0" + (f" .. {plan.learners - 1}" if plan.learners > 1 else "")
    pods = [f"{name}-replay", f"{name}-params", learners] + ([f"{name}-eval"] * plan.evaluate)
    run_dir = f"the claim {plan.pvc}" if plan.pvc else "each pod's own emptyDir (gone with the pod)"
    lines = [
        f"apexrl run {name}: {plan.actors} actor(s), {plan.learners} learner(s), image "
        f"{plan.image}, namespace {ns}",
        "Apply:  kubectl apply -f FILE   (the namespace must exist)",
        "Makes:",
        f"  Service {name}: headless, the DNS names of replay, params and learner-<rank>",
        f"  Pods {', '.join(pods)}",
        f"  Jobs {name}-actor-<id>: one per actor, each mounting only its own key"
        if own_actor_keys(plan)
        else f"  Job {name}-actors: indexed, {plan.actors} completion(s), the index is the "
        "actor id (the actors share one key)",
        f"  ConfigMap {name}-config: config.yaml, read by every role",
        f"  Secrets {name}-keys-<bundle> ({', '.join(shown_bundles(plan))}):",
        "    the run's CURVE keys, one bundle each, mounted only by its roles' pods (keep this",
        "    file private)",
        f"Run directory: {RUNS_DIR}/{name} on {run_dir}",
        f"Watch:  kubectl -n {ns} get pods -l {LABEL_INSTANCE}={name}",
        f"        kubectl -n {ns} logs -f {name}-learner-0",
    ]
    if plan.evaluate:
        lines += [
            f"        kubectl -n {ns} exec {name}-eval -- \\",
            f"          apexrl status --once --keys {KEYS_DIR} \\",
            f"          --replay {_address(plan, 'replay', REPLAY_PORT)} \\",
            f"          --params {_address(plan, 'params', PARAMS_PORT)}",
        ]
    lines += [
        f"Stop:   kubectl -n {ns} exec {name}-learner-0 -- apexrl stop --config {CONFIG_FILE}",
        "Remove: kubectl delete -f FILE",
    ]
    return "".join(f"# {line}\n" for line in lines)


def render(plan: Plan) -> str:
    """The comment header and every object, one YAML document each."""
    body = yaml.dump_all(
        manifests(plan), Dumper=_Dumper, sort_keys=False, explicit_start=True, width=100
    )
    return header(plan) + body
