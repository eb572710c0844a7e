"""Checks examples/kubernetes.yaml: every document against the Kubernetes schemas
(kubernetes-validate, strict: unknown fields are errors), the references between them
(selectors, ports, probes, the router's service account and role), and the router's command
against vllm-router's own argument parser. Prints the thicket container's arguments as one
JSON line (`THICKET_ARGS [...]`) for the caller to parse with thicket's parser.

Usage: check_kubernetes.py FILE
"""

import argparse
import json
import shlex
import sys

import kubernetes_validate
import yaml

from vllm_router.router_args import RouterArgs


def fail(message):
    print(f"FAIL: {message}")
    sys.exit(1)


def by_kind(docs, kind):
    return [d for d in docs if d["kind"] == kind]


def named(docs, kind, name):
    found = [d for d in by_kind(docs, kind) if d["metadata"]["name"] == name]
    if len(found) != 1:
        fail(f"expected one {kind} named {name}, found {len(found)}")
    return found[0]


def container(deployment):
    containers = deployment["spec"]["template"]["spec"]["containers"]
    if len(containers) != 1:
        fail(f"{deployment['metadata']['name']}: expected one container")
    return containers[0]


def port_number(c, port):
    if isinstance(port, int):
        return port
    for p in c.get("ports", []):
        if p.get("name") == port:
            return p["containerPort"]
    fail(f"container {c['name']} has no port named {port}")


def check_deployment_selects_its_pods(d):
    selector = d["spec"]["selector"]["matchLabels"]
    labels = d["spec"]["template"]["metadata"]["labels"]
    if any(labels.get(k) != v for k, v in selector.items()):
        fail(f"{d['metadata']['name']}: selector {selector} does not match {labels}")


def check_service_reaches(service, deployment):
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    selector = service["spec"]["selector"]
    if any(labels.get(k) != v for k, v in selector.items()):
        fail(f"service {service['metadata']['name']} selects {selector}, pods have {labels}")
    c = container(deployment)
    for p in service["spec"]["ports"]:
        port_number(c, p.get("targetPort", p["port"]))


def main():
    path = sys.argv[1]
    with open(path) as f:
        docs = [d for d in yaml.safe_load_all(f) if d]
    version = kubernetes_validate.latest_version()
    for d in docs:
        try:
            kubernetes_validate.validate(d, version, strict=True)
        except kubernetes_validate.ValidationError as e:
            fail(f"{d['kind']} {d['metadata']['name']}: {e.message} at {list(e.path)}")
    print(f"{len(docs)} documents valid against Kubernetes {version}")

    workers = named(docs, "Deployment", "thicket")
    router = named(docs, "Deployment", "thicket-router")
    for d in (workers, router):
        check_deployment_selects_its_pods(d)
    check_service_reaches(named(docs, "Service", "thicket"), workers)
    check_service_reaches(named(docs, "Service", "thicket-router"), router)

    # Replicas are ready only when /health says so, and have time to drain.
    worker = container(workers)
    probe = worker["readinessProbe"]["httpGet"]
    if probe["path"] != "/health":
        fail(f"readiness probe on {probe['path']}, not /health")
    serve_port = port_number(worker, probe["port"])
    args = worker["command"][1:] + worker["args"]
    if worker["command"][0] != "thicket" or args[0] != "serve":
        fail(f"the worker does not run `thicket serve`: {worker['command']} {worker['args']}")
    if args[args.index("--port") + 1] != str(serve_port) or "0.0.0.0" not in args:
        fail(f"`thicket serve` must listen on 0.0.0.0:{serve_port}: {args}")
    grace = int(args[args.index("--shutdown-grace-secs") + 1])
    pod_grace = workers["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    if pod_grace <= grace:
        fail(f"terminationGracePeriodSeconds {pod_grace} leaves no room for a {grace}s drain")

    # The router may watch pods with its service account.
    account = router["spec"]["template"]["spec"]["serviceAccountName"]
    named(docs, "ServiceAccount", account)
    bindings = [
        b
        for b in by_kind(docs, "RoleBinding")
        if any(s["kind"] == "ServiceAccount" and s["name"] == account for s in b["subjects"])
    ]
    if not bindings:
        fail(f"no role binding for service account {account}")
    role = named(docs, "Role", bindings[0]["roleRef"]["name"])
    allowed = {
        verb
        for rule in role["rules"]
        if "pods" in rule["resources"] and "" in rule["apiGroups"]
        for verb in rule["verbs"]
    }
    if not {"get", "list", "watch"} <= allowed:
        fail(f"role {role['metadata']['name']} lets the router only {sorted(allowed)} pods")

    # The router's command parses with vllm-router's own parser and finds the workers.
    script = " ".join(container(router)["args"])
    command = script.split("exec ", 1)[1].replace('"$POD_NAMESPACE"', "default")
    words = shlex.split(command)
    if words[0] != "vllm-router":
        fail(f"the router container does not exec vllm-router: {words}")
    parser = argparse.ArgumentParser()
    RouterArgs.add_cli_args(parser)
    parsed = RouterArgs.from_cli_args(parser.parse_args(words[1:]))
    if not parsed.service_discovery:
        fail("the router does not discover the workers")
    selector = workers["spec"]["template"]["metadata"]["labels"]
    if any(selector.get(k) != v for k, v in parsed.selector.items()):
        fail(f"router selector {parsed.selector} does not match the workers' {selector}")
    if parsed.service_discovery_port != serve_port:
        fail(f"router sends to port {parsed.service_discovery_port}, workers serve {serve_port}")
    if parsed.health_check_endpoint != probe["path"]:
        fail(f"router checks {parsed.health_check_endpoint}, workers answer {probe['path']}")
    router_port = port_number(container(router), "http")
    if parsed.port != router_port:
        fail(f"router listens on {parsed.port}, its container exposes {router_port}")
    print(f"router: policy {parsed.policy}, selector {parsed.selector}")
    print("THICKET_ARGS " + json.dumps(args))
    print("kubernetes example checks passed")


if __name__ == "__main__":
    main()
