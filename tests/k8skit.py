"""deploy/k8s read as `kubectl apply -k` would send it (a kustomization's resources, files
and directories, with its `images` applied: all that deploy/k8s uses of kustomize), the
fields of the two custom resources it uses (KEDA's ScaledObject, the Prometheus operator's
PodMonitor) as JSON schemas, and the Grafana dashboard's ConfigMap, written from
deploy/grafana by `python tests/k8skit.py`. Used by tests/test_k8s.py."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
K8S = REPO / "deploy" / "k8s"
DASHBOARD = REPO / "deploy" / "grafana" / "dashboards" / "stream-dedup.json"
DASHBOARD_YAML = K8S / "monitoring" / "grafana-dashboard.yaml"
Doc = dict[str, Any]


# --- reading the manifests as kustomize would ---------------------------------------------
def load(path: Path) -> list[Doc]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def kustomization(directory: Path) -> Doc:
    return dict(yaml.safe_load((directory / "kustomization.yaml").read_text()))


def render(directory: Path) -> list[Doc]:
    """The objects `kubectl apply -k directory` sends: its resources (files, and
    directories rendered the same way), with its `images` applied."""
    spec = kustomization(directory)
    docs: list[Doc] = []
    for resource in spec.get("resources", []):
        target = (directory / resource).resolve()
        docs += render(target) if target.is_dir() else load(target)
    for image in spec.get("images", []):
        for container in (c for doc in docs for c in containers(doc)):
            name, _, tag = container["image"].partition(":")
            if name == image["name"]:
                new, tag = image.get("newName", name), image.get("newTag", tag)
                container["image"] = f"{new}:{tag}" if tag else new
    return docs


def containers(doc: Doc) -> list[Doc]:
    pod = doc.get("spec", {}).get("template", {}).get("spec", {})
    return list(pod.get("containers", []))


def one(docs: list[Doc], kind: str) -> Doc:
    (doc,) = [d for d in docs if d["kind"] == kind]
    return doc


def workload_of(docs: list[Doc]) -> Doc:
    (doc,) = [d for d in docs if d["kind"] in ("Deployment", "StatefulSet")]
    return doc


def env_vars(container: Doc) -> dict[str, Doc]:
    return {e["name"]: e for e in container.get("env", [])}


# --- edits, to break a manifest on purpose (tests/test_k8s.py) ----------------------------
def edit(kind: str, change: Callable[[Doc], None]) -> Callable[[list[Doc]], None]:
    def apply(docs: list[Doc]) -> None:
        change(one(docs, kind))
    return apply


def add_env(name: str, value: str) -> Callable[[Doc], None]:
    def apply(doc: Doc) -> None:
        containers(doc)[0]["env"].append({"name": name, "value": value})
    return apply


def container(doc: Doc) -> Doc:
    return containers(doc)[0]


def set_env(name: str, value: str) -> Callable[[Doc], None]:
    def apply(doc: Doc) -> None:
        for e in container(doc)["env"]:
            if e["name"] == name:
                e.pop("valueFrom", None)
                e["value"] = value
    return apply


# --- the custom resources' fields ------------------------------------------------------
SCALED_OBJECT = {  # the fields of KEDA's ScaledObject CRD (keda.sh/v1alpha1) used here
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "keda.sh/v1alpha1"},
        "spec": {
            "type": "object",
            "required": ["scaleTargetRef", "triggers", "maxReplicaCount"],
            "additionalProperties": False,
            "properties": {
                "scaleTargetRef": {"type": "object", "required": ["name"],
                                   "additionalProperties": False,
                                   "properties": {k: {"type": "string"} for k in
                                                  ("apiVersion", "kind", "name",
                                                   "envSourceContainerName")}},
                **{k: {"type": "integer", "minimum": 0} for k in
                   ("pollingInterval", "cooldownPeriod", "initialCooldownPeriod",
                    "idleReplicaCount", "minReplicaCount", "maxReplicaCount")},
                "advanced": {"type": "object"},
                "fallback": {"type": "object"},
                "triggers": {"type": "array", "minItems": 1, "items": {
                    "type": "object", "required": ["type", "metadata"],
                    "properties": {"metadata": {"type": "object",
                                                "additionalProperties": {"type": "string"}}}}},
            },
        },
    },
}
KAFKA_TRIGGER = {"bootstrapServers", "consumerGroup", "topic", "lagThreshold"}  # needed
KAFKA_TRIGGER_OPTIONAL = {"activationLagThreshold", "offsetResetPolicy", "allowIdleConsumers",
                          "scaleToZeroOnInvalidOffset", "excludePersistentLag",
                          "limitToPartitionsWithLag", "partitionLimitation", "version",
                          "sasl", "tls"}
POD_MONITOR = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "spec": {"type": "object", "required": ["selector", "podMetricsEndpoints"],
                 "properties": {
                     "jobLabel": {"type": "string"},
                     "selector": {"type": "object", "required": ["matchLabels"]},
                     "podMetricsEndpoints": {"type": "array", "minItems": 1, "items": {
                         "type": "object", "required": ["port", "path"],
                         "properties": {"port": {"type": "string"},
                                        "path": {"const": "/metrics"},
                                        "interval": {"type": "string",
                                                     "pattern": r"^\d+[smh]$"}}}}}},
    },
}


def quantity(text: str | int) -> float:
    number, unit = re.fullmatch(r"([0-9.]+)([a-zA-Z]*)", str(text)).groups()
    scale = {"": 1, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "Ki": 2**10, "Mi": 2**20,
             "Gi": 2**30}
    return float(number) * scale[unit]


# --- the dashboard ConfigMap, written from deploy/grafana -------------------------------------
def dashboard_configmap() -> str:
    body = "".join(f"    {line}" if line.strip() else line
                   for line in DASHBOARD.read_text().splitlines(keepends=True))
    return (
        "# Written by `python tests/k8skit.py` from deploy/grafana/dashboards/"
        "stream-dedup.json; do not edit\n"
        "# (tests/test_k8s.py fails when the two differ). Grafana's dashboard sidecar "
        "loads it.\n"
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: stream-dedup-dashboard\n"
        "  labels:\n    app.kubernetes.io/name: stream-dedup\n"
        '    grafana_dashboard: "1"\n'
        f"data:\n  {DASHBOARD.name}: |\n{body}"
    )



if __name__ == "__main__":
    DASHBOARD_YAML.write_text(dashboard_configmap())
    print(f"wrote {DASHBOARD_YAML.relative_to(REPO)}")
