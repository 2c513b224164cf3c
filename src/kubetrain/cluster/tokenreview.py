"""Which Pod a projected ServiceAccount token belongs to, as the API server says.

A Job's Pods report to kubetrain with the token the kubelet projects into them
for kubetrain's audience (domain/manifest.py). It is a JWT signed by the API
server's service-account key, bound to the Pod: its claims name the Pod and its
uid, and it stops being valid when the Pod is deleted, whatever its expiry.
kubetrain does not read the JWT itself: it asks the API server with a
TokenReview (authentication.k8s.io/v1) for its audience, the way Vault's
Kubernetes auth method does, and the answer's user names the ServiceAccount
(`system:serviceaccount:<namespace>:<name>`) and, in its extra, the Pod
(`authentication.kubernetes.io/pod-name`, `.../pod-uid`).

Every call raises ClusterError (cluster/errors.py), never the client library's own.
"""

from __future__ import annotations

from dataclasses import dataclass

from lightkube import AsyncClient
from lightkube.models.authentication_v1 import TokenReviewSpec
from lightkube.resources.authentication_v1 import TokenReview

from kubetrain.cluster.client import ClusterConfig, typed_client
from kubetrain.cluster.errors import kube_errors

SERVICE_ACCOUNT_PREFIX = "system:serviceaccount:"
POD_NAME_KEY = "authentication.kubernetes.io/pod-name"
POD_UID_KEY = "authentication.kubernetes.io/pod-uid"


@dataclass(frozen=True, slots=True)
class PodIdentity:
    """The Pod a token was issued to, and its ServiceAccount."""

    namespace: str
    service_account: str
    pod_name: str
    pod_uid: str


class TokenReviewer:
    """Reviews tokens for `audience`; made from the kubeconfig (or in-cluster
    ServiceAccount) of the serving process, whose role may create TokenReviews.

    The client is made on first use, on the event loop that serves the requests.
    """

    def __init__(self, config: ClusterConfig, audience: str) -> None:
        self._config = config
        self.audience = audience
        self._client: AsyncClient | None = None

    async def review(self, token: str) -> PodIdentity | None:
        """The Pod the token is bound to; None when the API server does not take it
        for our audience (unsigned, expired, its Pod gone, another audience) or it is
        not bound to a Pod. ClusterError when the API server cannot answer."""
        if self._client is None:
            self._client = typed_client(self._config)
        client = self._client
        review = TokenReview(spec=TokenReviewSpec(token=token, audiences=[self.audience]))
        with kube_errors():
            answer = await client.create(review)
        return identity_of(answer, self.audience)


def identity_of(review: TokenReview, audience: str) -> PodIdentity | None:
    """The Pod a reviewed token is bound to, or None. An authenticator that ignores
    `spec.audiences` answers without `status.audiences`: not taken as ours."""
    status = review.status
    if status is None or not status.authenticated or status.user is None:
        return None
    if audience not in (status.audiences or []):
        return None
    username = status.user.username or ""
    if not username.startswith(SERVICE_ACCOUNT_PREFIX):
        return None
    namespace, _, account = username.removeprefix(SERVICE_ACCOUNT_PREFIX).partition(":")
    extra = status.user.extra or {}
    names, uids = extra.get(POD_NAME_KEY) or [], extra.get(POD_UID_KEY) or []
    if not namespace or not account or len(names) != 1 or len(uids) != 1:
        return None
    return PodIdentity(namespace, account, names[0], uids[0])
