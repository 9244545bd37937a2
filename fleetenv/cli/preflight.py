"""Checks ``fleetenv run`` makes before it provisions anything (docs/cli.md, "Checks
before anything is provisioned").

Why: a wrong ``--base-url`` or a revoked key otherwise shows up only inside the episodes,
after an instance was provisioned for each of them and the model request retried, as the
same error in every result. One cheap request each, up front, turns that into one clear
line and exit status 1 before anything costs money.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

from fleetenv.core.errors import ConfigurationError

if TYPE_CHECKING:  # pragma: no cover
    from fleetenv.fleet.session import Session

#: Seconds the Fleet key check may take in all (connect, TLS, one list request).
FLEET_CHECK_TIMEOUT_S = 15.0
#: Seconds the model check waits for its one-token answer.
MODEL_CHECK_TIMEOUT_S = 30.0


def check_model(policy: Any) -> None:
    """Run the policy's own ``preflight()`` if it has one (the OpenAI-compatible policy
    does; a reference or imported policy has no endpoint to check)."""
    preflight = getattr(policy, "preflight", None)
    if callable(preflight):
        preflight(timeout_s=MODEL_CHECK_TIMEOUT_S)


def check_fleet_key(session: Session) -> None:
    """One authenticated request to the Fleet control plane; nothing on the local Fleet.

    Raises :class:`ConfigurationError` saying what Fleet answered (a rejected key, an
    unreachable ``FLEET_BASE_URL``) and what to check.
    """
    if session.is_local:
        return
    from fleetenv.fleet.classify import provisioning_error
    from fleetenv.fleet.deadlines import deadline_scope

    # A tag no instance carries: the answer is an empty list, the check is the status.
    probe_tag = f"fleetenv-preflight-{uuid.uuid4().hex[:12]}"
    try:
        with deadline_scope(FLEET_CHECK_TIMEOUT_S, what="checking the Fleet API key",
                            fleet=session.base_url):
            session.client.sdk.instances(status="running", run_id=probe_tag)
    except Exception as exc:
        error = provisioning_error(exc, fleet=session.base_url)
        raise ConfigurationError(
            f"the Fleet check failed before anything was provisioned: {error.message}",
            hint="check FLEET_API_KEY and FLEET_BASE_URL (unset both to run on the "
                 "embedded local Fleet)",
            fleet=session.base_url) from None
