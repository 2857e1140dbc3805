"""deploy/k8s, checked offline (no cluster here): each core object against Kubernetes' own
OpenAPI schemas (kubernetes-validate, strict: an unknown field fails), the KEDA ScaledObject
and the Prometheus operator's PodMonitor for the fields they need, and the manifests
against the code: env names the settings read, probe paths the HTTP app serves, the image
the Dockerfile builds, the grace period against the stop deadlines, the dashboard against
deploy/grafana. `test_each_check_can_fail` breaks one thing at a time and expects the
check meant for it to catch it."""

from __future__ import annotations

import copy
import re
import shlex
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml
from k8skit import (
    DASHBOARD,
    DASHBOARD_YAML,
    K8S,
    KAFKA_TRIGGER,
    KAFKA_TRIGGER_OPTIONAL,
    POD_MONITOR,
    REPO,
    SCALED_OBJECT,
    Doc,
    add_env,
    container,
    containers,
    dashboard_configmap,
    edit,
    env_vars,
    kustomization,
    load,
    one,
    quantity,
    render,
    set_env,
    workload_of,
)

# The oldest Kubernetes a managed cloud still runs, and the newest kubernetes-validate has
KUBE_VERSIONS = ("1.30.0", "1.37.0")
CORE = {"v1", "apps/v1", "policy/v1"}  # the API groups kubernetes-validate has schemas for
VARIANTS = {  # what each deploys
    "redis": {"Deployment", "Service", "PodDisruptionBudget", "ScaledObject", "PodMonitor",
              "ConfigMap"},
    "lsm": {"StatefulSet", "Service", "PodMonitor", "ConfigMap"},
}
Check = Callable[[list[Doc]], None]


# --- the checks (each test runs some; test_each_check_can_fail breaks each) -----------------
def check_core_schemas(docs: list[Doc]) -> None:
    for doc in docs:
        if doc["apiVersion"] in CORE:
            for version in KUBE_VERSIONS:
                kubernetes_validate.validate(doc, version, strict=True)


def check_kinds(variant: str, docs: list[Doc]) -> None:
    assert {d["kind"] for d in docs} == VARIANTS[variant]
    custom = {d["kind"] for d in docs if d["apiVersion"] not in CORE}
    assert custom <= {"ScaledObject", "PodMonitor"}  # each checked below, nothing unchecked


def check_env_is_settings(docs: list[Doc]) -> None:
    """Every env variable is one Settings reads (STREAM_DEDUP_<NAME>) and `serve --help`
    names; the args and env resolve, as the CLI resolves them, to a valid Settings."""
    from stream_dedup.cli.main import build_parser
    from stream_dedup.config import ENV_PREFIX, Settings

    parser = build_parser()
    (serve_help,) = [a.choices["serve"].format_help() for a in parser._subparsers._actions
                     if a.choices and "serve" in a.choices]
    serve_help = " ".join(serve_help.split())
    (container,) = containers(workload_of(docs))
    env = env_vars(container)
    for name in env:
        assert name.startswith(ENV_PREFIX), name
        assert name[len(ENV_PREFIX):].lower() in Settings.names(), f"{name} is no setting"
        assert name in serve_help, f"serve --help does not name {name}"
    values = {name: e.get("value", "from-a-secret") for name, e in env.items()}
    args = parser.parse_args(container["args"])
    assert args.command == "serve"
    overrides = {name: getattr(args, name, None) for name in Settings.names()}
    settings = Settings.load(env=values, overrides=overrides)
    port = {p["name"]: p["containerPort"] for p in container["ports"]}["http"]
    assert (settings.http_host, settings.http_port) == ("0.0.0.0", port)
    assert settings.exactly_once


def check_probes(docs: list[Doc]) -> None:
    routes = set(re.findall(r'add_get\("([^"]+)"',
                            (REPO / "stream_dedup" / "http" / "app.py").read_text()))
    (container,) = containers(workload_of(docs))
    ports = {p["name"] for p in container["ports"]}
    for probe, path in (("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")):
        get = container[probe]["httpGet"]
        assert get["path"] == path and path in routes, (probe, get)
        assert get["port"] in ports


def check_resources(docs: list[Doc]) -> None:
    """Requests and limits for CPU and memory, requests within limits, and the memory
    limit above the sizing's sum: the measured peak RSS of --workers 2 (bench/RESULTS.md),
    one fetch (fetch_max_bytes) and a batch of messages at Kafka's default 1 MiB limit."""
    from stream_dedup.config import Settings
    from stream_dedup.kafka.client import consumer_kwargs

    results = (REPO / "bench" / "RESULTS.md").read_text()
    peak_mb = int(re.search(r"peak RSS, `--workers 2`.*?\| \d+[–-](\d+) MB", results)[1])
    settings = Settings()
    floor = peak_mb * 10**6 + consumer_kwargs(settings)["fetch_max_bytes"] + \
        settings.batch_size * 2**20
    (container,) = containers(workload_of(docs))
    requests, limits = container["resources"]["requests"], container["resources"]["limits"]
    assert set(requests) == set(limits) == {"cpu", "memory"}
    for key in requests:
        assert quantity(requests[key]) <= quantity(limits[key]), key
    assert quantity(limits["memory"]) >= floor


def check_grace(docs: list[Doc]) -> None:
    from stream_dedup.runner.edges import STOP_GRACE_S
    from stream_dedup.runner.signals import SHUTDOWN_DEADLINE_S

    grace = workload_of(docs)["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace > SHUTDOWN_DEADLINE_S > STOP_GRACE_S


def check_image(docs: list[Doc]) -> None:
    """The image is the one the Dockerfile's build names and docker-compose runs; its
    entrypoint is `stream-dedup` (args start with the subcommand) and its user the
    pod's."""
    dockerfile = (REPO / "Dockerfile").read_text()
    built = re.search(r"docker build -t (\S+) \.", dockerfile)[1]
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    assert compose["x-stream-dedup"]["image"] == built
    assert 'ENTRYPOINT ["stream-dedup"]' in dockerfile
    uid = int(re.search(r"useradd .*--uid (\d+)", dockerfile)[1])
    exposed = int(re.search(r"^EXPOSE (\d+)", dockerfile, re.M)[1])
    workload = workload_of(docs)
    (container,) = containers(workload)
    assert container["image"] == built
    assert workload["spec"]["template"]["spec"]["securityContext"]["runAsUser"] == uid
    assert exposed in [p["containerPort"] for p in container["ports"]]


def check_selectors(docs: list[Doc]) -> None:
    """The Service, the PodDisruptionBudget and the PodMonitor select the workload's pods,
    and name ports the container has."""
    workload = workload_of(docs)
    labels = workload["spec"]["template"]["metadata"]["labels"]
    assert workload["spec"]["selector"]["matchLabels"].items() <= labels.items()
    ports = {p["name"] for p in containers(workload)[0]["ports"]}
    service = one(docs, "Service")
    assert service["spec"]["selector"].items() <= labels.items()
    assert {p["targetPort"] for p in service["spec"]["ports"]} <= ports
    for doc in docs:
        if doc["kind"] in ("PodDisruptionBudget", "PodMonitor"):
            assert doc["spec"]["selector"]["matchLabels"].items() <= labels.items()
    monitor = one(docs, "PodMonitor")
    assert {e["port"] for e in monitor["spec"]["podMetricsEndpoints"]} <= ports
    alerts = (REPO / "deploy" / "prometheus" / "alerts.yml").read_text()
    job = re.search(r'up\{job="([^"]+)"\}', alerts)[1]
    assert labels[monitor["spec"]["jobLabel"]] == job  # the job the alerts name


def check_scaled_object(docs: list[Doc]) -> None:
    """A kafka trigger on the workload's own group and topic, and never more replicas
    than the input has partitions."""
    scaled = one(docs, "ScaledObject")
    jsonschema.validate(scaled, SCALED_OBJECT)
    workload = workload_of(docs)
    target = scaled["spec"]["scaleTargetRef"]
    assert (target["apiVersion"], target["kind"], target["name"]) == \
        (workload["apiVersion"], workload["kind"], workload["metadata"]["name"])
    assert "replicas" not in workload["spec"]  # KEDA's to set: a re-apply would reset it
    (trigger,) = scaled["spec"]["triggers"]
    meta = trigger["metadata"]
    assert trigger["type"] == "kafka"
    assert KAFKA_TRIGGER <= set(meta) <= KAFKA_TRIGGER | KAFKA_TRIGGER_OPTIONAL
    env = env_vars(containers(workload)[0])
    assert meta["consumerGroup"] == env["STREAM_DEDUP_GROUP_ID"]["value"]
    assert meta["topic"] == env["STREAM_DEDUP_INPUT_TOPIC"]["value"]
    assert meta["bootstrapServers"] == env["STREAM_DEDUP_BOOTSTRAP_SERVERS"]["value"]
    assert int(meta["lagThreshold"]) > 0
    assert meta.get("allowIdleConsumers", "false") == "false"
    partitions = int(scaled["metadata"]["annotations"]["stream-dedup/input-partitions"])
    spec = scaled["spec"]
    assert 1 <= spec.get("minReplicaCount", 0) <= spec["maxReplicaCount"] <= partitions


def check_pod_monitor(docs: list[Doc]) -> None:
    jsonschema.validate(one(docs, "PodMonitor"), POD_MONITOR)


def check_redis_secret(docs: list[Doc]) -> None:
    """The Redis URL comes from a Secret, never a literal; the example Secret has the keys
    the pod reads and is not applied by the kustomization."""
    env = env_vars(containers(workload_of(docs))[0])
    example = load(K8S / "redis" / "redis-secret.example.yaml")[0]
    for name in ("STREAM_DEDUP_REDIS_URL", "STREAM_DEDUP_REDIS_PASSWORD"):
        ref = env[name]["valueFrom"]["secretKeyRef"]
        assert "value" not in env[name]
        assert ref["name"] == example["metadata"]["name"]
        assert ref["key"] in example["stringData"]
    assert env["STREAM_DEDUP_INDEX"]["value"] == "redis"
    assert example["metadata"]["name"] not in {d["metadata"]["name"] for d in docs
                                               if d["kind"] == "Secret"}


def check_lsm(docs: list[Doc]) -> None:
    """The index directory is on the claimed volume, below its mount (a volume's root holds
    lost+found, which is not an index), on a single replica."""
    workload = one(docs, "StatefulSet")
    (container,) = containers(workload)
    env = env_vars(container)
    assert env["STREAM_DEDUP_INDEX"]["value"] == "lsm"
    path = Path(env["STREAM_DEDUP_INDEX_PATH"]["value"])
    claims = {c["metadata"]["name"] for c in workload["spec"]["volumeClaimTemplates"]}
    mounts = [m for m in container["volumeMounts"] if m["name"] in claims]
    assert any(Path(m["mountPath"]) in path.parents for m in mounts)
    assert workload["spec"]["replicas"] == 1
    assert not [d for d in docs if d["kind"] in ("ScaledObject", "HorizontalPodAutoscaler")]


def check_dashboard(docs: list[Doc]) -> None:
    configmap = one(docs, "ConfigMap")
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert configmap["data"] == {DASHBOARD.name: DASHBOARD.read_text()}


CHECKS: dict[str, list[Check]] = {
    "redis": [check_core_schemas, check_env_is_settings, check_probes, check_resources,
              check_grace, check_image, check_selectors, check_scaled_object,
              check_pod_monitor, check_redis_secret, check_dashboard],
    "lsm": [check_core_schemas, check_env_is_settings, check_probes, check_resources,
            check_grace, check_image, check_selectors, check_pod_monitor, check_lsm,
            check_dashboard],
}


# --- the tests ----------------------------------------------------------------------------
def test_every_manifest_is_listed_or_an_example() -> None:
    for directory in [K8S, *[d for d in K8S.iterdir() if d.is_dir()]]:
        listed = {str(r) for r in kustomization(directory).get("resources", [])}
        for resource in listed:
            assert (directory / resource).exists(), f"{directory}: {resource} is missing"
        for path in directory.glob("*.yaml"):
            if path.name != "kustomization.yaml":
                assert path.name in listed or path.name.endswith(".example.yaml"), path


def test_deploy_k8s_renders_the_redis_fleet() -> None:
    assert render(K8S) == render(K8S / "redis")


@pytest.mark.parametrize("directory", [K8S, K8S / "lsm"], ids=["fleet", "lsm"])
def test_render_is_what_kustomize_renders(directory: Path) -> None:
    """The checks read `render`; kubectl's own kustomize (offline) must agree with it."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("no kubectl here: the manifests are read by render() alone")
    out = subprocess.run([kubectl, "kustomize", str(directory)], capture_output=True,
                         text=True, timeout=120, check=True).stdout

    def key(doc: Doc) -> tuple[str, str]:
        return doc["kind"], doc["metadata"]["name"]
    theirs = [d for d in yaml.safe_load_all(out) if d]
    assert sorted(render(directory), key=key) == sorted(theirs, key=key)


def test_every_file_validates_strictly() -> None:
    """Each object of each file, the examples too, against the schemas of its kind."""
    for path in sorted(K8S.rglob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        for doc in load(path):
            if doc["apiVersion"] in CORE:
                check_core_schemas([doc])
            elif doc["kind"] == "ScaledObject":
                jsonschema.validate(doc, SCALED_OBJECT)
            else:
                jsonschema.validate(doc, POD_MONITOR)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_kinds(variant: str) -> None:
    check_kinds(variant, render(K8S / variant))


@pytest.mark.parametrize("variant, check", [(v, c) for v, cs in CHECKS.items() for c in cs],
                         ids=lambda x: getattr(x, "__name__", x))
def test_manifests(variant: str, check: Check) -> None:
    check(render(K8S / variant))


# (the check meant to catch it, variant, what is broken, how)
MUTATIONS: list[tuple[Check, str, str, Callable[[list[Doc]], None]]] = [
    (check_core_schemas, "redis", "an unknown container field",
     edit("Deployment", lambda d: container(d).update(bogus=1))),
    (check_core_schemas, "lsm", "a claim without a size",
     edit("StatefulSet", lambda d: d["spec"]["volumeClaimTemplates"][0]["spec"].update(
         resources="100Gi"))),
    (check_env_is_settings, "redis", "an env name no setting has",
     edit("Deployment", add_env("STREAM_DEDUP_REDIS_ADDRESS", "x"))),
    (check_env_is_settings, "redis", "exactly-once off",
     edit("Deployment", set_env("STREAM_DEDUP_EXACTLY_ONCE", "false"))),
    (check_env_is_settings, "lsm", "the HTTP API on localhost only",
     edit("StatefulSet", set_env("STREAM_DEDUP_HTTP_HOST", "127.0.0.1"))),
    (check_probes, "redis", "readiness on a path the app lacks",
     edit("Deployment", lambda d: container(d)["readinessProbe"]["httpGet"].update(
         path="/ready"))),
    (check_probes, "lsm", "liveness on /readyz (a stalled batch would restart the pod)",
     edit("StatefulSet", lambda d: container(d)["livenessProbe"]["httpGet"].update(
         path="/readyz"))),
    (check_resources, "redis", "no memory limit",
     edit("Deployment", lambda d: container(d)["resources"]["limits"].pop("memory"))),
    (check_resources, "redis", "a memory limit below the sizing",
     edit("Deployment", lambda d: container(d)["resources"]["limits"].update(
         memory="256Mi"))),
    (check_grace, "redis", "a grace shorter than the shutdown deadline",
     edit("Deployment", lambda d: d["spec"]["template"]["spec"].update(
         terminationGracePeriodSeconds=15))),
    (check_image, "redis", "another image",
     edit("Deployment", lambda d: container(d).update(image="stream-dedup:latest"))),
    (check_selectors, "redis", "a PDB selecting nothing",
     edit("PodDisruptionBudget", lambda d: d["spec"]["selector"]["matchLabels"].update(
         app="other"))),
    (check_selectors, "redis", "a PodMonitor on a port the pod lacks",
     edit("PodMonitor", lambda d: d["spec"]["podMetricsEndpoints"][0].update(
         port="metrics"))),
    (check_scaled_object, "redis", "more replicas than partitions",
     edit("ScaledObject", lambda d: d["spec"].update(maxReplicaCount=13))),
    (check_scaled_object, "redis", "the trigger on another group",
     edit("ScaledObject", lambda d: d["spec"]["triggers"][0]["metadata"].update(
         consumerGroup="other"))),
    (check_scaled_object, "redis", "a lag threshold as a number",
     edit("ScaledObject", lambda d: d["spec"]["triggers"][0]["metadata"].update(
         lagThreshold=10000))),
    (check_pod_monitor, "redis", "a PodMonitor scraping another path",
     edit("PodMonitor", lambda d: d["spec"]["podMetricsEndpoints"][0].update(
         path="/stats"))),
    (check_redis_secret, "redis", "the Redis URL as a literal",
     edit("Deployment", set_env("STREAM_DEDUP_REDIS_URL", "redis://x:6379"))),
    (check_lsm, "lsm", "the index path at the volume's root",
     edit("StatefulSet", set_env("STREAM_DEDUP_INDEX_PATH", "/var/lib/stream-dedup"))),
    (check_lsm, "lsm", "two replicas",
     edit("StatefulSet", lambda d: d["spec"].update(replicas=2))),
    (check_dashboard, "redis", "a stale dashboard",
     edit("ConfigMap", lambda d: d["data"].update({DASHBOARD.name: "{}"}))),
]


def test_every_check_has_a_mutation() -> None:
    assert {c for cs in CHECKS.values() for c in cs} == {m[0] for m in MUTATIONS}


@pytest.mark.parametrize("check, variant, what, mutate", MUTATIONS,
                         ids=[m[2] for m in MUTATIONS])
def test_each_check_can_fail(check: Check, variant: str, what: str,
                             mutate: Callable[[list[Doc]], None]) -> None:
    """Each break is caught by the check meant for it, and by no other: the checks do
    not lean on each other."""
    docs = copy.deepcopy(render(K8S / variant))
    mutate(docs)
    failed = []
    for each in CHECKS[variant]:
        try:
            each(docs)
        except (AssertionError, KeyError, jsonschema.ValidationError,
                kubernetes_validate.ValidationError):
            failed.append(each.__name__)
    assert failed == [check.__name__], f"{what}: caught by {failed}"


def test_the_docs_link_it() -> None:
    doc = (REPO / "docs" / "kubernetes.md").read_text()
    for target in ("operating.md", "scale-out.md", "tests/test_churn.py", "does not autoscale"):
        assert target in doc
    for path in ("README.md", "deploy/README.md"):
        assert "kubernetes.md" in (REPO / path).read_text(), path
    blocks = "".join(re.findall(r"```sh\n(.*?)```", doc, re.S)).replace("\\\n", " ")
    commands = [line for line in blocks.splitlines() if line.startswith("kubectl ")]
    assert any("apply -k deploy/k8s" in c for c in commands)
    objects = {(d["kind"].lower(), d["metadata"]["name"])
               for variant in VARIANTS for d in render(K8S / variant)}
    for command in commands:
        shlex.split(command)  # each one quotes what it means to
        for kind, name in re.findall(r"\b(deployment|statefulset|scaledobject|service)/([\w-]+)",
                                     command):
            assert (kind, name) in objects, command


def test_the_dashboard_configmap_is_written_from_deploy_grafana() -> None:
    assert DASHBOARD_YAML.read_text() == dashboard_configmap(), \
        "run `python tests/test_k8s.py` to write it again"


if __name__ == "__main__":
    DASHBOARD_YAML.write_text(dashboard_configmap())
    print(f"wrote {DASHBOARD_YAML.relative_to(REPO)}")
