"""Connecting to the Kubernetes API with the official client: in a pod, its service account;
elsewhere, the kubeconfig (KUBECONFIG or ~/.kube/config)."""

from __future__ import annotations

import kubernetes
from kubernetes.client.exceptions import ApiException

USER_AGENT = "stalwart-operator/0.1"


def api_client() -> kubernetes.client.ApiClient:
    try:
        kubernetes.config.load_incluster_config()
    except kubernetes.config.ConfigException:
        kubernetes.config.load_kube_config()
    client = kubernetes.client.ApiClient()
    client.user_agent = USER_AGENT  # audit logs (and the tests' RBAC check) tell the operator's calls apart
    return client


def is_status(exc: BaseException, *codes: int) -> bool:
    """True for an ApiException with one of these HTTP codes (404 gone, 409 exists...)."""
    return isinstance(exc, ApiException) and exc.status in codes
