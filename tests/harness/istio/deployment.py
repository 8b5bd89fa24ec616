"""The gateway Deployment and what patches it: kubectl's strategic merge (run
offline), the objects Istio 1.30.3's kube-gateway template renders for
envoyfilter/gateway-api/gateway.yaml and the ConfigMap overlays istiod applies
to them, and the preStop hook drain-gate needs on the istio-proxy container."""
from __future__ import annotations

from pathlib import Path

import yaml

from tests.harness import k8s
from tests.harness.istio.files import GATEWAY_API, GATEWAY_API_FIXTURES, HEALTH_PORT, load_docs, load_one


def strategic_patch(obj: dict, patch: str, workdir: Path) -> dict:
    """`obj` after `kubectl patch --local --type strategic` with the YAML
    `patch`: the strategic merge (k8s.io/apimachinery strategicpatch, with the
    kind's patch keys) that istiod applies to what its template renders."""
    src, patch_file = workdir / "object.yaml", workdir / "patch.yaml"
    src.write_text(yaml.safe_dump(obj, sort_keys=False))
    patch_file.write_text(patch)
    return yaml.safe_load(k8s.run("kubectl", "patch", "--local", "--type", "strategic", "-f", str(src),
                                  "--patch-file", str(patch_file), "-o", "yaml").stdout)


# -- the gateway istiod deploys for envoyfilter/gateway-api/gateway.yaml ------------------
# The keys istiod accepts in a parametersRef ConfigMap (Istio 1.30
# deploymentcontroller.go, supportedOverlays), and the kind each one patches.
OVERLAY_KEYS = {"deployment": "Deployment", "service": "Service", "serviceAccount": "ServiceAccount",
                "horizontalPodAutoscaler": "HorizontalPodAutoscaler", "podDisruptionBudget": "PodDisruptionBudget"}


def gateway_api_rendered() -> dict[str, dict]:
    """kind -> the object Istio 1.30.3's template renders for the Gateway
    (tests/fixtures/gateway-api/rendered.yaml), before the ConfigMap's patches."""
    return {d["kind"]: d for d in load_docs(GATEWAY_API_FIXTURES / "rendered.yaml")}


def gateway_api_patched(options: str, kind: str, workdir: Path) -> dict:
    """That object after istiod applied its key of the ConfigMap
    envoyfilter/gateway-api/`options`."""
    key = next(k for k, v in OVERLAY_KEYS.items() if v == kind)
    patch = load_one(GATEWAY_API / options)["data"][key]
    return strategic_patch(gateway_api_rendered()[kind], patch, workdir)


def proxy_container(deployment: dict) -> dict:
    (proxy,) = [c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "istio-proxy"]
    return proxy


def assert_prestop_drains(pre: dict, distroless: bool) -> None:
    """The preStop hook of a drain-gate patch: curl POST /drain?wait=closed
    from loopback, or (distroless) httpGet /prestop with a bearer header."""
    if distroless:
        assert pre["httpGet"]["path"] == "/prestop" and pre["httpGet"]["port"] == HEALTH_PORT
        (header,) = pre["httpGet"]["httpHeaders"]
        assert header["name"] == "Authorization" and header["value"].startswith("Bearer ")
    else:
        cmd = pre["exec"]["command"]
        assert cmd[0] == "curl" and cmd[-1] == f"http://127.0.0.1:{HEALTH_PORT}/drain?wait=closed"
        assert cmd[cmd.index("-X") + 1] == "POST"
