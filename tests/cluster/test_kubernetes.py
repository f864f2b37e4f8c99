"""deploy/kubernetes (docs/cluster.md#kubernetes): valid for Kubernetes,
and saying what forkbox reads."""
from __future__ import annotations

import glob
import os
import re
import subprocess
import sys

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
MANIFESTS = sorted(glob.glob(os.path.join(HERE, "..", "..", "deploy", "kubernetes", "*.yaml")))


def docs() -> list[dict]:
    out = []
    for path in MANIFESTS:
        with open(path) as f:
            out += [d for d in yaml.safe_load_all(f) if d]
    return out


def test_the_manifests_are_valid_kubernetes():
    assert len(MANIFESTS) >= 4, MANIFESTS
    r = subprocess.run([sys.executable, "-m", "kubernetes_validate", "--strict", *MANIFESTS], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr


def test_nodes_and_gateways_are_wired_as_forkbox_expects():
    by_kind = {(d["kind"], d["metadata"]["name"]): d for d in docs()}
    node = by_kind[("DaemonSet", "forkbox-node")]["spec"]["template"]["spec"]
    gateway = by_kind[("Deployment", "forkbox-gateway")]["spec"]["template"]["spec"]
    service = by_kind[("Service", "forkbox")]["spec"]
    config = by_kind[("ConfigMap", "forkbox-config")]["data"]
    (n,), (g,) = node["containers"], gateway["containers"]
    assert n["args"][0] == "serve" and g["args"][0] == "gateway"
    assert n["securityContext"]["privileged"] is True and node["hostPID"] is True
    assert any(a.startswith("--advertise=http://$(POD_IP):") for a in n["args"])
    assert all(any(a.startswith("--cluster-secret-file=") for a in c["args"]) for c in (n, g))
    # The settings forkbox reads (crates/forkbox/src/node.rs), every one.
    help_out = subprocess.run([os.environ.get("FORKBOX_BIN", "forkbox"), "serve", "--help"], capture_output=True, text=True).stdout
    for var in config:
        assert var.startswith("AWS_") or f"env: {var}" in help_out, f"{var} is not a setting of forkbox serve"
    assert "FORKBOX_CLUSTER_DENY" in config, "sandboxes must be kept off the pod and service networks"
    # The Service reaches the gateways, on their port.
    labels = by_kind[("Deployment", "forkbox-gateway")]["spec"]["template"]["metadata"]["labels"]
    assert service["selector"].items() <= labels.items()
    assert service["ports"][0]["targetPort"] == g["ports"][0]["name"]
    # The gateway runs with nothing: not root, no capabilities.
    sc = g["securityContext"]
    assert sc["runAsNonRoot"] and sc["capabilities"]["drop"] == ["ALL"] and not sc["allowPrivilegeEscalation"]
    assert re.fullmatch(r"0?4[04]0", oct(gateway["volumes"][0]["secret"]["items"][0]["mode"])[2:])
