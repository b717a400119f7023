"""The Helm chart helm/shoal: Helm's own lint and rendering (helm-python-sdk, no helm binary)
with default values and representative overrides; every rendered manifest is validated against
the Kubernetes API schemas of KUBE_VERSION (kubernetes-validate, strict: unknown fields fail).
"""
from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
import yaml

helm = pytest.importorskip("helm_python", reason="helm-python-sdk is not installed")
kv = pytest.importorskip("kubernetes_validate", reason="kubernetes-validate is not installed")

CHART = Path(__file__).resolve().parents[2] / "helm" / "shoal"
KUBE_VERSION = "1.30.0"
RELEASE, NAMESPACE = "prod", "brokers"
FULL = f"{RELEASE}-shoal"
#: Custom resources have no schema in kubernetes-validate: their required shape is checked here.
CRD_REQUIRED = {"ServiceMonitor": ("spec.selector.matchLabels", "spec.endpoints")}

OVERRIDES = {
    "defaults": {},
    "three-nodes": {"nodes": {"replicaCount": 3}},
    "loadbalancer": {"service": {"type": "LoadBalancer", "annotations": {
        "service.beta.kubernetes.io/aws-load-balancer-type": "nlb"},
        "loadBalancerSourceRanges": ["10.0.0.0/8"], "externalTrafficPolicy": "Local",
        "nodePorts": {"amqp": 30672}}},
    "no-persistence": {"persistence": {"enabled": False}},
    "service-monitor": {"metrics": {"serviceMonitor": {"enabled": True,
                                                       "labels": {"release": "prom"}},
                                    "grafanaDashboard": {"enabled": True}}},
    "no-management": {"management": {"enabled": False}},
    "resources-hard-affinity": {
        "nodes": {"resources": {"requests": {"cpu": "1", "memory": "1Gi"},
                                "limits": {"memory": "2Gi"}},
                  "podAntiAffinityPreset": "hard"},
        "routers": {"resources": {"requests": {"cpu": "500m", "memory": "256Mi"}},
                    "replicaCount": 3}},
    "link-curve": {"linkCurve": {"enabled": True, "existingSecret": "shoal-link-keys"}},
    "tls": {"tls": {"enabled": True, "existingSecret": "shoal-tls", "verify": "verify_peer",
                    "versions": ["tlsv1.3"]},
            "service": {"type": "NodePort", "nodePorts": {"amqps": 30671}}},
    "existing-secret-netpol": {"auth": {"existingSecret": "my-users"},
                               "networkPolicy": {"enabled": True},
                               "persistence": {"storageClass": "fast-ssd", "size": "50Gi"}},
}


def render(values: dict) -> dict[tuple[str, str], dict]:
    """Render the chart; returns {(kind, name): manifest} of every non-empty document."""
    with helm.Chart.load(CHART) as chart:
        files = chart.render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)
    docs = {}
    for path, text in files.items():
        if path.endswith("NOTES.txt"):
            continue
        for doc in yaml.safe_load_all(text):
            if doc:
                key = (doc["kind"], doc["metadata"]["name"])
                assert key not in docs, f"{key} rendered twice"
                docs[key] = doc
    return docs


def notes(values: dict) -> str:
    with helm.Chart.load(CHART) as chart:
        files = chart.render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)
    return next(text for path, text in files.items() if path.endswith("NOTES.txt"))


def container(docs: dict, kind: str, name: str) -> dict:
    return docs[(kind, name)]["spec"]["template"]["spec"]["containers"][0]


def dig(doc: dict, dotted: str):
    for part in dotted.split("."):
        doc = doc[part]
    return doc


@pytest.mark.parametrize("case", OVERRIDES)
def test_lint_is_clean(case: str) -> None:
    report = helm.lint(str(CHART), OVERRIDES[case], strict=True, namespace=NAMESPACE,
                       kube_version=f"v{KUBE_VERSION}")
    problems = [m for m in report["messages"] if m["severity"] >= 2]
    assert not report["errors"] and not problems, (report["errors"], problems)


@pytest.mark.parametrize("case", OVERRIDES)
def test_every_manifest_matches_the_kubernetes_schema(case: str) -> None:
    docs = render(OVERRIDES[case])
    assert docs
    for (kind, name), doc in docs.items():
        if kind in CRD_REQUIRED:
            for field in CRD_REQUIRED[kind]:
                assert dig(doc, field), f"{kind}/{name} lacks {field}"
            continue
        try:
            kv.validate(doc, KUBE_VERSION, strict=True)
        except kv.utils.ValidationError as exc:
            pytest.fail(f"{kind}/{name} ({case}): {exc.message} at "
                        f"{'.'.join(map(str, exc.absolute_path))}")


def test_defaults_have_every_part_of_the_chart() -> None:
    docs = render({})
    kinds = {kind for kind, _ in docs}
    assert {"StatefulSet", "Deployment", "Service", "ConfigMap", "Secret",
            "PodDisruptionBudget", "ServiceAccount"} <= kinds
    assert "ServiceMonitor" not in kinds and "NetworkPolicy" not in kinds
    sts = docs[("StatefulSet", f"{FULL}-node")]
    assert sts["spec"]["serviceName"] == f"{FULL}-node-headless"
    assert docs[("Service", f"{FULL}-node-headless")]["spec"]["clusterIP"] == "None"
    claim = sts["spec"]["volumeClaimTemplates"][0]
    assert claim["spec"]["resources"]["requests"]["storage"] == "8Gi"
    node = container(docs, "StatefulSet", f"{FULL}-node")
    assert {"mountPath": "/var/lib/shoal", "name": "data"} in node["volumeMounts"]
    assert node["readinessProbe"]["tcpSocket"]["port"] == "zmq"
    assert node["livenessProbe"]["tcpSocket"]["port"] == "zmq"
    pod_name = next(e for e in node["env"] if e["name"] == "POD_NAME")
    assert pod_name["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    router = container(docs, "Deployment", f"{FULL}-router")
    # ready = can serve (reaches some node; issue 36), asked of the management port
    assert router["readinessProbe"]["httpGet"] == {
        "path": "/api/health/checks/ready-to-serve-clients", "port": "management"}
    assert router["livenessProbe"]["tcpSocket"]["port"] == "amqp"
    assert "initContainers" not in docs[("Deployment", f"{FULL}-router")]["spec"]["template"][
        "spec"]                                # routers never wait for the nodes
    assert sts["spec"]["podManagementPolicy"] == "Parallel"   # nor nodes for each other
    no_mgmt = container(render({"management": {"enabled": False}}), "Deployment",
                        f"{FULL}-router")
    assert no_mgmt["readinessProbe"]["tcpSocket"]["port"] == "amqp"
    svc = docs[("Service", FULL)]
    assert svc["spec"]["type"] == "ClusterIP"
    assert svc["spec"]["ports"][0]["port"] == 5672
    assert svc["spec"]["selector"]["app.kubernetes.io/component"] == "router"
    config = yaml.safe_load(docs[("ConfigMap", FULL)]["data"]["shoal.yaml"])
    assert config["log_level"] == "info" and config["vhosts"] == ["/"]
    pdb = docs[("PodDisruptionBudget", f"{FULL}-node")]
    assert pdb["spec"]["maxUnavailable"] == 1
    soft = sts["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
    assert "preferredDuringSchedulingIgnoredDuringExecution" in soft


@pytest.mark.parametrize("replicas", [1, 3])
def test_routers_know_every_node_by_its_stable_dns_name(replicas: int) -> None:
    docs = render({"nodes": {"replicaCount": replicas}})
    assert docs[("StatefulSet", f"{FULL}-node")]["spec"]["replicas"] == replicas
    args = container(docs, "Deployment", f"{FULL}-router")["args"]
    nodes = [args[i + 1] for i, a in enumerate(args) if a == "--node"]
    assert nodes == [f"node-{i}=tcp://{FULL}-node-{i}.{FULL}-node-headless.{NAMESPACE}"
                     f".svc.cluster.local:5680" for i in range(replicas)]
    assert args[args.index("--host") + 1] == "0.0.0.0"


@pytest.mark.parametrize("replicas", [1, 3])
def test_nodes_link_to_every_node_for_quorum_queues(replicas: int) -> None:
    """Each node gets every node as a --peer (it skips its own id), by the same stable DNS
    names as the routers, and the network policy lets nodes reach each other's link port."""
    docs = render({"nodes": {"replicaCount": replicas}, "networkPolicy": {"enabled": True}})
    args = container(docs, "StatefulSet", f"{FULL}-node")["args"]
    peers = [args[i + 1] for i, a in enumerate(args) if a == "--peer"]
    assert peers == [f"node-{i}=tcp://{FULL}-node-{i}.{FULL}-node-headless.{NAMESPACE}"
                     f".svc.cluster.local:5680" for i in range(replicas)]
    policy = next(d for (kind, _), d in docs.items() if kind == "NetworkPolicy")
    sources = [f["podSelector"]["matchLabels"]["app.kubernetes.io/component"]
               for rule in policy["spec"]["ingress"] for f in rule["from"]]
    assert sorted(sources) == ["node", "router"]


def test_pods_get_no_service_link_variables() -> None:
    """A release named "shoal" has a Service "shoal", for which Kubernetes would inject
    SHOAL_PORT=tcp://IP:5672 into every pod: a value Shoal's settings would read as its port.
    The pods turn service links off (issue 34)."""
    docs = render({})
    for kind, name in (("Deployment", f"{FULL}-router"), ("StatefulSet", f"{FULL}-node")):
        assert docs[(kind, name)]["spec"]["template"]["spec"]["enableServiceLinks"] is False


def test_users_secret_feeds_the_routers() -> None:
    docs = render({"auth": {"username": "app", "password": "s3cret:x",
                            "extraUsers": {"ops": "pw2"}}})
    data = {k: base64.b64decode(v).decode() for k, v in docs[("Secret", FULL)]["data"].items()}
    assert data["username"] == "app" and data["password"] == "s3cret:x"
    assert data["users"] == "app:s3cret:x,ops:pw2"
    env = container(docs, "Deployment", f"{FULL}-router")["env"]
    ref = next(e for e in env if e["name"] == "SHOAL_USERS")["valueFrom"]["secretKeyRef"]
    assert ref == {"name": FULL, "key": "users"}


def test_tls_mounts_the_secret_and_opens_amqps() -> None:
    docs = render(OVERRIDES["tls"])
    router = container(docs, "Deployment", f"{FULL}-router")
    env = {e["name"]: e.get("value") for e in router["env"]}
    assert env["SHOAL_TLS_PORT"] == "5671"
    assert (env["SHOAL_TLS_CERTFILE"], env["SHOAL_TLS_KEYFILE"], env["SHOAL_TLS_CACERTFILE"]) \
        == ("/etc/shoal/tls/tls.crt", "/etc/shoal/tls/tls.key", "/etc/shoal/tls/ca.crt")
    assert env["SHOAL_TLS_VERIFY"] == "verify_peer" and env["SHOAL_TLS_VERSIONS"] == "tlsv1.3"
    assert {"name": "amqps", "containerPort": 5671, "protocol": "TCP"} in router["ports"]
    assert {"name": "tls", "mountPath": "/etc/shoal/tls", "readOnly": True} in \
        router["volumeMounts"]
    volumes = docs[("Deployment", f"{FULL}-router")]["spec"]["template"]["spec"]["volumes"]
    assert {"name": "tls", "secret": {"secretName": "shoal-tls"}} in volumes
    ports = docs[("Service", FULL)]["spec"]["ports"]
    assert {"name": "amqps", "port": 5671, "targetPort": "amqps", "protocol": "TCP",
            "nodePort": 30671} in ports
    plain = render({})
    assert "amqps" not in str(plain[("Service", FULL)]["spec"]["ports"])


def test_link_curve_keys_come_from_the_secret() -> None:
    docs = render(OVERRIDES["link-curve"])

    def refs(c):
        return {e["name"]: e["valueFrom"]["secretKeyRef"]["key"] for e in c["env"]
                if e["name"].startswith("SHOAL_LINK_CURVE")
                and e["valueFrom"]["secretKeyRef"]["name"] == "shoal-link-keys"}
    assert refs(container(docs, "StatefulSet", f"{FULL}-node")) == {
        "SHOAL_LINK_CURVE_PUBLIC_KEY": "node-public", "SHOAL_LINK_CURVE_SECRET_KEY": "node-secret",
        "SHOAL_LINK_CURVE_CLIENTS": "router-public"}
    assert refs(container(docs, "Deployment", f"{FULL}-router")) == {
        "SHOAL_LINK_CURVE_PUBLIC_KEY": "router-public",
        "SHOAL_LINK_CURVE_SECRET_KEY": "router-secret",
        "SHOAL_LINK_CURVE_SERVER_KEY": "node-public"}
    with pytest.raises(Exception, match="linkCurve.enabled needs linkCurve.existingSecret"):
        render({"linkCurve": {"enabled": True}})


def test_tls_without_a_secret_is_refused() -> None:
    with pytest.raises(Exception, match="tls.enabled needs tls.existingSecret"):
        render({"tls": {"enabled": True}})


def test_generated_password_when_none_given() -> None:
    data = render({})[("Secret", FULL)]["data"]
    password = base64.b64decode(data["password"]).decode()
    assert len(password) == 24
    assert base64.b64decode(data["users"]).decode() == f"shoal:{password}"


def test_overrides_reach_the_manifests() -> None:
    lb = render(OVERRIDES["loadbalancer"])[("Service", FULL)]
    assert lb["spec"]["type"] == "LoadBalancer"
    assert lb["metadata"]["annotations"] == {
        "service.beta.kubernetes.io/aws-load-balancer-type": "nlb"}
    assert lb["spec"]["ports"][0]["nodePort"] == 30672
    assert lb["spec"]["externalTrafficPolicy"] == "Local"
    assert "status.loadBalancer.ingress" in notes(OVERRIDES["loadbalancer"])

    docs = render(OVERRIDES["no-persistence"])
    sts = docs[("StatefulSet", f"{FULL}-node")]
    assert "volumeClaimTemplates" not in sts["spec"]
    assert {"name": "data", "emptyDir": {}} in sts["spec"]["template"]["spec"]["volumes"]
    assert "persistence is disabled" in notes(OVERRIDES["no-persistence"])

    docs = render(OVERRIDES["service-monitor"])
    sm = docs[("ServiceMonitor", FULL)]
    assert sm["metadata"]["labels"]["release"] == "prom"
    assert sm["spec"]["endpoints"][0]["port"] == "metrics"
    assert any(p["name"] == "metrics" for p in docs[("Service", FULL)]["spec"]["ports"])

    docs = render(OVERRIDES["resources-hard-affinity"])
    node = container(docs, "StatefulSet", f"{FULL}-node")
    assert node["resources"]["limits"]["memory"] == "2Gi"
    assert container(docs, "Deployment", f"{FULL}-router")["resources"]["requests"]["cpu"] \
        == "500m"
    assert docs[("Deployment", f"{FULL}-router")]["spec"]["replicas"] == 3
    hard = docs[("StatefulSet", f"{FULL}-node")]["spec"]["template"]["spec"]["affinity"]
    assert "requiredDuringSchedulingIgnoredDuringExecution" in hard["podAntiAffinity"]

    docs = render(OVERRIDES["existing-secret-netpol"])
    assert ("Secret", FULL) not in docs
    env = container(docs, "Deployment", f"{FULL}-router")["env"]
    users = next(e for e in env if e["name"] == "SHOAL_USERS")
    assert users["valueFrom"]["secretKeyRef"]["name"] == "my-users"
    claim = docs[("StatefulSet", f"{FULL}-node")]["spec"]["volumeClaimTemplates"][0]["spec"]
    assert claim["storageClassName"] == "fast-ssd"
    assert claim["resources"]["requests"]["storage"] == "50Gi"
    assert ("NetworkPolicy", f"{FULL}-node") in docs


def test_config_change_rolls_the_pods() -> None:
    def checksum(values: dict) -> str:
        sts = render(values)[("StatefulSet", f"{FULL}-node")]
        return sts["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
    assert checksum({}) != checksum({"config": {"log_level": "debug"}})


@pytest.mark.parametrize("bad", [
    {"nodes": {"replicaCount": 0}},
    {"service": {"type": "ExternalName"}},
    {"config": {"port": 5673}},                 # set by the chart itself
    {"auth": {"password": "a,b"}},              # SHOAL_USERS separates users with commas
    {"persistence": {"size": "lots"}},
    {"nodes": {"podAntiAffinityPreset": "medium"}},
    {"config": {"log_level": "verbose"}},
], ids=lambda v: repr(v))
def test_schema_refuses_bad_values(bad: dict) -> None:
    with helm.Chart.load(CHART) as chart, pytest.raises(helm.HelmValuesError):
        chart.validate_schema(bad)
    report = helm.lint(str(CHART), bad, namespace=NAMESPACE)
    assert report["errors"] or any(m["severity"] == 3 for m in report["messages"])


def test_service_monitor_scrapes_the_port_the_routers_serve_metrics_on() -> None:
    """Issue 23, point 3: the ServiceMonitor's endpoint is the router Service's ``metrics``
    port, which targets the container port the router is told to serve /metrics on."""
    docs = render(OVERRIDES["service-monitor"])
    mon = docs[("ServiceMonitor", FULL)]
    assert [(e["port"], e["path"]) for e in mon["spec"]["endpoints"]] == [("metrics", "/metrics")]
    svc_port = next(p for p in docs[("Service", FULL)]["spec"]["ports"] if p["name"] == "metrics")
    router = container(docs, "Deployment", f"{FULL}-router")
    ports = {p["name"]: p["containerPort"] for p in router["ports"]}
    env = {e["name"]: e.get("value") for e in router["env"]}
    assert svc_port["targetPort"] == "metrics"
    assert ports["metrics"] == svc_port["port"] == int(env["SHOAL_PROMETHEUS_PORT"]) == 15692
    assert ports["management"] == int(env["SHOAL_MANAGEMENT_PORT"]) == 15672
    board = docs[("ConfigMap", f"{FULL}-dashboard")]
    assert board["metadata"]["labels"]["grafana_dashboard"] == "1"
    dashboard = json.loads(board["data"]["shoal-overview.json"])
    assert dashboard["uid"] == "shoal-overview" and dashboard["panels"]


def test_metrics_and_management_off_means_no_listener() -> None:
    router = container(render(OVERRIDES["no-management"]), "Deployment", f"{FULL}-router")
    env = {e["name"]: e.get("value") for e in router["env"]}
    assert env["SHOAL_PROMETHEUS_PORT"] == "0" and env["SHOAL_MANAGEMENT_PORT"] == "0"
    assert {p["name"] for p in router["ports"]} == {"amqp"}
